/**
 * Property tests draw from one seed so that a CI run is reproducible: NATGW_PROP_SEED=<number>
 * replays a run, NATGW_PROP_SEED=random explores new inputs (fast-check prints the seed and the
 * counterexample of any failure, which then replays with the same variable).
 */
import fc from 'fast-check';

const given = process.env.NATGW_PROP_SEED ?? '20261130';
if (given !== 'random') {
  const seed = Number(given);
  if (!Number.isInteger(seed)) throw new Error(`NATGW_PROP_SEED must be an integer or "random", got ${given}`);
  fc.configureGlobal({ seed });
}
