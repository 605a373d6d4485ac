import http from 'node:http';
import type https from 'node:https';

/**
 * The one HTTP client of the CLI: the shim's forwarding (forward.ts) and the agent commands
 * reach the daemon through it, on the Unix socket or over TCP with the bearer token.
 */
export type Target = { readonly kind: 'socket'; readonly socket: string } | { readonly kind: 'tcp'; readonly url: URL; readonly token?: string };

/** A failure the user can act on; main prints its message and exits 1. */
export class CliError extends Error {
  override readonly name: string = 'CliError';
  constructor(
    message: string,
    readonly exitCode = 1,
    cause?: Error,
  ) {
    super(message, cause ? { cause } : undefined);
  }
}

export interface Answer {
  readonly status: number;
  readonly text: string;
}

/** The daemon's error body as one line: its message (which names the field at fault), else the text as it came. */
export function messageOf(text: string): string {
  try {
    const m = (JSON.parse(text) as { message?: unknown }).message;
    if (typeof m === 'string') return m;
  } catch {
    // not JSON
  }
  return text.trim().slice(0, 500);
}

export function apiError(what: string, a: Answer): CliError {
  const hint = a.status === 401 ? ' (over TCP: pass --token-file or set NATGW_TOKEN_FILE)' : '';
  return new CliError(`${what}: the daemon answered ${a.status}: ${messageOf(a.text)}${hint}`);
}

const CONNECT_TIMEOUT_MS = 3000;

/** Connection errors that mean no daemon listens there (forward.ts then starts one or runs the command itself). */
export const NO_DAEMON = new Set(['ENOENT', 'ECONNREFUSED', 'ETIMEDOUT', 'ENOTSOCK']);

/**
 * One request. Only the connection is bounded: an apply of thousands of objects (or `init`)
 * may take a while, and the daemon bounds its own work. A failure is a CliError whose `cause`
 * is Node's own error.
 */
export async function request(target: Target, method: string, path: string, body?: string, headers: Record<string, string> = {}): Promise<Answer> {
  const hdrs: Record<string, string> = { ...headers };
  if (body !== undefined) {
    hdrs['content-type'] = 'application/json';
    hdrs['content-length'] = String(Buffer.byteLength(body));
  }
  let options: http.RequestOptions;
  let mod: typeof http | typeof https = http;
  if (target.kind === 'socket') {
    options = { socketPath: target.socket, path, method, headers: hdrs, agent: false };
  } else {
    if (target.token) hdrs.authorization = `Bearer ${target.token}`;
    // node:https (and node:tls) only for an https: server.
    mod = target.url.protocol === 'https:' ? await import('node:https') : http;
    options = { host: target.url.hostname, port: target.url.port || undefined, path, method, headers: hdrs, agent: false };
  }
  return new Promise((resolve, reject) => {
    const req = mod.request(options, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', (e) => reject(new CliError(`${method} ${path}: ${e.message}`, 1, e)));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }));
    });
    const timer = setTimeout(() => req.destroy(Object.assign(new Error('connect timeout'), { code: 'ETIMEDOUT' })), CONNECT_TIMEOUT_MS);
    req.on('socket', (s) => {
      s.once('connect', () => clearTimeout(timer));
      s.once('secureConnect', () => clearTimeout(timer));
    });
    req.on('close', () => clearTimeout(timer));
    req.on('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      const where = target.kind === 'socket' ? target.socket : target.url.origin;
      if (NO_DAEMON.has(e.code ?? '')) {
        const how = target.kind === 'socket' ? '--socket PATH or NATGW_SOCKET' : '--server URL';
        reject(new CliError(`no natgw daemon answers on ${where} (${e.code}): start one with \`natgw serve\`, or point at it with ${how}`, 1, e));
      } else if (e.code === 'EACCES') {
        reject(new CliError(`${where}: permission denied (the socket is root's: run as root)`, 1, e));
      } else {
        reject(new CliError(`${where}: ${e.message}`, 1, e));
      }
    });
    req.end(body);
  });
}

/** GET/PUT expecting a 2xx JSON answer. */
export async function requestJson<T>(target: Target, method: string, path: string, body?: string, headers?: Record<string, string>): Promise<T> {
  const a = await request(target, method, path, body, headers);
  if (a.status < 200 || a.status >= 300) throw apiError(`${method} ${path}`, a);
  try {
    return JSON.parse(a.text) as T;
  } catch {
    throw new CliError(`${method} ${path}: the daemon's answer is not JSON`);
  }
}
