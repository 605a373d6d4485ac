import { randomBytes, randomUUID } from 'node:crypto';
import { promises as fs } from 'node:fs';
import net from 'node:net';
import type { Logger } from 'pino';
import { tokenMatches } from '../api/auth.js';
import { legacyBody } from '../api/app.js';
import type { CommandOutput } from '../engine/output.js';
import { TokenBucket } from '../observe/rateLimit.js';
import { SHIM_ADDRESS } from '../dataplane/netfilter/notrack.js';

/**
 * The shim's fast path (image/nat-gateway.sh, README "The shim's loopback fast path"). bash
 * reaches a TCP port through its own /dev/tcp without starting any process, where curl alone
 * costs more than bash does; bash has no Unix-socket client, hence a loopback TCP listener.
 *
 * It binds natgw's own loopback address (SHIM_ADDRESS, which natgw's netfilter objects exempt
 * from conntrack: netfilter/notrack.ts), or 127.0.0.1 where that address cannot be bound, on a
 * port the kernel picks, and publishes `<port> <client> <server> <host>` in
 * `<NATGW_SOCKET>.tcp` (mode 0600, beside the root-only socket): two random secrets made
 * afresh at every start. The shim proves it could read the file by sending the first; the
 * daemon proves it wrote the file by answering with the second, so a process that took the
 * port after a daemon died learns only a dead secret and cannot pass off an answer as natgw's.
 *
 * A protocol bash can speak with builtins only (no HTTP: bash reads a socket byte by byte up
 * to a newline, but a counted read in blocks):
 *   request  `natgw-shim/1 <client secret> <n>\n` then n fields, each its bytes and a NUL:
 *            the command, then its rules (argv bytes never hold a NUL; nothing is quoted)
 *   answer   `natgw-shim/1 <server secret> <status> <stdout bytes> <stderr bytes> <enc>\n`
 *            then stdout and stderr; enc `raw`, or `esc` where either holds a NUL (bash
 *            variables cannot), every byte but printable ASCII then written \xHH for printf %b
 * Anything else (a wrong secret, a malformed or oversized request, shutting down, a failing
 * command runner) closes the connection without an answer, and the shim falls back to curl and
 * then to Node.js, which run the command or explain the refusal as they always did.
 */
export const SHIM_PROTOCOL = 'natgw-shim/1';

/** Where the shim finds the port and secrets: next to the socket, in its root-only directory. */
export const shimFileOf = (socketPath: string): string => `${socketPath}.tcp`;

const HEADER = /^natgw-shim\/1 ([0-9a-f]{64}) (\d{1,6})$/;
const MAX_HEADER = 128;

export interface ShimListenerOptions {
  readonly socketPath: string;
  readonly legacy: (command: string, rules: readonly string[]) => Promise<CommandOutput>;
  readonly log: Logger;
  /** NATGW_BODY_LIMIT: the largest request. */
  readonly maxBytes: number;
  /** NATGW_MAX_CONNECTIONS. */
  readonly maxConnections: number;
  /** NATGW_HEADERS_TIMEOUT: the whole request must arrive within it (the shim sends it at once). */
  readonly requestTimeoutMs: number;
  readonly shuttingDown: () => boolean;
  /** Tests: a fixed host. */
  readonly host?: string;
}

export interface ShimListener {
  readonly port: number;
  /** Unpublish, stop accepting, wait for the commands already running. */
  close(): Promise<void>;
}

/** The number of fields the request announces, once its first line is in; throws unless it is natgw's with the right secret. */
export function shimFieldCount(buf: Buffer, expectedToken: string): number | undefined {
  const nl = buf.indexOf(0x0a);
  if (nl < 0) {
    if (buf.length > MAX_HEADER) throw new Error('no request line');
    return undefined;
  }
  const m = HEADER.exec(buf.subarray(0, nl).toString('latin1'));
  if (!m) throw new Error('malformed request line');
  if (!tokenMatches(m[1]!, expectedToken)) throw new Error('wrong secret');
  const n = Number(m[2]);
  if (n < 1 || n > 100_001) throw new Error('bad field count');
  return n;
}

/** A request, once whole: undefined while more is to come; throws on anything malformed. */
export function parseShimRequest(buf: Buffer, expectedToken: string): { command: string; rules: string[] } | undefined {
  const n = shimFieldCount(buf, expectedToken);
  if (n === undefined) return undefined;
  const nl = buf.indexOf(0x0a);
  const fields: string[] = [];
  let start = nl + 1;
  while (fields.length < n) {
    const end = buf.indexOf(0, start);
    if (end < 0) return undefined;
    // Invalid UTF-8 becomes U+FFFD, as it does in process.argv and in POST /v1/legacy/raw.
    fields.push(buf.subarray(start, end).toString('utf8'));
    start = end + 1;
  }
  if (start !== buf.length) throw new Error('bytes after the last field');
  const parsed = legacyBody.safeParse({ command: fields[0], rules: fields.slice(1) });
  if (!parsed.success) throw new Error('request beyond the limits of POST /v1/legacy');
  return parsed.data;
}

/** printf %b's input: printable ASCII but the backslash stays, every other byte is \xHH. */
function escapeBytes(b: Buffer): Buffer {
  let out = '';
  for (const c of b) out += c > 0x20 && c < 0x7f && c !== 0x5c ? String.fromCharCode(c) : `\\x${c.toString(16).padStart(2, '0')}`;
  return Buffer.from(out, 'latin1');
}

export function renderShimAnswer(serverToken: string, out: CommandOutput): Buffer {
  let stdout: Buffer = Buffer.from(out.stdout, 'utf8');
  let stderr: Buffer = Buffer.from(out.stderr, 'utf8');
  let enc = 'raw';
  if (stdout.includes(0) || stderr.includes(0)) {
    enc = 'esc';
    stdout = escapeBytes(stdout);
    stderr = escapeBytes(stderr);
  }
  const head = `${SHIM_PROTOCOL} ${serverToken} ${out.status} ${stdout.length} ${stderr.length} ${enc}\n`;
  return Buffer.concat([Buffer.from(head, 'latin1'), stdout, stderr]);
}

/**
 * Listen and publish. A listener that cannot start (no loopback address, say) is logged and
 * left out: the shim then takes curl, as it does without this file.
 */
export async function startShimListener(o: ShimListenerOptions): Promise<ShimListener | undefined> {
  const file = shimFileOf(o.socketPath);
  // A file left by a killed daemon names a dead port and dead secrets: gone before anything else.
  await fs.unlink(file).catch(() => undefined);
  const clientToken = randomBytes(32).toString('hex');
  const serverToken = randomBytes(32).toString('hex');
  const running = new Set<Promise<unknown>>();
  // Connections whose request is not in yet: cut at close, where a running command is awaited.
  const waiting = new Set<net.Socket>();

  // Refusals logged: 5 at once, then one a second (`unlogged` says how many were left out).
  const refusalLog = new TokenBucket(1, 5);
  let unloggedRefusals = 0;
  const server = net.createServer((conn) => {
    const started = process.hrtime.bigint();
    waiting.add(conn);
    conn.on('close', () => waiting.delete(conn));
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    // NULs seen, and how many a whole request has (known once its first line is in): the
    // request is parsed once, when whole, not again on every chunk of a large one.
    let nuls = 0;
    let fields: number | undefined;
    const refuse = (why: string) => {
      if (done) return;
      done = true;
      conn.destroy();
      // Anything in the pod's network namespace can connect: a flood of refusals is counted, not logged line by line.
      if (refusalLog.take()) {
        o.log.warn({ via: 'shim-tcp', outcome: 'refused', why, unlogged: unloggedRefusals }, 'shim request refused; the shim falls back to curl');
        unloggedRefusals = 0;
      } else unloggedRefusals++;
    };
    conn.setTimeout(o.requestTimeoutMs, () => refuse('request not complete in time'));
    conn.on('error', () => conn.destroy());
    conn.on('data', (chunk: Buffer) => {
      if (done) return;
      size += chunk.length;
      if (size > o.maxBytes + MAX_HEADER) {
        refuse('request larger than NATGW_BODY_LIMIT');
        return;
      }
      chunks.push(chunk);
      for (let i = chunk.indexOf(0); i >= 0; i = chunk.indexOf(0, i + 1)) nuls++;
      let req: { command: string; rules: string[] } | undefined;
      try {
        if (fields === undefined) {
          const head = chunks.length === 1 ? chunk : Buffer.concat(chunks);
          fields = shimFieldCount(head, clientToken);
          if (chunks.length > 1) chunks.splice(0, chunks.length, head);
        }
        if (fields !== undefined && nuls >= fields) req = parseShimRequest(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks), clientToken);
      } catch (e) {
        refuse((e as Error).message);
        return;
      }
      if (!req) return;
      done = true;
      waiting.delete(conn);
      conn.setTimeout(0);
      if (o.shuttingDown()) {
        conn.destroy();
        return;
      }
      const { command, rules } = req;
      const job = o.legacy(command, rules).then(
        (out) => {
          const ms = Number(process.hrtime.bigint() - started) / 1e6;
          // Logged before the answer leaves: whoever saw the shim return finds the line.
          o.log.info(
            {
              reqId: randomUUID(),
              via: 'shim-tcp',
              path: '/v1/legacy',
              ms: Math.round(ms * 10) / 10,
              command,
              rules: rules.length,
              exitStatus: out.status,
              outcome: out.status === 0 ? 'ok' : 'failed',
            },
            'request',
          );
          conn.end(renderShimAnswer(serverToken, out));
        },
        (e: unknown) => {
          conn.destroy();
          o.log.error({ via: 'shim-tcp', path: '/v1/legacy', command, err: e }, 'shim command failed; the shim falls back to curl');
        },
      );
      running.add(job);
      void job.finally(() => running.delete(job));
    });
  });
  server.maxConnections = o.maxConnections;

  const listen = (host: string) =>
    new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, host, () => {
        server.off('error', reject);
        resolve();
      });
    });
  let host = o.host ?? SHIM_ADDRESS;
  try {
    await listen(host).catch(async (e: unknown) => {
      // A loopback configured without 127.0.0.0/8 (lo holding 127.0.0.1/32 only): the fast
      // path still works, its connections are then tracked as any other process's.
      if (o.host !== undefined || (e as NodeJS.ErrnoException).code !== 'EADDRNOTAVAIL') throw e;
      o.log.warn({ address: SHIM_ADDRESS, err: e }, "shim fast path on 127.0.0.1: natgw's loopback address cannot be bound, so its connections are tracked");
      host = '127.0.0.1';
      await listen(host);
    });
  } catch (e) {
    o.log.warn({ err: e }, 'shim fast path off: cannot listen on loopback; the shim uses curl');
    return undefined;
  }
  const port = (server.address() as net.AddressInfo).port;
  try {
    // Written whole under another name, then renamed: a shim never reads half a line.
    const tmp = `${file}.${process.pid}`;
    await fs.writeFile(tmp, `${port} ${clientToken} ${serverToken} ${host}\n`, { mode: 0o600 });
    await fs.rename(tmp, file);
  } catch (e) {
    server.close();
    o.log.warn({ err: e, file }, 'shim fast path off: cannot write its file; the shim uses curl');
    return undefined;
  }
  o.log.info({ host, port, file }, 'shim fast path listening on loopback');

  return {
    port,
    async close() {
      await fs.unlink(file).catch(() => undefined);
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const c of waiting) c.destroy();
      await closed;
      await Promise.allSettled([...running]);
    },
  };
}
