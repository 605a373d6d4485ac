/**
 * The entry of the daemon's bundle (scripts/bundle.mjs → dist/natgw/daemon/serve.cjs).
 * `natgw serve` runs `main` (bin/daemonLoader.js). The build runs `warm` once, then writes the
 * bundle's V8 code cache: V8 puts in it the bytecode of every function compiled so far, and a
 * cache made from the compile alone holds little more than the bundle's outer scope (every
 * module's body is a function esbuild defers), so each start compiled every module it ran
 * from source (~20 ms before `/healthz` on the 2-core bench machine).
 *
 * `warm` only initialises modules: nothing listens, spawns, reads the state or writes a file,
 * and no configuration is read.
 */

/** The CLI (for `serve`: the daemon), as `bin/natgw.js` runs it. */
export function main(): Promise<unknown> {
  return import('./main.js');
}

/** Initialise the modules a daemon's start runs, so that their code is compiled (the build). */
export async function warm(): Promise<void> {
  await Promise.all([
    import('../daemon/serve.js'),
    import('../api/app.js'),
    import('../config/config.js'),
    import('../config/socketPath.js'),
    import('./forward.js'),
    import('../system/logger.js'),
  ]);
}
