#!/usr/bin/env node
// The package's bin: the CLI as `npm run build` (tsc) compiled it. Node's compile cache keeps
// V8's compiled code of natgw and its dependencies between runs, in Node's default directory
// (os.tmpdir()/node-compile-cache, or NODE_COMPILE_CACHE): nothing to configure, no state
// dir to find before the configuration is read, and where that directory cannot be written
// (a read-only root without a writable /tmp) the cache is off and natgw runs as ever.
import module from 'node:module';

module.enableCompileCache?.();
await import('../dist/src/cli/main.js');
