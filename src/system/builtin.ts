/** A Node.js built-in module loaded when first needed, not at every start (TLS is rare). */
import { createRequire } from 'node:module';

const load = createRequire(import.meta.url);

export const lazyHttps = (): typeof import('node:https') => load('node:https') as typeof import('node:https');
