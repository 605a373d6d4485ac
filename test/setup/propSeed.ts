/**
 * The property tests' seed, chosen once per run (vitest.config.ts provides it) and handed to
 * every test file (test/setup/fastCheck.ts), so one number replays the whole run:
 * - unset: a fixed seed, so CI is reproducible;
 * - NATGW_PROP_SEED=<integer>: that seed (replay a run);
 * - NATGW_PROP_SEED=random: a fresh seed, printed at the start of the run for replay.
 */
import { randomInt } from 'node:crypto';

export const DEFAULT_PROP_SEED = 20261130;

declare module 'vitest' {
  export interface ProvidedContext {
    propSeed: number;
  }
}

/** The seed NATGW_PROP_SEED asks for; anything but an integer or "random" is refused. */
export function propSeedFrom(given: string | undefined, draw: () => number = () => randomInt(2 ** 31 - 1)): number {
  if (given === undefined || given === '') return DEFAULT_PROP_SEED;
  if (given === 'random') return draw();
  const seed = Number(given);
  if (!/^-?\d+$/.test(given.trim()) || !Number.isSafeInteger(seed)) {
    throw new Error(`NATGW_PROP_SEED must be an integer or "random", got ${JSON.stringify(given)}`);
  }
  return seed;
}

/**
 * The run's seed, printed once. A "random" draw is written back to the environment, so that a
 * later reading of the configuration in the same run (one per project) sees the same seed.
 */
export function resolvePropSeed(env: NodeJS.ProcessEnv = process.env): number {
  const drawn = env.NATGW_PROP_SEED === 'random';
  const seed = propSeedFrom(env.NATGW_PROP_SEED);
  if (drawn) env.NATGW_PROP_SEED = String(seed);
  // Vitest reads the configuration once more per project: say it once.
  if (env.NATGW_PROP_SEED_SHOWN === String(seed)) return seed;
  env.NATGW_PROP_SEED_SHOWN = String(seed);
  process.stdout.write(`property tests: seed ${seed}${drawn ? ' (drawn at random)' : ''}; NATGW_PROP_SEED=${seed} replays them\n`);
  return seed;
}
