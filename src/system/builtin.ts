/**
 * A Node.js built-in module loaded when first needed, not at the daemon's start (every built-in
 * is compiled at each start under the daemon's V8 flags: src/daemon/nodeFlags.ts). Synchronous,
 * and not `import()`: the daemon's bundle runs as a vm.Script (bin/daemonLoader.cjs), where a
 * dynamic import has no loader.
 */
import { createRequire } from 'node:module';

const load = createRequire(import.meta.url);

export const lazyHttps = (): typeof import('node:https') => load('node:https') as typeof import('node:https');
export const lazyReadline = (): typeof import('node:readline') => load('node:readline') as typeof import('node:readline');
