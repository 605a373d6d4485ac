import { configDefaults, defineConfig } from 'vitest/config';
import { resolvePropSeed } from './test/setup/propSeed.js';

/**
 * Real-kernel files that measure time or load the machine: they run one at a time, after
 * everything else, so that neither disturbs the other (timed kills inside a measured change,
 * flows that must survive a failover within seconds, shaped against unshaped throughput,
 * hundreds of concurrent clients).
 */
const SERIAL = [
  'test/netns/crash.test.ts',
  'test/netns/load.test.ts',
  'test/netns/daemon-concurrency.test.ts',
  'test/netns/ha-failover.test.ts',
  // Three replicas, BIRD and 400 flows: under other files' load a SYN or a BGP route comes late.
  'test/netns/ha-active-active.test.ts',
  'test/netns/ha-supervision.test.ts',
  'test/netns/qos-commands.test.ts',
  'test/netns/restart-hygiene.test.ts',
];

/**
 * Files at once in the first group. Real-kernel files mostly wait (on tools, the kernel, the
 * daemons they start), so a 2-core machine keeps four busy; namespaces, state directories and
 * ports are per topology (test/helpers/netns.ts), so files never share kernel state.
 */
const PARALLEL = Number(process.env.NATGW_TEST_WORKERS ?? 4);

/** More property runs than CI's ~100 (npm run test:long) take proportionally longer. */
const PROP_SCALE = Math.max(1, Number(process.env.NATGW_PROP_RUNS ?? 100) / 100);

export default defineConfig({
  test: {
    // A real-kernel step can take a while on a loaded machine; slow files set their own limits.
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // One seed for every property test (test/setup/propSeed.ts, test/setup/fastCheck.ts).
    provide: { propSeed: resolvePropSeed() },
    setupFiles: ['test/setup/fastCheck.ts'],
    // Vitest's report, then the slowest files and the closing `N passed, N failed`.
    reporters: ['default', './test/setup/slowestReporter.ts'],
    projects: [
      {
        extends: true,
        test: {
          name: 'unit',
          include: ['test/unit/**/*.test.ts', 'test/api/**/*.test.ts'],
          testTimeout: 30_000 * PROP_SCALE,
          maxWorkers: PARALLEL,
          sequence: { groupOrder: 0 },
        },
      },
      {
        extends: true,
        test: {
          name: 'kernel',
          include: ['test/netns/**/*.test.ts'],
          exclude: [...configDefaults.exclude, ...SERIAL],
          maxWorkers: PARALLEL,
          sequence: { groupOrder: 0 },
        },
      },
      {
        extends: true,
        test: {
          name: 'kernel-serial',
          include: SERIAL,
          fileParallelism: false,
          sequence: { groupOrder: 1 },
        },
      },
    ],
    // Compiled output is not a test source.
    exclude: [...configDefaults.exclude, 'dist/**'],
  },
});
