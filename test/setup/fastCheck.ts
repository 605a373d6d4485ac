/**
 * Every property test draws from the run's one seed (test/setup/propSeed.ts): fast-check's
 * global settings, which every fc.assert in every file inherits. A failure prints the seed and
 * the counterexample; NATGW_PROP_SEED=<seed> replays it.
 */
import fc from 'fast-check';
import { inject } from 'vitest';

fc.configureGlobal({ seed: inject('propSeed') });
