import { configDefaults, defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    // Namespace tests bring real kernel state up and down; unique names per topology make
    // parallel files safe, but each step can take a while on a loaded machine.
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // One seed for every property test (test/setup/fastCheck.ts).
    setupFiles: ['test/setup/fastCheck.ts'],
    // Compiled output is not a test source.
    exclude: [...configDefaults.exclude, 'dist/**'],
  },
});
