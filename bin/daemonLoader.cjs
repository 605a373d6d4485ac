'use strict';
// Runs the daemon's CommonJS bundle (scripts/bundle.mjs) from its V8 code cache: the ~3 MB of
// JavaScript is not compiled at each start. A cache V8 rejects (another node binary, other V8
// flags) costs nothing but that compile. CommonJS, so that bin/serve.cjs loads it without
// Node.js's ES module loader (bin/daemonLoader.js re-exports it for the ES module callers).
const { readFileSync, renameSync, writeFileSync } = require('node:fs');
const { createRequire } = require('node:module');
const { dirname } = require('node:path');
const vm = require('node:vm');
const { unhashHeapFlags } = require('./heapFlags.cjs');

function compile(file, cachedData) {
  // ASCII by construction, so no UTF-8 decoding of the whole file.
  const source = readFileSync(file, 'latin1');
  return new vm.Script(`(function (exports, require, module, __filename, __dirname) {${source}\n})`, { filename: file, cachedData });
}

/** Evaluate the bundle as CommonJS module `file`; returns its exports (src/cli/bundleEntry.ts). */
function load(script, file) {
  const wrapper = script.runInThisContext();
  const module = { exports: {} };
  wrapper.call(module.exports, module.exports, createRequire(file), module, file, dirname(file));
  return module.exports;
}

/** Run the bundle as CommonJS module `file`, with its code cache when there is one. */
function runDaemonBundle(file) {
  // The cache was written under this flag hash (writeCodeCache); bin/serve.cjs did it already.
  unhashHeapFlags();
  let cachedData;
  try {
    cachedData = readFileSync(`${file}.cache`);
  } catch {}
  void load(compile(file, cachedData), file).main();
}

/**
 * Write the bundle's code cache (the build does, under the daemon's V8 flags). V8 caches the
 * bytecode of the functions compiled so far, so the modules a start initialises are run first
 * (`warm`): a cache of the compile alone would leave them to be compiled at every start.
 */
async function writeCodeCache(file) {
  unhashHeapFlags();
  const script = compile(file, undefined);
  await load(script, file).warm();
  writeFileSync(`${file}.cache.tmp`, script.createCachedData());
  renameSync(`${file}.cache.tmp`, `${file}.cache`);
}

module.exports = { runDaemonBundle, writeCodeCache };
