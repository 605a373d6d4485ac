import { createHash, timingSafeEqual } from 'node:crypto';
import type { TLSSocket } from 'node:tls';
import type { RequestHandler } from 'express';

/**
 * Authentication for the TCP listener (SPEC §4.2 Security). The Unix socket needs none: its
 * file mode (0600) is the protection. Over TCP, the probes are open; every other path needs
 * a bearer token or, where TLS verifies client certificates, a verified certificate.
 */
export interface AuthOptions {
  /** The shared secret (contents of NATGW_TOKEN_FILE, trimmed). */
  readonly token?: string;
  /** TLS with NATGW_TLS_CLIENT_CA: a client whose certificate verified is authenticated. */
  readonly clientCerts?: boolean;
}

export const OPEN_PATHS: ReadonlySet<string> = new Set(['/healthz', '/readyz']);

const digest = (s: string): Buffer => createHash('sha256').update(s, 'utf8').digest();

/** Constant-time comparison: both sides are hashed to equal length first. */
export function tokenMatches(given: string, expected: string): boolean {
  return timingSafeEqual(digest(given), digest(expected));
}

export function authenticate(opts: AuthOptions): RequestHandler {
  return (req, res, next) => {
    if (OPEN_PATHS.has(req.path)) {
      next();
      return;
    }
    if (opts.clientCerts && (req.socket as TLSSocket).authorized === true) {
      next();
      return;
    }
    const header = req.get('authorization') ?? '';
    const m = /^Bearer[ ]+(\S+)\s*$/i.exec(header);
    if (opts.token !== undefined && m && tokenMatches(m[1]!, opts.token)) {
      next();
      return;
    }
    res.set('WWW-Authenticate', 'Bearer realm="natgw"');
    res.status(401).json({ error: 'unauthorized', message: 'a valid Authorization: Bearer token (or client certificate) is required' });
  };
}
