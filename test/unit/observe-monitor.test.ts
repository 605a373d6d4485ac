/**
 * ConntrackMonitor's bookkeeping: seeding from a listing, counting NEW/DESTROY per EIP and
 * kind, end lines for connections whose rule is gone, and restarting a dead event child. The
 * event child is a stand-in script (the real one is proven in test/netns/flow-log.test.ts).
 */
import { afterEach, describe, expect, it } from 'vitest';
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { ConntrackMonitor, EVENT_ARGS } from '../../src/observe/conntrackMonitor.js';
import { FlowLog, type FlowSink } from '../../src/observe/flowLog.js';
import type { ExecRequest, ExecResult, Executor } from '../../src/system/exec.js';
import { emptyState } from '../../src/state/state.js';
import { waitFor } from '../helpers/poll.js';

const EIP = '172.20.0.10';
const state = {
  ...emptyState('eth0', 'net1'),
  eips: [{ address: EIP, prefixLength: 24 }],
  snats: [{ eip: EIP, cidr: '10.0.1.0/24', randomFully: false }],
  dnats: [{ eip: EIP, port: 8080, protocol: 'tcp' as const, internalIp: '10.0.1.6', internalPort: 80 }],
};

const snatLine = (id: number, sport: number, event?: 'NEW' | 'DESTROY') =>
  `${event ? `[1796044351.5]\t[${event}] ` : ''}ipv4     2 tcp      6 120 SYN_SENT src=10.0.1.6 dst=172.20.0.100 sport=${sport} dport=7001 [UNREPLIED] src=172.20.0.100 dst=${EIP} sport=7001 dport=${sport} id=${id}`;
const dnatLine = (id: number, event: 'NEW' | 'DESTROY') =>
  `[1796044351.5]\t[${event}] ipv4     2 tcp      6 120 SYN_SENT src=172.20.0.100 dst=${EIP} sport=5000 dport=8080 src=10.0.1.6 dst=172.20.0.100 sport=80 dport=5000 id=${id}`;

const dirs: string[] = [];
const monitors: ConntrackMonitor[] = [];
afterEach(async () => {
  await Promise.all(monitors.splice(0).map((m) => m.stop()));
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/**
 * A stand-in conntrack: `-E` sleeps (or exits at once with `dies`, or reports ENOBUFS five
 * times with `overruns`, or prints `lines` then sleeps); `-L` answers from the fake executor.
 */
function fakeTool(dies = false, overruns = false, lines?: string): string {
  const d = mkdtempSync(join(tmpdir(), 'natgw-ct-'));
  dirs.push(d);
  const p = join(d, 'conntrack');
  if (lines !== undefined) writeFileSync(join(d, 'events'), lines);
  const script = dies
    ? 'exit 1\n'
    : overruns
      ? `for i in 1 2 3 4 5; do echo "WARNING: We have hit ENOBUFS! We are losing events." >&2; sleep 0.05; done\ntouch '${join(d, 'overran')}'\nexec sleep 600\n`
      : lines !== undefined
        ? `cat '${join(d, 'events')}'\nexec sleep 600\n`
        : 'exec sleep 600\n';
  writeFileSync(p, `#!/bin/sh\n${script}`);
  chmodSync(p, 0o755);
  return p;
}

function listing(lines: string[]): Executor & { calls: ExecRequest[] } {
  const calls: ExecRequest[] = [];
  return {
    calls,
    run: async (req): Promise<ExecResult> => {
      calls.push(req);
      const v4 = req.args.includes('ipv4');
      return { command: req.file, exitCode: 0, stdout: v4 ? lines.join('\n') : '', stderr: '', timedOut: false, failedToStart: false };
    },
  };
}

function setup(seed: string[], opts: { dies?: boolean; overruns?: boolean; lines?: string; reseedMinIntervalMs?: number; rate?: number } = {}) {
  const written: string[] = [];
  const sink: FlowSink = { write: (l) => (written.push(l), true), close: async () => undefined };
  const restarts: number[] = [];
  const overruns: number[] = [];
  const exec = listing(seed);
  const m = new ConntrackMonitor({
    exec,
    log: pino({ level: 'silent' }),
    flowLog: new FlowLog({ sink, ratePerS: opts.rate ?? 1000, burst: opts.rate ?? 1000 }),
    tool: fakeTool(opts.dies, opts.overruns, opts.lines),
    onRestart: () => restarts.push(1),
    onOverrun: () => overruns.push(1),
    ...(opts.reseedMinIntervalMs !== undefined ? { reseedMinIntervalMs: opts.reseedMinIntervalMs } : {}),
  });
  monitors.push(m);
  m.setState(state);
  return { m, written, restarts, overruns, exec };
}

const count = (m: ConntrackMonitor, kind: string) => m.connections().find((c) => c.eip === EIP && c.kind === kind)?.n ?? 0;

describe('ConntrackMonitor', () => {
  it('seeds the counts from the table, then follows NEW and DESTROY', async () => {
    const { m, written } = setup([snatLine(1, 40001), snatLine(2, 40002)]);
    m.start();
    await waitFor(async () => count(m, 'snat') === 2, { what: 'two seeded SNAT connections' });
    // The listing seeds the SNAT ports in use toward each destination too.
    expect(m.portUsage({ top: 1 }).map((u) => [u.eip, u.top])).toEqual([
      [EIP, [{ ip: '172.20.0.100', port: 7001, protocol: 'tcp', ports: 2, share: 2 / 64512 }]],
    ]);
    m.onLine(dnatLine(3, 'NEW'));
    m.onLine(snatLine(1, 40001, 'DESTROY'));
    expect(count(m, 'snat')).toBe(1);
    expect(m.portUsage()[0]?.maxPorts).toBe(1);
    expect(count(m, 'dnat')).toBe(1);
    // A duplicate NEW (listed and seen as an event) counts once.
    m.onLine(dnatLine(3, 'NEW'));
    expect(count(m, 'dnat')).toBe(1);
    expect(written.map((l) => JSON.parse(l).event)).toEqual(['start', 'end', 'start']);
  });

  it('ends a connection with the class it started with, after its rule is gone', async () => {
    const { m, written } = setup([]);
    m.onLine(dnatLine(7, 'NEW'));
    m.setState(emptyState('eth0', 'net1'));
    m.onLine(dnatLine(7, 'DESTROY'));
    expect(count(m, 'dnat')).toBe(0);
    expect(written.map((l) => [JSON.parse(l).event, JSON.parse(l).kind])).toEqual([
      ['start', 'dnat'],
      ['end', 'dnat'],
    ]);
    // Unknown and untranslated entries write nothing.
    m.onLine('[1.0]\t[NEW] ipv4 2 tcp 6 120 SYN_SENT src=10.0.1.6 dst=10.0.2.5 sport=1 dport=2 src=10.0.2.5 dst=10.0.1.6 sport=2 dport=1 id=9');
    expect(written).toHaveLength(2);
  });

  it('restarts a child that dies, with backoff, and reads the table again each time', async () => {
    const { m, restarts, exec } = setup([snatLine(1, 40001)], { dies: true, reseedMinIntervalMs: 0 });
    m.start();
    await waitFor(async () => restarts.length >= 2, { what: 'two restarts', timeoutMs: 5000 });
    await m.stop();
    const listings = exec.calls.filter((c) => c.args.includes('-L') && c.args.includes('ipv4')).length;
    expect(listings).toBeGreaterThanOrEqual(2);
    expect(count(m, 'snat')).toBe(1);
    expect(m.up).toBe(false);
  });

  it('re-reads the table at most once per interval, however often events are lost or the child dies', async () => {
    const dying = setup([snatLine(1, 40001)], { dies: true, reseedMinIntervalMs: 3_600_000 });
    dying.m.start();
    await waitFor(async () => dying.restarts.length >= 3, { what: 'three restarts', timeoutMs: 10_000 });
    const overrun = setup([snatLine(1, 40001)], { overruns: true, reseedMinIntervalMs: 3_600_000 });
    overrun.m.start();
    await waitFor(async () => overrun.m.up && count(overrun.m, 'snat') === 1, { what: 'the first listing' });
    // Five ENOBUFS reports, 50 ms apart, while the child runs; then it marks that it is done.
    await waitFor(async () => existsSync(join(dirs.at(-1)!, 'overran')), { what: 'five ENOBUFS reports' });
    expect(overrun.overruns).toHaveLength(5);
    for (const { exec } of [dying, overrun]) {
      expect(exec.calls.filter((c) => c.args.includes('-L') && c.args.includes('ipv4'))).toHaveLength(1);
    }
  });

  it('lists and follows translated entries only (--any-nat, as the last argument)', async () => {
    const { m, exec } = setup([]);
    m.start();
    await waitFor(async () => exec.calls.length === 2, { what: 'the listing of both families' });
    expect(exec.calls.map((c) => c.args)).toEqual([
      ['-L', '-f', 'ipv4', '-o', 'extended,id', '--any-nat'],
      ['-L', '-f', 'ipv6', '-o', 'extended,id', '--any-nat'],
    ]);
    expect(EVENT_ARGS.at(-1)).toBe('--any-nat');
  });

  it('handles a burst of event lines in bounded turns, all of them, in order', async () => {
    const N = 5000;
    const lines: string[] = [];
    for (let i = 0; i < N; i++) lines.push(snatLine(100 + i, 10000 + i, 'NEW'));
    for (let i = 0; i < N; i += 2) lines.push(snatLine(100 + i, 10000 + i, 'DESTROY'));
    const { m, written } = setup([], { lines: `${lines.join('\n')}\n`, rate: 1_000_000 });
    // The most lines handled between two turns of the event loop: a follower that handled what
    // the pipe delivered at once would take a whole 64 KiB read (over 300 of these lines) in one.
    let most = 0;
    let last = 0;
    let ticking = true;
    const tick = (): void => {
      most = Math.max(most, written.length - last);
      last = written.length;
      if (ticking) setImmediate(tick);
    };
    setImmediate(tick);
    m.start();
    await waitFor(async () => count(m, 'snat') === N / 2 && written.length === N + N / 2, { what: 'every line handled' });
    ticking = false;
    expect(most).toBeGreaterThan(0);
    expect(most).toBeLessThanOrEqual(256);
    expect(written.slice(0, 3).map((l) => JSON.parse(l).original.sport)).toEqual([10000, 10001, 10002]);
    expect(JSON.parse(written.at(-1)!).event).toBe('end');
  });
});
