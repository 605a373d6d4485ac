/**
 * Many flows from one process per namespace (hundreds of `node` processes would load the two
 * cores more than the gateways do): short TCP connections with a concurrency, and long-lived
 * TCP and UDP flows that send a line every interval and record the gaps between answers.
 * Parameters reach the scripts through argv only.
 */
import type { ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';

interface Runner {
  exec(
    ns: string,
    argv: readonly string[],
    opts?: { reject?: boolean; timeoutMs?: number },
  ): Promise<{ exitCode: number | null; stdout: string; stderr: string }>;
  spawn(ns: string, argv: readonly string[]): ChildProcess;
}

/** Opens `count` TCP connections to a startServer() server, `concurrency` at a time; each reads the peer line and closes. */
const SHORT_FLOWS = `
const [host, port, count, concurrency, timeoutMs] = process.argv.slice(1).map((v, i) => (i === 0 ? v : Number(v)));
const net = require('net');
const out = { ok: 0, failed: 0, errors: {}, ports: [], ms: [] };
let next = 0;
const one = () => new Promise((resolve) => {
  const t0 = Date.now();
  const s = net.connect({ host, port });
  let buf = '';
  const done = (err) => {
    clearTimeout(timer);
    s.destroy();
    if (err) { out.failed++; out.errors[err] = (out.errors[err] || 0) + 1; }
    else { out.ok++; out.ms.push(Date.now() - t0); const m = /:(\\d+)/.exec(buf.split('=')[1] || ''); if (m) out.ports.push(Number(m[1])); }
    resolve();
  };
  const timer = setTimeout(() => done('timeout'), timeoutMs);
  s.on('data', (d) => { buf += d; if (buf.includes('\\n')) done(null); });
  s.on('error', (e) => done(e.code || 'error'));
  s.on('end', () => { if (!buf.includes('\\n')) done('closed'); });
});
const worker = async () => { while (next < count) { next++; await one(); } };
Promise.all(Array.from({ length: concurrency }, worker)).then(() => process.stdout.write(JSON.stringify(out) + '\\n'));`;

export interface ShortFlows {
  readonly ok: number;
  readonly failed: number;
  readonly errors: Record<string, number>;
  /** The translated source ports the server saw. */
  readonly ports: number[];
  /** Each successful flow's duration. */
  readonly ms: number[];
}

/** TCP: `count` connections (SHORT_FLOWS); UDP: `count` requests, one answer each, each from a new source port (SHORT_UDP). */
export async function shortFlows(
  topo: Runner,
  ns: string,
  host: string,
  port: number,
  count: number,
  concurrency: number,
  timeoutMs: number,
  proto: 'tcp' | 'udp' = 'tcp',
): Promise<ShortFlows> {
  const r = await topo.exec(
    ns,
    [process.execPath, '-e', proto === 'tcp' ? SHORT_FLOWS : SHORT_UDP, '--', host, String(port), String(count), String(concurrency), String(timeoutMs)],
    {
      timeoutMs: Math.ceil(count / concurrency) * timeoutMs + 30_000,
    },
  );
  return JSON.parse(r.stdout.trim().split('\n').pop() ?? '{}') as ShortFlows;
}

/** Sends `count` UDP requests to a startServer('udp') server, each from a new socket, `concurrency` at a time; each waits for one answer. */
const SHORT_UDP = `
const [host, port, count, concurrency, timeoutMs] = process.argv.slice(1).map((v, i) => (i === 0 ? v : Number(v)));
const dgram = require('dgram');
const out = { ok: 0, failed: 0, errors: {}, ports: [], ms: [] };
let next = 0;
const one = () => new Promise((resolve) => {
  const t0 = Date.now();
  const s = dgram.createSocket('udp4');
  const done = (err, line) => {
    clearTimeout(timer);
    s.close();
    if (err) { out.failed++; out.errors[err] = (out.errors[err] || 0) + 1; }
    else { out.ok++; out.ms.push(Date.now() - t0); const m = /:(\\d+)/.exec(line.split('=')[1] || ''); if (m) out.ports.push(Number(m[1])); }
    resolve();
  };
  const timer = setTimeout(() => done('timeout'), timeoutMs);
  s.on('message', (m) => done(null, String(m)));
  s.on('error', (e) => done(e.code || 'error'));
  s.send('x', port, host);
});
const worker = async () => { while (next < count) { next++; await one(); } };
Promise.all(Array.from({ length: concurrency }, worker)).then(() => process.stdout.write(JSON.stringify(out) + '\\n'));`;

/**
 * Long-lived flows: TCP to a startEchoServer() server (a line every interval, echoed), UDP to a
 * startServer('udp') server (a datagram every interval, answered with the peer it saw). Commands
 * on stdin: `report` prints every flow's record; `reset` starts the gap records afresh.
 */
const LONG_FLOWS = `
const [specJson, interval, localAddress] = process.argv.slice(1);
const specs = JSON.parse(specJson);
const net = require('net');
const dgram = require('dgram');
const flows = [];
const now = () => Date.now();
for (const s of specs) {
  for (let k = 0; k < s.count; k++) {
    const f = { id: s.name + '-' + k, proto: s.proto, answers: 0, last: 0, maxGap: 0, peers: new Set(), up: false, error: null };
    flows.push(f);
    const seen = (line) => {
      const t = now();
      if (line.startsWith('peer=')) f.peers.add(line.slice(5));
      if (f.last) f.maxGap = Math.max(f.maxGap, t - f.last);
      f.last = t; f.answers++; f.up = true;
    };
    if (s.proto === 'tcp') {
      const c = net.connect({ host: s.host, port: s.port, ...(localAddress ? { localAddress } : {}) });
      c.setNoDelay(true);
      let buf = '';
      c.on('data', (d) => { buf += d; let i; while ((i = buf.indexOf('\\n')) >= 0) { seen(buf.slice(0, i)); buf = buf.slice(i + 1); } });
      c.on('error', (e) => { f.error = e.code || String(e); });
      c.on('close', () => { f.error = f.error || 'closed'; });
      setInterval(() => { if (!f.error && c.writable) c.write('x\\n'); }, Number(interval));
    } else {
      const u = dgram.createSocket('udp4');
      u.on('message', (m) => seen(String(m).trim()));
      u.on('error', (e) => { f.error = e.code || String(e); });
      u.bind(0, () => setInterval(() => u.send('x', s.port, s.host), Number(interval)));
    }
  }
}
require('readline').createInterface({ input: process.stdin }).on('line', (cmd) => {
  const t = now();
  if (cmd === 'reset') { for (const f of flows) f.maxGap = 0; process.stdout.write('reset\\n'); return; }
  const rep = flows.map((f) => ({ id: f.id, proto: f.proto, answers: f.answers, up: f.up, maxGapMs: Math.max(f.maxGap, f.last ? t - f.last : 0), sinceLastMs: f.last ? t - f.last : null, peers: [...f.peers], error: f.error }));
  process.stdout.write(JSON.stringify(rep) + '\\n');
});
process.stdout.write('started\\n');`;

export interface FlowSpec {
  readonly name: string;
  readonly proto: 'tcp' | 'udp';
  readonly host: string;
  readonly port: number;
  readonly count: number;
}

export interface FlowRecord {
  readonly id: string;
  readonly proto: 'tcp' | 'udp';
  readonly answers: number;
  readonly up: boolean;
  /** The longest time between two answers since the last reset (or since the last answer, if longer). */
  readonly maxGapMs: number;
  readonly sinceLastMs: number | null;
  /** Peer lines seen (TCP: the first line; UDP: every answer): the translated address and port. */
  readonly peers: string[];
  readonly error: string | null;
}

export interface LongFlows {
  report(): Promise<FlowRecord[]>;
  reset(): Promise<void>;
  stop(): void;
}

export async function startLongFlows(topo: Runner, ns: string, specs: readonly FlowSpec[], intervalMs: number, localAddress = ''): Promise<LongFlows> {
  const child = topo.spawn(ns, [process.execPath, '-e', LONG_FLOWS, '--', JSON.stringify(specs), String(intervalMs), localAddress]);
  const lines = createInterface({ input: child.stdout! });
  const waiting: Array<(l: string) => void> = [];
  lines.on('line', (l) => waiting.shift()?.(l));
  const nextLine = (what: string) =>
    new Promise<string>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`long flows in ${ns}: no ${what}`)), 15_000);
      waiting.push((l) => {
        clearTimeout(t);
        resolve(l);
      });
    });
  await nextLine('start');
  return {
    report: async () => {
      const l = nextLine('report');
      child.stdin!.write('report\n');
      return JSON.parse(await l) as FlowRecord[];
    },
    reset: async () => {
      const l = nextLine('reset');
      child.stdin!.write('reset\n');
      await l;
    },
    stop: () => child.kill('SIGKILL'),
  };
}

/** p-th percentile (0..100) of a list of numbers. */
export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] as number;
}
