/**
 * The cost of SNAT port accounting in the conntrack follower at 100,000 connections: heap and
 * time per event, against a floor measured in the same run (the same number of DNAT connections,
 * which the follower counts but keeps no destination for), and the scrape's pass over the
 * destinations. No kernel: the follower's line handler is fed conntrack event lines.
 *
 *   node --expose-gc dist/bench/snatPorts.js [connections]
 */
import pino from 'pino';
import { ConntrackMonitor } from '../src/observe/conntrackMonitor.js';
import { emptyState } from '../src/state/state.js';
import type { Executor } from '../src/system/exec.js';

const N = Number(process.argv[2] ?? 100_000);
const EIP = '172.20.0.10';
const state = {
  ...emptyState('eth0', 'net1'),
  eips: [{ address: EIP, prefixLength: 24 }],
  snats: [{ eip: EIP, cidr: '10.0.0.0/8', randomFully: false }],
  dnats: [{ eip: EIP, port: 8080, protocol: 'tcp' as const, internalIp: '10.0.1.6', internalPort: 80 }],
};
const exec: Executor = { run: async (r) => ({ command: r.file, exitCode: 0, stdout: '', stderr: '', timedOut: false, failedToStart: false }) };

const host = (i: number) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
/** Connection i: a SNAT toward one of `dests` destinations, or a DNAT (the floor). */
function line(i: number, kind: 'snat' | 'dnat', dests: number): string {
  const sport = 1024 + (i % 60000);
  if (kind === 'dnat') {
    return `[1796044351.5]\t[NEW] ipv4     2 tcp      6 120 SYN_SENT src=${host(i)} dst=${EIP} sport=${sport} dport=8080 src=10.0.1.6 dst=${host(i)} sport=80 dport=${sport} id=${i + 1}`;
  }
  const d = `172.${16 + ((i % dests) >> 16)}.${((i % dests) >> 8) & 255}.${(i % dests) & 255}`;
  return `[1796044351.5]\t[NEW] ipv4     2 tcp      6 120 SYN_SENT src=${host(i)} dst=${d} sport=${sport} dport=443 src=${d} dst=${EIP} sport=443 dport=${20000 + (i % 40000)} id=${i + 1}`;
}

const gc = (globalThis as { gc?: () => void }).gc;
const heap = (): number => {
  gc?.();
  gc?.();
  return process.memoryUsage().heapUsed;
};

function run(kind: 'snat' | 'dnat', dests: number): { heapMiB: number; usPerEvent: number; scrapeMs: number; statusMs: number } {
  const lines = Array.from({ length: N }, (_, i) => line(i, kind, dests));
  let m: ConntrackMonitor | undefined = new ConntrackMonitor({ exec, log: pino({ level: 'silent' }) });
  m.setState(state);
  const t0 = performance.now();
  for (const l of lines) m.onLine(l);
  const t1 = performance.now();
  const s0 = performance.now();
  m.portUsage();
  const s1 = performance.now();
  m.portUsage({ top: 5 });
  const s2 = performance.now();
  const n = m.connections().reduce((a, c) => a + c.n, 0);
  if (n !== N || lines.length !== N) throw new Error(`counted ${n} connections of ${N}`);
  // What the follower retains: the heap with it, less the heap once it is dropped (the lines stay).
  const filled = heap();
  m = undefined;
  const retained = filled - heap();
  if (lines.length !== N) throw new Error('unreachable');
  return { heapMiB: retained / 2 ** 20, usPerEvent: ((t1 - t0) * 1000) / N, scrapeMs: s1 - s0, statusMs: s2 - s1 };
}

if (!gc) process.stderr.write('run with node --expose-gc for heap figures\n');
// A warm-up round, so that the first case measured does not pay for compilation.
run('snat', 100);
const floor = run('dnat', 1);
const rows: [string, ReturnType<typeof run>][] = [
  ['DNAT (floor)', floor],
  ['SNAT, 100 destinations', run('snat', 100)],
  ['SNAT, 10,000 destinations', run('snat', 10_000)],
  ['SNAT, every connection its own destination', run('snat', N)],
];
console.log(`${N} connections in the follower`);
console.log('case | heap MiB (× floor) | µs per NEW event (× floor) | scrape pass ms | status top-5 ms');
for (const [name, r] of rows) {
  console.log(
    `${name} | ${r.heapMiB.toFixed(1)} (${(r.heapMiB / floor.heapMiB).toFixed(2)}) | ${r.usPerEvent.toFixed(2)} (${(r.usPerEvent / floor.usPerEvent).toFixed(2)}) | ${r.scrapeMs.toFixed(2)} | ${r.statusMs.toFixed(2)}`,
  );
}
