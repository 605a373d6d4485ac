// Runs the daemon's CommonJS bundle (scripts/bundle.mjs) from its V8 code cache: the ~3 MB of
// JavaScript is not compiled at each start. A cache V8 rejects (another node binary, other V8
// flags) costs nothing but that compile.
import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import vm from 'node:vm';

function compile(file, cachedData) {
  // ASCII by construction, so no UTF-8 decoding of the whole file.
  const source = readFileSync(file, 'latin1');
  return new vm.Script(`(function (exports, require, module, __filename, __dirname) {${source}\n})`, { filename: file, cachedData });
}

/** Run the bundle as CommonJS module `file`, with its code cache when there is one. */
export function runDaemonBundle(file) {
  let cachedData;
  try {
    cachedData = readFileSync(`${file}.cache`);
  } catch {}
  const wrapper = compile(file, cachedData).runInThisContext();
  const module = { exports: {} };
  wrapper.call(module.exports, module.exports, createRequire(file), module, file, dirname(file));
}

/** Write the bundle's code cache (the build does, under the daemon's V8 flags). */
export function writeCodeCache(file) {
  const data = compile(file, undefined).createCachedData();
  writeFileSync(`${file}.cache.tmp`, data);
  renameSync(`${file}.cache.tmp`, `${file}.cache`);
}
