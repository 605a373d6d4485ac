// natgw's runtime bundles, built from the tsc output (dist/src) after tsc (`npm run build`, and
// the image's build stage). Resolving and compiling ~300 separate modules cost the daemon
// ~0.3 s before its first sync.
//
// - dist/natgw/cli/main.js (+ chunks): the CLI as ES modules split at its dynamic imports, so a
//   shim call loads only what it imports.
// - dist/natgw/daemon/serve.cjs (+ serve.cjs.cache): the same CLI as one CommonJS file with a
//   V8 code cache, which bin/natgw.js runs for `natgw serve`: compiling the daemon's ~3 MB of
//   JavaScript is replaced by loading the cache (~10 ms instead of ~70 ms). Its entry is
//   src/cli/bundleEntry.ts; the cache is written after its `warm` initialised the modules a
//   start runs, so that it holds their compiled code too. The cache is made under the daemon's
//   own V8 flags (DAEMON_NODE_FLAGS), which V8 checks it against; any other node binary or
//   flags reject it and the source is compiled as usual.
//
// bin/natgw.js uses a bundle only when it is at least as new as the tsc output.
import { execFileSync } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { build } from 'esbuild';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const outdir = join(root, 'dist', 'natgw');
const entry = join(root, 'dist', 'src', 'cli', 'main.js');
rmSync(outdir, { recursive: true, force: true });
// 'prom-client' is its lean entry (scripts/promClientLean.cjs: what natgw uses, without the
// built-in modules the rest loads).
const promClientLean = {
  name: 'prom-client-lean',
  setup(b) {
    b.onResolve({ filter: /^prom-client$/ }, () => ({ path: join(root, 'scripts', 'promClientLean.cjs') }));
  },
};
// 'mime-types' is answered from a table for the types natgw's API uses (scripts/mimeTypesLean.cjs),
// the package loaded only for any other.
const mimeTypesLean = {
  name: 'mime-types-lean',
  setup(b) {
    b.onResolve({ filter: /^mime-types$/ }, () => ({ path: join(root, 'scripts', 'mimeTypesLean.cjs') }));
  },
};
const common = { bundle: true, platform: 'node', target: 'node20', logLevel: 'warning', legalComments: 'eof', plugins: [promClientLean, mimeTypesLean] };

await build({
  ...common,
  entryPoints: { 'cli/main': entry },
  splitting: true,
  format: 'esm',
  outdir,
  // Entry and chunks sit two folders below dist/, as dist/src/cli/*.js do: the paths the code
  // builds from import.meta.url (bin/natgw.js of this installation) stay the same.
  chunkNames: 'chunks/[name]-[hash]',
  // CommonJS dependencies (express, pino) call require(): give ESM chunks one.
  banner: { js: "import { createRequire as __natgwRequire } from 'node:module'; const require = __natgwRequire(import.meta.url);" },
});

// The loader's replay of the applied-ruleset cache (bin/natgw.js, before the daemon's bundle):
// one file instead of a graph of ES modules, so the apply starts ~2 ms sooner.
await build({
  ...common,
  entryPoints: [join(root, 'dist', 'src', 'daemon', 'replayBoot.js')],
  format: 'esm',
  outfile: join(outdir, 'daemon', 'replayBoot.mjs'),
});
// The same as CommonJS, for bin/serve.cjs (the shim's `serve`), which loads no ES module.
await build({
  ...common,
  entryPoints: [join(root, 'dist', 'src', 'daemon', 'replayBoot.js')],
  format: 'cjs',
  outfile: join(outdir, 'daemon', 'replayBoot.cjs'),
  define: { 'import.meta.url': '__natgwUrl' },
  banner: { js: "var __natgwUrl = require('node:url').pathToFileURL(__filename).href;" },
});

const daemon = join(outdir, 'daemon', 'serve.cjs');
await build({
  ...common,
  entryPoints: [join(root, 'dist', 'src', 'cli', 'bundleEntry.js')],
  format: 'cjs',
  outfile: daemon,
  // Two folders below dist/ as well, for the same import.meta.url paths.
  define: { 'import.meta.url': '__natgwUrl' },
  banner: { js: "var __natgwUrl = require('node:url').pathToFileURL(__filename).href;" },
});
// esbuild escapes every non-ASCII character of strings and identifiers; what is left is in
// comments. Escaped there too, the file is ASCII and bin/natgw.js reads it without decoding UTF-8.
writeFileSync(
  daemon,
  readFileSync(daemon, 'utf8').replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`),
);
const { DAEMON_NODE_FLAGS } = await import(pathToFileURL(join(root, 'dist', 'src', 'daemon', 'nodeFlags.js')).href);
const loader = pathToFileURL(join(root, 'bin', 'daemonLoader.js')).href;
execFileSync(
  process.execPath,
  [...DAEMON_NODE_FLAGS, '--input-type=module', '-e', `await (await import(${JSON.stringify(loader)})).writeCodeCache(${JSON.stringify(daemon)})`],
  {
    stdio: 'inherit',
  },
);

// dist/version.json for `natgw --version` (src/cli/version.ts): the package's version and the
// source revision — NATGW_REVISION where the build sets it (the image's build stage has no
// .git), else git's commit (`-dirty` with uncommitted changes to tracked files), else unknown.
const git = (...args) => {
  try {
    return execFileSync('git', ['-C', root, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return '';
  }
};
const commit = git('rev-parse', 'HEAD');
const revision =
  process.env.NATGW_REVISION?.trim() || (commit ? `${commit}${git('status', '--porcelain', '--untracked-files=no') ? '-dirty' : ''}` : 'unknown');
const { version } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
writeFileSync(join(root, 'dist', 'version.json'), `${JSON.stringify({ version, revision })}\n`);
