#!/usr/bin/env node
'use strict';
// `natgw serve` as the shim (image/nat-gateway.sh) starts it: CommonJS, so that nothing before
// the applied-ruleset replay waits for Node.js's ES module loader (its own start, and the
// built-in modules' ES facades it builds: ~10 ms before the first `nft` ran, on a core the
// replay needs). The same order as bin/natgw.js: the replay (its CommonJS bundle), then the
// daemon's bundle from its code cache. Where a bundle is missing or older than the tsc output,
// bin/natgw.js runs instead (its own replay, the tsc output).
// First, before any built-in module is compiled (bin/heapFlags.cjs).
require('./heapFlags.cjs').unhashHeapFlags();
const { statSync } = require('node:fs');
const { join } = require('node:path');

const mtime = (rel) => statSync(join(__dirname, rel), { throwIfNoEntry: false })?.mtimeMs ?? -1;
const compiled = mtime('../dist/src/cli/main.js');
const fresh = (rel) => {
  const t = mtime(rel);
  return t >= 0 && t >= compiled;
};
const replay = '../dist/natgw/daemon/replayBoot.cjs';
const daemon = '../dist/natgw/daemon/serve.cjs';
if (process.argv[2] === 'serve' && fresh(replay) && fresh(daemon)) {
  if (process.argv.length === 3) {
    try {
      require(replay).startBootReplay();
    } catch {}
  }
  require('./daemonLoader.cjs').runDaemonBundle(join(__dirname, daemon));
} else {
  void import('./natgw.js');
}
