'use strict';
// The daemon runs with V8 heap limits on its command line (src/daemon/nodeFlags.ts), and V8
// hashes every flag that differs from its default into the check of each code cache: with them,
// Node.js's embedded cache of its built-in modules is refused and `child_process`, `crypto`,
// `http`, ... are compiled from source at every start (~15-20 ms on the 2-core bench machine,
// while the start's replay waits to spawn its `nft`). V8 reads these two flags only when it
// creates the heap, before any JavaScript runs, and keeps what it computed; set back to their
// defaults (0: "V8 decides"), they still bound this heap, and the hash is Node.js's own again.
// The daemon bundle's code cache is written after the same reset (bin/daemonLoader.cjs), so it
// is checked against the same hash. Only these two flags: others may be read at run time.
const HEAP_FLAGS = ['--max-semi-space-size', '--max-old-space-size'];

/**
 * V8's flag setter, without loading node:v8 for it: that module and its own imports (heap
 * utilities, streams) compile from source while the hash is still the flagged one, ~5 ms of a
 * start before the replay's first spawn. process.binding('v8') is the very binding node:v8
 * wraps; it is deprecated, so its one-time warning (on stderr, where a shim must write nothing
 * on success) is silenced for the call. A Node.js that no longer offers it gets node:v8's.
 */
function flagSetter() {
  const quiet = process.noDeprecation;
  process.noDeprecation = true;
  try {
    const binding = process.binding('v8');
    if (typeof binding.setFlagsFromString === 'function') return (flags) => binding.setFlagsFromString(flags);
  } catch {
  } finally {
    process.noDeprecation = quiet;
  }
  return (flags) => require('node:v8').setFlagsFromString(flags);
}

/** Set the heap-size flags this process was started with back to V8's defaults (idempotent). */
function unhashHeapFlags(execArgv = process.execArgv) {
  const given = HEAP_FLAGS.filter((f) => execArgv.some((a) => a.startsWith(`${f}=`)));
  if (given.length === 0) return [];
  const set = flagSetter();
  for (const f of given) set(`${f}=0`);
  return given;
}

module.exports = { HEAP_FLAGS, unhashHeapFlags };
