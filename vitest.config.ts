import { configDefaults, defineConfig } from 'vitest/config';
import { resolvePropSeed } from './test/setup/propSeed.js';

export default defineConfig({
  test: {
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // One seed for every property test (test/setup/propSeed.ts, test/setup/fastCheck.ts).
    provide: { propSeed: resolvePropSeed() },
    setupFiles: ['test/setup/fastCheck.ts'],
    // Compiled output is not a test source.
    exclude: [...configDefaults.exclude, 'dist/**'],
  },
});
