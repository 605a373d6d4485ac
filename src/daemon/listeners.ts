import { createHash } from 'node:crypto';
import { promises as fs } from 'node:fs';
import type http from 'node:http';
import type https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { Express } from 'express';
import type { Config } from '../config/config.js';
import type { AuthOptions } from '../api/auth.js';

/** A start-up refusal: printed on stderr, non-zero exit. */
export class StartupError extends Error {
  override readonly name = 'StartupError';
}

export interface TcpSettings {
  readonly host: string;
  readonly port: number;
  readonly auth: AuthOptions;
  readonly tls?: { readonly cert: Buffer; readonly key: Buffer; readonly ca?: Buffer };
  /** NATGW_MAX_CONNECTIONS, NATGW_HEADERS_TIMEOUT, NATGW_REQUEST_TIMEOUT. */
  readonly limits: { readonly maxConnections: number; readonly headersTimeoutMs: number; readonly requestTimeoutMs: number };
}

/** `host:port`, `[v6]:port`, or `:port` / `port` (no host: the VPC interface's address, see tcpSettings). */
export function parseListen(s: string): { host: string | undefined; port: number } | null {
  const m = /^(?:(?:\[([0-9A-Fa-f:.]+)\]|([^:[\]]*)):)?(\d{1,5})$/.exec(s.trim());
  if (!m) return null;
  const port = Number(m[3]);
  if (port < 1 || port > 65535) return null;
  return { host: m[1] ?? (m[2] || undefined), port };
}

/**
 * The address a host-less NATGW_LISTEN binds to: the VPC interface's first IPv4 address, else
 * its first IPv6 one that is not link-local. The VPC side is where the controller and
 * operators reach the gateway; net1 faces the external network and carries the EIPs, and an
 * API bound to every address would face it too.
 */
function vpcAddress(ifname: string, interfaces: NodeJS.Dict<os.NetworkInterfaceInfo[]>): string | undefined {
  const addrs = interfaces[ifname] ?? [];
  return (addrs.find((a) => a.family === 'IPv4') ?? addrs.find((a) => a.family === 'IPv6' && !a.address.toLowerCase().startsWith('fe80')))?.address;
}

/** A token this short is guessable by a tenant on the VPC side (32 bytes: `openssl rand -hex 16` and up). */
const MIN_TOKEN_BYTES = 32;

/** What the shipped examples put where a token goes (image/deploy): never a real secret. */
const PLACEHOLDER = /change[-_ ]?me|replace[-_ ]?me|placeholder|your[-_ ]?token/i;

/** Why this token must not guard the API, or undefined. */
function tokenProblem(token: string, file: string): string | undefined {
  if (PLACEHOLDER.test(token)) {
    return `NATGW_TOKEN_FILE: ${file} holds the example's placeholder token: put a random one there (e.g. openssl rand -hex 32)`;
  }
  const bytes = Buffer.byteLength(token);
  if (bytes < MIN_TOKEN_BYTES) {
    return `NATGW_TOKEN_FILE: the token in ${file} is ${bytes} bytes, shorter than ${MIN_TOKEN_BYTES}: put a random one there (e.g. openssl rand -hex 32)`;
  }
  return undefined;
}

async function readSecret(file: string, key: string): Promise<Buffer> {
  try {
    return await fs.readFile(file);
  } catch (e) {
    throw new StartupError(`${key}: cannot read ${file}: ${(e as Error).message}`);
  }
}

/**
 * What the TCP listener needs, or undefined without NATGW_LISTEN. Refuses (SPEC §4.2) to
 * serve TCP without a token file or TLS that verifies client certificates: the VPC side is
 * tenant-reachable, so an open API would hand the NAT to tenants.
 */
export async function tcpSettings(
  config: Config,
  interfaces: () => NodeJS.Dict<os.NetworkInterfaceInfo[]> = os.networkInterfaces,
): Promise<TcpSettings | undefined> {
  if (!config.listen) return undefined;
  const addr = parseListen(config.listen);
  if (!addr) throw new StartupError(`NATGW_LISTEN: '${config.listen}' is not host:port or a port (e.g. 10.0.1.254:8443, [::]:8443 or 8443)`);
  if (Boolean(config.tlsCert) !== Boolean(config.tlsKey)) {
    throw new StartupError('NATGW_TLS_CERT and NATGW_TLS_KEY must be set together');
  }
  if (config.tlsClientCa && !config.tlsCert) {
    throw new StartupError('NATGW_TLS_CLIENT_CA needs NATGW_TLS_CERT and NATGW_TLS_KEY (the server side of TLS)');
  }
  const clientCerts = Boolean(config.tlsCert && config.tlsKey && config.tlsClientCa);
  if (!config.tokenFile && !clientCerts) {
    throw new StartupError(
      `NATGW_LISTEN=${config.listen} is set but neither NATGW_TOKEN_FILE nor TLS client verification ` +
        '(NATGW_TLS_CERT, NATGW_TLS_KEY and NATGW_TLS_CLIENT_CA) is configured: refusing to serve the API unauthenticated over TCP',
    );
  }
  let token: string | undefined;
  if (config.tokenFile) {
    token = (await readSecret(config.tokenFile, 'NATGW_TOKEN_FILE')).toString('utf8').trim();
    if (token === '' || /\s/.test(token)) throw new StartupError(`NATGW_TOKEN_FILE: ${config.tokenFile} must hold one token (non-empty, no white space)`);
    const problem = tokenProblem(token, config.tokenFile);
    if (problem) throw new StartupError(problem);
  }
  const tls =
    config.tlsCert && config.tlsKey
      ? {
          cert: await readSecret(config.tlsCert, 'NATGW_TLS_CERT'),
          key: await readSecret(config.tlsKey, 'NATGW_TLS_KEY'),
          ca: config.tlsClientCa ? await readSecret(config.tlsClientCa, 'NATGW_TLS_CLIENT_CA') : undefined,
        }
      : undefined;
  const host = addr.host ?? vpcAddress(config.vpcInterface, interfaces());
  if (host === undefined) {
    throw new StartupError(
      `NATGW_LISTEN=${config.listen} binds to the VPC interface's address, but ${config.vpcInterface} (VPC_INTERFACE) has none: ` +
        'give the host (e.g. NATGW_LISTEN=10.0.1.254:8443)',
    );
  }
  return {
    host,
    port: addr.port,
    auth: { token, ...(config.tokenFile ? { tokenFile: config.tokenFile } : {}), clientCerts },
    tls,
    limits: { maxConnections: config.maxConnections, headersTimeoutMs: config.headersTimeoutMs, requestTimeoutMs: config.requestTimeoutMs },
  };
}

function listen(server: net.Server, target: string | { host: string; port: number }): Promise<void> {
  return new Promise((resolve, reject) => {
    const onError = (e: Error) => reject(e);
    server.once('error', onError);
    const done = () => {
      server.off('error', onError);
      resolve();
    };
    if (typeof target === 'string') server.listen(target, done);
    else server.listen(target.port, target.host, done);
  });
}

/** Does a natgw daemon answer /healthz on this socket (a stale socket file's successor, the shim's autostart)? */
export async function socketAnswers(socketPath: string): Promise<boolean> {
  const { get } = await import('node:http');
  return new Promise((resolve) => {
    const req = get({ socketPath, path: '/healthz', timeout: 1000 }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', () => resolve(false));
  });
}

/**
 * One daemon per socket in a network namespace: an abstract Unix socket (Linux) named after
 * the API socket's path. The kernel frees it when the holder dies, even by SIGKILL, so a
 * killed daemon never blocks its successor, and two shims autostarting at once cannot both
 * win.
 */
export async function claimSingleton(socketPath: string): Promise<net.Server | undefined> {
  const name = `\0natgw-${createHash('sha256').update(path.resolve(socketPath)).digest('hex').slice(0, 24)}`;
  const server = net.createServer((c) => c.destroy());
  try {
    await listen(server, name);
    server.unref();
    return server;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'EADDRINUSE') return undefined;
    throw e;
  }
}

/**
 * Serve on the Unix socket: parent directory created, a stale socket file (left by a killed
 * daemon) replaced, mode 0600 from the start (umask while binding) and after.
 */
export async function listenUnix(app: Express, socketPath: string): Promise<http.Server> {
  await fs.mkdir(path.dirname(socketPath), { recursive: true, mode: 0o700 });
  const st = await fs.lstat(socketPath).catch(() => undefined);
  if (st) {
    if (!st.isSocket()) throw new StartupError(`NATGW_SOCKET: ${socketPath} exists and is not a socket`);
    if (await socketAnswers(socketPath)) throw new StartupError(`another natgw daemon is serving ${socketPath}`);
    await fs.unlink(socketPath);
  }
  // node:http is imported here, not by this module: it loads with the API, beside the first sync (serve.ts).
  const { createServer } = await import('node:http');
  const server = createServer(app);
  const old = process.umask(0o177);
  try {
    await listen(server, socketPath);
  } finally {
    process.umask(old);
  }
  await fs.chmod(socketPath, 0o600);
  return server;
}

export async function listenTcp(app: Express, s: TcpSettings): Promise<http.Server | https.Server> {
  // Node checks the header and request deadlines on this interval (30 s by default).
  const checking = { connectionsCheckingInterval: 1000 };
  // node:https (and node:tls with it) loaded only for TLS.
  const { createServer } = await import('node:http');
  const server = s.tls
    ? (await import('node:https')).createServer(
        {
          ...checking,
          cert: s.tls.cert,
          key: s.tls.key,
          ...(s.tls.ca ? { ca: s.tls.ca, requestCert: true, rejectUnauthorized: false } : {}),
        },
        app,
      )
    : createServer(checking, app);
  // The TCP side is tenant-reachable: a slow or flooding client must not hold the daemon's
  // sockets or memory. (The Unix socket is root-local and keeps Node's defaults.)
  server.maxConnections = s.limits.maxConnections;
  server.headersTimeout = s.limits.headersTimeoutMs;
  server.requestTimeout = Math.max(s.limits.requestTimeoutMs, s.limits.headersTimeoutMs);
  await listen(server, { host: s.host, port: s.port });
  return server;
}

/** Stop accepting; wait up to 5 s for open connections to finish, then cut the rest. */
export async function closeServer(server: http.Server | https.Server): Promise<void> {
  if (!server.listening) return;
  await new Promise<void>((resolve) => {
    const t = setTimeout(() => {
      server.closeAllConnections();
      resolve();
    }, 5000);
    t.unref();
    server.close(() => {
      clearTimeout(t);
      resolve();
    });
    server.closeIdleConnections();
  });
}
