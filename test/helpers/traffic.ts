/**
 * Traffic tools that run inside the topology's namespaces. Servers and clients are tiny
 * node scripts passed with `node -e` and parameterised through argv only (never by
 * interpolating values into code or a shell), so they behave the same on any machine
 * that can run the tests.
 */
import type { ChildProcess } from 'node:child_process';
import { createInterface, type Interface } from 'node:readline';
import type { NsRef, Topology } from './netns.js';

export type Proto = 'tcp' | 'udp';

export interface ServerHandle {
  /** Resolves once the server is listening; rejects if it exits first. */
  readonly ready: Promise<void>;
  /** Kill the server and wait for it to be gone. */
  stop(): Promise<void>;
}

// ---------------------------------------------------------------------------------
// Scripts. Each reads its parameters from process.argv.slice(1).
// ---------------------------------------------------------------------------------

/** The peer as the server sees it, with v4-mapped v6 addresses unwrapped. */
const PEER_FN = `const unmap = (a) => String(a).replace(/^::ffff:/, '');
const peerOf = (a, p, s) => 'peer=' + unmap(a) + ':' + p + (s && reportLocal === '1' ? ' local=' + unmap(s.localAddress) + ':' + s.localPort : '') + '\\n';`;

/** Answers every TCP connection / UDP datagram with `peer=<ip>:<port>`. */
const PEER_SERVER = `${PEER_FN}
const [proto, port, bind, reportLocal] = process.argv.slice(1);
const ready = () => process.stdout.write('listening\\n');
if (proto === 'tcp') {
  const srv = require('net').createServer((s) => { s.on('error', () => {}); s.end(peerOf(s.remoteAddress, s.remotePort, s)); });
  srv.listen({ port: Number(port), host: bind }, ready);
} else {
  const sock = require('dgram').createSocket(bind.includes(':') ? 'udp6' : 'udp4');
  sock.on('message', (_m, r) => {
    const a = sock.address();
    sock.send(peerOf(r.address, r.port, { localAddress: a.address, localPort: a.port }), r.port, r.address);
  });
  sock.bind(Number(port), bind, ready);
}`;

/** Writes the peer line on connect, then echoes everything back on the same connection. */
const ECHO_SERVER = `${PEER_FN}
const [port, bind, reportLocal] = process.argv.slice(1);
require('net').createServer((s) => {
  s.on('error', () => {});
  s.setNoDelay(true);
  s.write(peerOf(s.remoteAddress, s.remotePort, s));
  s.pipe(s);
}).listen({ port: Number(port), host: bind }, () => process.stdout.write('listening\\n'));`;

/** Counts the bytes of each connection and, when the client half-closes, answers with {bytes, ms}. */
const SINK_SERVER = `
const [port, bind] = process.argv.slice(1);
require('net').createServer((s) => {
  const start = process.hrtime.bigint();
  let bytes = 0;
  s.on('error', () => {});
  s.on('data', (d) => { bytes += d.length; });
  s.on('end', () => {
    const ms = Number(process.hrtime.bigint() - start) / 1e6;
    s.end(JSON.stringify({ bytes, ms }) + '\\n');
  });
}).listen({ port: Number(port), host: bind }, () => process.stdout.write('listening\\n'));`;

/**
 * Exit status of REQUEST_CLIENT when the network did not answer (refused, reset, unreachable, no
 * answer in time): the outcome a "blocked" check expects. Any other failure is the client's own.
 */
const BLOCKED_EXIT = 3;

/**
 * Sends one request (TCP connect / UDP datagram, resent until answered) and prints the first
 * answer line. What the network did (no answer, a refusal, a reset, unreachable) exits with
 * BLOCKED_EXIT; anything else (a bad argument, a local address it cannot bind) is a broken
 * client and exits 1, like a client that could not start at all.
 */
const REQUEST_CLIENT = `
const [proto, host, port, timeoutMs, localAddress, localPort] = process.argv.slice(1);
const NETWORK = new Set(['ECONNREFUSED', 'ECONNRESET', 'EHOSTUNREACH', 'ENETUNREACH', 'ETIMEDOUT', 'EPIPE']);
const blocked = (m) => { process.stderr.write('blocked: ' + m + '\\n'); process.exit(${BLOCKED_EXIT}); };
const fail = (e) => (NETWORK.has(e.code) ? blocked(e.code) : (process.stderr.write(String(e.code || e.message) + '\\n'), process.exit(1)));
setTimeout(() => blocked('timeout'), Number(timeoutMs));
const done = (line) => { process.stdout.write(line + '\\n'); process.exit(0); };
const local = { address: localAddress || undefined, port: localPort ? Number(localPort) : undefined };
if (proto === 'tcp') {
  const s = require('net').connect({ host, port: Number(port), localAddress: local.address, localPort: local.port });
  let buf = '';
  s.setEncoding('utf8');
  s.on('data', (d) => { buf += d; const i = buf.indexOf('\\n'); if (i >= 0) done(buf.slice(0, i)); });
  s.on('error', fail);
  s.on('end', () => blocked('closed without an answer: ' + JSON.stringify(buf)));
} else {
  const sock = require('dgram').createSocket(host.includes(':') ? 'udp6' : 'udp4');
  sock.on('message', (m) => done(String(m).split('\\n')[0]));
  sock.on('error', fail);
  // Datagrams may be lost while rules change; resend from the same socket (same conntrack entry).
  const send = () => sock.send('hello\\n', Number(port), host);
  sock.bind({ address: local.address, port: local.port || 0 }, () => { send(); setInterval(send, 250); });
}`;

/** One long-lived TCP connection: stdin lines go out, every received line is printed. */
const LONG_FLOW_CLIENT = `
const [host, port, localAddress] = process.argv.slice(1);
const s = require('net').connect({ host, port: Number(port), localAddress: localAddress || undefined });
s.setNoDelay(true);
s.setEncoding('utf8');
s.pipe(process.stdout);
s.on('error', (e) => { process.stderr.write(String(e.code || e.message) + '\\n'); process.exit(1); });
s.on('close', () => process.exit(2));
process.stdin.on('data', (d) => s.write(d));`;

/** Writes N bytes as fast as TCP allows, half-closes, prints the sink's report. */
const BULK_CLIENT = `
const [host, port, total, timeoutMs] = process.argv.slice(1);
const fail = (m) => { process.stderr.write(String(m) + '\\n'); process.exit(1); };
setTimeout(() => fail('timeout'), Number(timeoutMs));
const s = require('net').connect({ host, port: Number(port) });
const chunk = Buffer.alloc(64 * 1024, 120);
let left = Number(total);
const pump = () => {
  while (left > 0) {
    const n = Math.min(left, chunk.length);
    left -= n;
    if (!s.write(n === chunk.length ? chunk : chunk.subarray(0, n))) { s.once('drain', pump); return; }
  }
  s.end();
};
let answer = '';
s.setEncoding('utf8');
s.on('connect', pump);
s.on('data', (d) => { answer += d; });
s.on('end', () => { process.stdout.write(answer); process.exit(0); });
s.on('error', (e) => fail(e.code || e.message));`;

// ---------------------------------------------------------------------------------
// Plumbing
// ---------------------------------------------------------------------------------

function nodeScript(script: string, args: readonly (string | number)[]): string[] {
  return [process.execPath, '-e', script, '--', ...args.map(String)];
}

/** Resolves when `child` has exited (immediately if it already has). */
function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => child.once('exit', () => resolve()));
}

/** The child's stdout as lines; read once per child (several readers would each consume it). */
function stdoutLines(child: ChildProcess): Interface {
  return createInterface({ input: child.stdout! });
}

/** Resolves with the first line matching `pred`; rejects with the stderr if the process exits first. */
function firstLine(child: ChildProcess, lines: Interface, pred: (line: string) => boolean, what: string): Promise<string> {
  let stderr = '';
  child.stderr?.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  return new Promise((resolve, reject) => {
    lines.on('line', (line) => {
      if (pred(line)) resolve(line);
    });
    child.once('exit', (code, signal) => reject(new Error(`${what} exited (${code ?? signal}) before it was ready: ${stderr.trim()}`)));
  });
}

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

function startNodeServer(topo: Topology, ns: NsRef, what: string, script: string, args: readonly (string | number)[]): ServerHandle {
  const child = topo.spawn(ns, nodeScript(script, args));
  const listening = firstLine(child, stdoutLines(child), (l) => l === 'listening', what);
  const ready = withTimeout(listening, 15_000, `${what} to listen`).then(() => undefined);
  // A server that dies before anyone awaits `ready` must not be an unhandled rejection.
  ready.catch(() => undefined);
  return {
    ready,
    stop: async () => {
      child.kill('SIGKILL');
      await exited(child);
    },
  };
}

// ---------------------------------------------------------------------------------
// Servers
// ---------------------------------------------------------------------------------

export interface ServerOptions {
  /**
   * Append ` local=<ip>:<port>` to the answer line: the server's own address of that TCP
   * connection (UDP: the address the socket is bound to). Tells which of several DNAT backends
   * answered (parseLocal()); parsePeer() reads such lines too.
   */
  readonly reportLocal?: boolean;
}

/** A server answering each TCP connection / UDP datagram with `peer=<ip>:<port>` as it saw the client. */
export function startServer(topo: Topology, ns: NsRef, proto: Proto, port: number, bind = '0.0.0.0', opts: ServerOptions = {}): ServerHandle {
  return startNodeServer(topo, ns, `${proto} server on ${bind}:${port}`, PEER_SERVER, [proto, port, bind, opts.reportLocal ? '1' : '']);
}

/** A TCP server that writes `peer=<ip>:<port>` on connect and then echoes every line back. */
export function startEchoServer(topo: Topology, ns: NsRef, port: number, bind = '0.0.0.0', opts: ServerOptions = {}): ServerHandle {
  return startNodeServer(topo, ns, `echo server on ${bind}:${port}`, ECHO_SERVER, [port, bind, opts.reportLocal ? '1' : '']);
}

/** A TCP sink for bulkTransfer(): counts bytes and reports them with the elapsed time. */
export function startSinkServer(topo: Topology, ns: NsRef, port: number, bind = '0.0.0.0'): ServerHandle {
  return startNodeServer(topo, ns, `sink server on ${bind}:${port}`, SINK_SERVER, [port, bind]);
}

// ---------------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------------

export interface RequestOptions {
  /** How long the client waits for the answer (default 3000 ms). */
  readonly timeoutMs?: number;
  /** Source address to bind, e.g. ext's 172.20.0.100 "external host". */
  readonly localAddress?: string;
  /** Source port to bind (0 / unset: ephemeral). */
  readonly localPort?: number;
}

/** Slack for starting node inside the namespace, on top of the client's own timeout. */
const NODE_START_SLACK_MS = 10_000;

/** How one request ended: an answer, the network's refusal or silence, or a client that failed by itself. */
type RequestOutcome = { readonly answer: string } | { readonly blocked: string } | { readonly broken: string };

async function runRequest(topo: Topology, ns: NsRef, proto: Proto, host: string, port: number, opts: RequestOptions): Promise<RequestOutcome> {
  const timeoutMs = opts.timeoutMs ?? 3000;
  const args = [proto, host, port, timeoutMs, opts.localAddress ?? '', opts.localPort ?? ''];
  const r = await topo.exec(ns, nodeScript(REQUEST_CLIENT, args), {
    reject: false,
    timeoutMs: timeoutMs + NODE_START_SLACK_MS,
  });
  if (r.exitCode === 0 && r.stdout.trim() !== '') return { answer: r.stdout.trim() };
  if (r.exitCode === BLOCKED_EXIT && !r.timedOut) return { blocked: r.stderr.trim() };
  const why = r.timedOut ? 'the client outlived its own deadline and was killed' : `exit ${r.exitCode}`;
  return { broken: `${why}: ${r.stderr.trim().slice(0, 500)}` };
}

/**
 * One request to a startServer() server; returns its answer line (`peer=<ip>:<port>`).
 * Throws on timeout, refusal or any other failure.
 */
export async function request(topo: Topology, ns: NsRef, proto: Proto, host: string, port: number, opts: RequestOptions = {}): Promise<string> {
  const out = await runRequest(topo, ns, proto, host, port, opts);
  if ('answer' in out) return out.answer;
  throw new Error(`${proto} request from ${ns} to ${host}:${port} failed: ${'blocked' in out ? out.blocked : `client broken (${out.broken})`}`);
}

/**
 * request(), but null when the network refused or never answered: for asserting that traffic
 * does NOT pass. A client that failed by itself (did not start, could not bind, bad arguments)
 * proves nothing about the network and throws, failing the test.
 */
export async function tryRequest(topo: Topology, ns: NsRef, proto: Proto, host: string, port: number, opts: RequestOptions = {}): Promise<string | null> {
  const out = await runRequest(topo, ns, proto, host, port, opts);
  if ('answer' in out) return out.answer;
  if ('blocked' in out) return null;
  throw new Error(`${proto} request from ${ns} to ${host}:${port}: the client failed by itself, which says nothing about the network (${out.broken})`);
}

/** Split a `peer=<ip>:<port>` answer (v6 addresses contain colons: the port is after the last). */
export function parsePeer(line: string): { ip: string; port: number } {
  const m = /^peer=(\S+):(\d+)(?: local=\S+)?$/.exec(line.trim());
  if (!m) throw new Error(`not a peer line: ${JSON.stringify(line)}`);
  return { ip: m[1]!, port: Number(m[2]) };
}

/** The server's own address from an answer of a `reportLocal` server: which backend answered. */
export function parseLocal(line: string): { ip: string; port: number } {
  const m = / local=(\S+):(\d+)$/.exec(line.trim());
  if (!m) throw new Error(`no local address in: ${JSON.stringify(line)} (start the server with reportLocal)`);
  return { ip: m[1]!, port: Number(m[2]) };
}

/** One ICMP echo with a one-second deadline. */
export async function ping(topo: Topology, ns: NsRef, host: string): Promise<boolean> {
  const r = await topo.exec(ns, ['ping', '-c', '1', '-W', '1', host], { reject: false, timeoutMs: 10_000 });
  return r.exitCode === 0;
}

export interface LongFlow {
  /** `peer=<ip>:<port>` as the echo server saw this connection. */
  readonly peer: string;
  /** Send a line and wait for its echo through the same connection; false on timeout or a dead connection. */
  check(timeoutMs?: number): Promise<boolean>;
  close(): Promise<void>;
}

/**
 * Open one long-lived TCP connection to a startEchoServer() server. Resolves once the
 * server's peer line arrived, i.e. the connection is established end to end.
 */
export async function startLongFlow(
  topo: Topology,
  ns: NsRef,
  host: string,
  port: number,
  opts: { localAddress?: string; connectTimeoutMs?: number } = {},
): Promise<LongFlow> {
  const child = topo.spawn(ns, nodeScript(LONG_FLOW_CLIENT, [host, port, opts.localAddress ?? '']));
  const waiters = new Map<string, () => void>();
  const lines = stdoutLines(child);
  const peerLine = firstLine(child, lines, (l) => l.startsWith('peer='), `long flow to ${host}:${port}`);
  lines.on('line', (line) => {
    waiters.get(line)?.();
  });

  let peer: string;
  try {
    peer = await withTimeout(peerLine, opts.connectTimeoutMs ?? 5000, `long flow to ${host}:${port} to connect`);
  } catch (err) {
    child.kill('SIGKILL');
    throw err;
  }

  let seq = 0;
  const check = (timeoutMs = 3000): Promise<boolean> => {
    if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(false);
    // A unique token per check, so a late echo of an earlier check cannot pass for this one.
    const token = `check-${++seq}-${Date.now()}`;
    return new Promise<boolean>((resolve) => {
      const settle = (ok: boolean): void => {
        clearTimeout(timer);
        waiters.delete(token);
        child.off('exit', onExit);
        resolve(ok);
      };
      const onExit = (): void => settle(false);
      const timer = setTimeout(() => settle(false), timeoutMs);
      waiters.set(token, () => settle(true));
      child.once('exit', onExit);
      child.stdin?.write(`${token}\n`);
    });
  };

  return {
    peer,
    check,
    close: async () => {
      child.kill('SIGKILL');
      await exited(child);
    },
  };
}

/**
 * Number of conntrack entries in gw matching `filterArgs` (e.g. ['-p', 'tcp', '--dport', '80']).
 * conntrack prints entries on stdout and its summary on stderr; an empty result may exit 1.
 */
export async function conntrackCount(topo: Topology, filterArgs: readonly string[] = []): Promise<number> {
  const r = await topo.exec('gw', ['conntrack', '-L', ...filterArgs], { reject: false });
  const entries = r.stdout.split('\n').filter((l) => l.trim() !== '').length;
  if (r.exitCode !== 0 && entries === 0 && !/0 flow entries/.test(r.stderr)) {
    throw new Error(`conntrack -L ${filterArgs.join(' ')} failed (exit ${r.exitCode}): ${r.stderr.trim()}`);
  }
  return entries;
}

export interface TransferResult {
  /** Bytes the sink received. */
  readonly bytes: number;
  /** Time from the sink accepting the connection until the client's half-close arrived. */
  readonly elapsedMs: number;
  /** bytes * 8 / seconds, as measured at the sink. */
  readonly bitsPerSecond: number;
}

/**
 * Push `bytes` bytes over one TCP connection from `fromNs` to a startSinkServer() sink and
 * return the throughput the sink measured. Throws if it takes longer than `timeoutMs`.
 */
export async function bulkTransfer(
  topo: Topology,
  fromNs: NsRef,
  host: string,
  port: number,
  bytes: number,
  opts: { timeoutMs?: number } = {},
): Promise<TransferResult> {
  const timeoutMs = opts.timeoutMs ?? 30_000;
  const r = await topo.exec(fromNs, nodeScript(BULK_CLIENT, [host, port, bytes, timeoutMs]), {
    reject: false,
    timeoutMs: timeoutMs + NODE_START_SLACK_MS,
  });
  if (r.exitCode !== 0) {
    throw new Error(`bulk transfer from ${fromNs} to ${host}:${port} failed: ${r.stderr.trim() || `exit ${r.exitCode}`}`);
  }
  const report = JSON.parse(r.stdout.trim()) as { bytes: number; ms: number };
  // A sub-millisecond transfer would divide by ~0: clamp to keep the number finite.
  const seconds = Math.max(report.ms, 0.001) / 1000;
  return { bytes: report.bytes, elapsedMs: report.ms, bitsPerSecond: (report.bytes * 8) / seconds };
}

/**
 * Opens `count` short TCP connections to host:port, `parallel` at a time, each reading the
 * server's `peer=<ip>:<port>` line; prints {"sources": {ip: n}, "failures": n, "errors": [...]}.
 * Parameters come through argv only.
 */
const MANY_CLIENT = `
const net = require('net');
const [host, port, count, parallel, timeoutMs] = process.argv.slice(1).map((v, i) => (i === 0 ? v : Number(v)));
const sources = {};
let failures = 0;
const errors = [];
let next = 0;
const one = () => new Promise((resolve) => {
  let data = '';
  let done = false;
  const finish = (err) => {
    if (done) return;
    done = true;
    s.destroy();
    const m = /^peer=(\\S+):\\d+/.exec(data);
    if (err || !m) { failures++; if (errors.length < 5) errors.push(String(err || 'no answer: ' + JSON.stringify(data))); }
    else sources[m[1]] = (sources[m[1]] || 0) + 1;
    resolve();
  };
  const s = net.connect({ host, port });
  s.setTimeout(timeoutMs, () => finish(new Error('timeout')));
  s.on('data', (d) => (data += d));
  s.on('end', () => finish());
  s.on('error', (e) => finish(e));
});
const worker = async () => { while (next < count) { next++; await one(); } };
Promise.all(Array.from({ length: parallel }, worker)).then(() => {
  process.stdout.write(JSON.stringify({ sources, failures, errors }) + '\\n');
});`;

export interface ManyResult {
  /** Connections per source address the server saw. */
  readonly sources: Record<string, number>;
  readonly failures: number;
  /** The first few failures' reasons. */
  readonly errors: string[];
}

/** `count` short TCP connections from `ns` to host:port, `parallel` at a time (each one `request`'s peer line). */
export async function manyConnections(
  topo: Topology,
  ns: NsRef,
  host: string,
  port: number,
  count: number,
  parallel = 50,
  timeoutMs = 5000,
): Promise<ManyResult> {
  const r = await topo.exec(ns, [process.execPath, '-e', MANY_CLIENT, '--', host, String(port), String(count), String(parallel), String(timeoutMs)], {
    timeoutMs: 120_000,
  });
  return JSON.parse(r.stdout) as ManyResult;
}
