#!/usr/bin/env node
// The package's bin: run the CLI. `npm run build` compiles it (tsc → dist/src) and bundles it
// (scripts/bundle.mjs → dist/natgw), which loads several times faster; the bundle is used
// unless it is missing or older than the compiled sources (only tsc was run since).
import { statSync } from 'node:fs';

const mtime = (rel) => statSync(new URL(rel, import.meta.url), { throwIfNoEntry: false })?.mtimeMs ?? -1;
const bundled = mtime('../dist/natgw/cli/main.js');
await import(bundled >= 0 && bundled >= mtime('../dist/src/cli/main.js') ? '../dist/natgw/cli/main.js' : '../dist/src/cli/main.js');
