import http from 'node:http';
import type https from 'node:https';
import { readFile } from 'node:fs/promises';
import { readEnvFile } from '../config/envFile.js';
import { DEFAULT_ENV_FILE, socketPathFromEnv } from '../config/socketPath.js';

/**
 * The agent commands' way to the daemon: the Unix socket the shim uses (NATGW_SOCKET, same
 * resolution), or TCP with the bearer token. These commands never start a daemon and never
 * touch the kernel themselves: no daemon is an error that says how to get one.
 */
export type Target = { readonly kind: 'socket'; readonly socket: string } | { readonly kind: 'tcp'; readonly url: URL; readonly token?: string };

export interface TargetOptions {
  readonly socket?: string;
  readonly server?: string;
  readonly tokenFile?: string;
}

/** A failure the user can act on; main prints its message and exits 1. */
export class CliError extends Error {
  override readonly name = 'CliError';
  constructor(
    message: string,
    readonly exitCode = 1,
  ) {
    super(message);
  }
}

export async function resolveTarget(opts: TargetOptions, env: NodeJS.ProcessEnv = process.env): Promise<Target> {
  if (opts.socket !== undefined && opts.server !== undefined) throw new CliError('--socket and --server exclude each other', 2);
  if (opts.server === undefined) return { kind: 'socket', socket: opts.socket ?? (await socketPathFromEnv(env)) };
  let url: URL;
  try {
    url = new URL(opts.server.includes('://') ? opts.server : `http://${opts.server}`);
  } catch {
    throw new CliError(`--server: '${opts.server}' is not a URL (e.g. http://127.0.0.1:8080)`, 2);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new CliError(`--server: ${url.protocol} is not http: or https:`, 2);
  // The token file as the daemon is configured (env file over environment), unless given.
  const envFile = env.NATGW_ENV_FILE?.trim() || DEFAULT_ENV_FILE;
  const fromFile = await readEnvFile(envFile).catch(() => ({}) as Record<string, string>);
  const tokenFile = opts.tokenFile ?? (fromFile.NATGW_TOKEN_FILE || env.NATGW_TOKEN_FILE || undefined);
  if (tokenFile === undefined) return { kind: 'tcp', url };
  let token: string;
  try {
    token = (await readFile(tokenFile, 'utf8')).trim();
  } catch (e) {
    throw new CliError(`token file ${tokenFile}: ${(e as Error).message}`);
  }
  if (!token) throw new CliError(`token file ${tokenFile} is empty`);
  return { kind: 'tcp', url, token };
}

const describeTarget = (t: Target): string => (t.kind === 'socket' ? t.socket : t.url.origin);

export interface Answer {
  readonly status: number;
  readonly text: string;
  readonly headers: http.IncomingHttpHeaders;
}

/** The daemon's error body as one line: its message names the field at fault. */
export function apiError(what: string, a: Answer): CliError {
  let message = a.text.trim().slice(0, 500);
  try {
    const b = JSON.parse(a.text) as { message?: unknown; field?: unknown };
    if (typeof b.message === 'string') message = b.message;
  } catch {
    // not JSON: the text as it came
  }
  if (a.status === 401) message += ' (over TCP: pass --token-file or set NATGW_TOKEN_FILE)';
  return new CliError(`${what}: the daemon answered ${a.status}: ${message}`);
}

const CONNECT_TIMEOUT_MS = 3000;

/**
 * One request. Only the connection is bounded: an apply of thousands of objects may take a
 * while, and the daemon bounds its own work.
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
      res.on('error', (e) => reject(new CliError(`${method} ${path}: ${e.message}`)));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8'), headers: res.headers }));
    });
    const timer = setTimeout(() => req.destroy(Object.assign(new Error('connect timeout'), { code: 'ETIMEDOUT' })), CONNECT_TIMEOUT_MS);
    req.on('socket', (s) => {
      s.once('connect', () => clearTimeout(timer));
      s.once('secureConnect', () => clearTimeout(timer));
    });
    req.on('close', () => clearTimeout(timer));
    req.on('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      const where = describeTarget(target);
      if (e.code === 'ENOENT' || e.code === 'ECONNREFUSED' || e.code === 'ETIMEDOUT' || e.code === 'ENOTSOCK') {
        const how = target.kind === 'socket' ? '--socket PATH or NATGW_SOCKET' : '--server URL';
        reject(new CliError(`no natgw daemon answers on ${where} (${e.code}): start one with \`natgw serve\`, or point at it with ${how}`));
      } else if (e.code === 'EACCES') {
        reject(new CliError(`${where}: permission denied (the socket is root's: run as root)`));
      } else {
        reject(new CliError(`${where}: ${e.message}`));
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
