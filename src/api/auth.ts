import { createHash, timingSafeEqual } from 'node:crypto';
import fs from 'node:fs';
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
  /**
   * NATGW_TOKEN_FILE: re-read whenever its mtime, size or inode changes, so a rotated token
   * takes effect without a restart. A file that becomes unreadable or empty admits nobody.
   */
  readonly tokenFile?: string;
  /** TLS with NATGW_TLS_CLIENT_CA: a client whose certificate verified is authenticated. */
  readonly clientCerts?: boolean;
}

export const OPEN_PATHS: ReadonlySet<string> = new Set(['/healthz', '/readyz']);

const digest = (s: string): Buffer => createHash('sha256').update(s, 'utf8').digest();

/** Constant-time comparison: both sides are hashed to equal length first. */
function tokenMatches(given: string, expected: string): boolean {
  return timingSafeEqual(digest(given), digest(expected));
}

/** The token now in `file` (a stat per request; read again only when the file changed). */
function tokenReader(file: string): () => string | undefined {
  let key = '';
  let token: string | undefined;
  return () => {
    let st: fs.Stats;
    try {
      st = fs.statSync(file);
    } catch {
      return undefined;
    }
    const now = `${st.ino}:${st.size}:${st.mtimeMs}`;
    if (now !== key) {
      try {
        const t = fs.readFileSync(file, 'utf8').trim();
        token = t === '' || /\s/.test(t) ? undefined : t;
      } catch {
        token = undefined;
      }
      key = now;
    }
    return token;
  };
}

export function authenticate(opts: AuthOptions): RequestHandler {
  const currentToken = opts.tokenFile ? tokenReader(opts.tokenFile) : () => opts.token;
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
    const token = m ? currentToken() : undefined;
    if (token !== undefined && m && tokenMatches(m[1]!, token)) {
      next();
      return;
    }
    res.set('WWW-Authenticate', 'Bearer realm="natgw"');
    res.status(401).json({ error: 'unauthorized', message: 'a valid Authorization: Bearer token (or client certificate) is required' });
  };
}
