/**
 * Children never outlive the daemon (issue 28): after a SIGKILL (what an OOM kill does) the
 * daemon's conntrack event follower and link monitor must go with it. Killed and restarted ten
 * times, the namespace holds exactly the live daemon's `conntrack -E` and `ip monitor`, no more.
 * Independent of the backend: run once.
 */
import { readFileSync, readdirSync, readlinkSync, statSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { waitFor } from '../helpers/poll.js';
import { startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

interface Proc {
  readonly pid: number;
  readonly ppid: number;
  readonly argv: string[];
}

/** Every process in network namespace `ns` (by the namespace's inode). */
function processesIn(ns: string): Proc[] {
  const ino = statSync(`/run/netns/${ns}`).ino;
  const out: Proc[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      if (readlinkSync(`/proc/${d}/ns/net`) !== `net:[${ino}]`) continue;
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const [state, ppid] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      // A zombie has gone already (its parent has not reaped it yet).
      if (state === 'Z') continue;
      out.push({ pid: Number(d), ppid: Number(ppid), argv: readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0').filter(Boolean) });
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

const isFollower = (p: Proc) => p.argv[0]?.endsWith('conntrack') === true && p.argv.includes('-E');
const isMonitor = (p: Proc) => p.argv[0]?.endsWith('ip') === true && p.argv.includes('monitor');

describe('daemon children after SIGKILL', () => {
  let topo: Topology;
  let daemon: Daemon | undefined;

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, { GATEWAY_V4: ADDR.extGateway, NATGW_CONNTRACK_METRICS: 'true', NATGW_RESYNC_PERIOD: '1h' });
    await topo.natgwOk('init');
    await topo.natgwOk('eip-add', '172.20.0.10/24');
  }, 60_000);
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
  }, 60_000);

  /** Start the daemon and wait until both of its followers run. */
  async function start(): Promise<Daemon> {
    const d = await startDaemon(topo);
    await waitReady(topo, d);
    await waitFor(
      async () => {
        const mine = processesIn(topo.ns.gw).filter((p) => p.ppid === d.pid);
        return mine.some(isFollower) && mine.some(isMonitor);
      },
      { what: "the daemon's conntrack -E and ip monitor", timeoutMs: 15_000 },
    );
    return d;
  }

  it('ten kill -9 and restarts leave only the live daemon’s conntrack -E and ip monitor', async () => {
    for (let i = 0; i < 10; i++) {
      const d = await start();
      expect(await stopDaemon(d, 'SIGKILL')).toBe(137);
    }
    daemon = await start();
    const live = daemon.pid;
    // A child killed with its parent is gone at once; poll only for the kernel to finish the kills.
    await waitFor(async () => processesIn(topo.ns.gw).filter((p) => isFollower(p) || isMonitor(p)).length <= 2, {
      what: 'the dead daemons’ children to be gone',
      timeoutMs: 5000,
    }).catch(() => undefined);
    const left = processesIn(topo.ns.gw).filter((p) => isFollower(p) || isMonitor(p));
    const shown = left.map((p) => `${p.pid} (parent ${p.ppid}): ${p.argv.join(' ')}`).join('\n');
    expect(
      left.filter(isFollower).map((p) => p.ppid),
      shown,
    ).toEqual([live]);
    expect(
      left.filter(isMonitor).map((p) => p.ppid),
      shown,
    ).toEqual([live]);
  }, 240_000);
});
