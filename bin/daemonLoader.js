// The daemon bundle's loader for ES module callers (bin/natgw.js, scripts/bundle.mjs); the
// code is bin/daemonLoader.cjs, which bin/serve.cjs loads without the ES module loader.
import loader from './daemonLoader.cjs';

export const { runDaemonBundle, writeCodeCache } = loader;
