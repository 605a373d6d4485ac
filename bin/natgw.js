#!/usr/bin/env node
// The package's bin: run the CLI. `npm run build` compiles it (tsc → dist/src) and bundles it
// (scripts/bundle.mjs → dist/natgw), which loads several times faster; `serve` runs the
// daemon's bundle from its code cache. A bundle is used unless it is missing or older than the
// compiled sources (only tsc was run since).
import { statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const mtime = (rel) => statSync(new URL(rel, import.meta.url), { throwIfNoEntry: false })?.mtimeMs ?? -1;
const compiled = mtime('../dist/src/cli/main.js');
const fresh = (rel) => {
  const t = mtime(rel);
  return t >= 0 && t >= compiled;
};
if (process.argv[2] === '--version' && process.argv.length === 3) {
  // Two small file reads (src/cli/version.ts), before the CLI and its built-ins load.
  process.stdout.write((await import('../dist/src/cli/version.js')).versionLine());
  process.exit(0);
}
if (process.argv[2] === 'serve') {
  // Before any built-in module the daemon needs is compiled (bin/heapFlags.cjs).
  createRequire(import.meta.url)('./heapFlags.cjs').unhashHeapFlags();
}
if (process.argv[2] === 'serve' && process.argv.length === 3) {
  // Before the daemon's code loads: replay the applied-ruleset cache into the kernel, so that
  // the apply runs while Node.js loads (src/daemon/replayBoot.ts, bundled on its own; not the daemon's bundle).
  try {
    (await import(fresh('../dist/natgw/daemon/replayBoot.mjs') ? '../dist/natgw/daemon/replayBoot.mjs' : '../dist/src/daemon/replayBoot.js')).startBootReplay();
  } catch {}
}
if (process.argv[2] === 'serve' && fresh('../dist/natgw/daemon/serve.cjs')) {
  const { runDaemonBundle } = await import('./daemonLoader.js');
  runDaemonBundle(fileURLToPath(new URL('../dist/natgw/daemon/serve.cjs', import.meta.url)));
} else {
  await import(fresh('../dist/natgw/cli/main.js') ? '../dist/natgw/cli/main.js' : '../dist/src/cli/main.js');
}
