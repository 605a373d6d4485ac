// natgw's runtime bundle: the tsc output of the CLI (dist/src/cli/main.js) and every module it
// loads, dependencies included, as one entry file plus chunks (dist/natgw/). Resolving and
// compiling ~300 separate modules cost the daemon ~0.2 s before its first sync; the bundle
// loads in a fraction of that. Chunks, not one file: the shim's forwarding path and
// `natgw serve` load only what they import (dynamic imports stay lazy).
//
// Run after tsc (`npm run build`; the image's build stage too). bin/natgw.js uses the bundle
// when it is at least as new as the tsc output, else the tsc output itself.
import { rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const outdir = join(root, 'dist', 'natgw');
rmSync(outdir, { recursive: true, force: true });
await build({
  entryPoints: { 'cli/main': join(root, 'dist', 'src', 'cli', 'main.js') },
  bundle: true,
  splitting: true,
  format: 'esm',
  platform: 'node',
  target: 'node20',
  outdir,
  // Entry and chunks sit two folders below dist/, as dist/src/cli/*.js do: the paths the code
  // builds from import.meta.url (bin/natgw.js of this installation) stay the same.
  chunkNames: 'chunks/[name]-[hash]',
  // CommonJS dependencies (express, pino) call require(): give ESM chunks one.
  banner: { js: "import { createRequire as __natgwRequire } from 'node:module'; const require = __natgwRequire(import.meta.url);" },
  logLevel: 'warning',
  legalComments: 'none',
});
