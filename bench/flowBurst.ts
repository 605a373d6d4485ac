/**
 * `node dist/bench/flowBurst.js [nftables|iptables] [seconds] [on|off|both]`: what a burst of new connections
 * costs the gateway's own commands while flow logs are on. The daemon writes a flow-log file
 * with a small rate limit (so the burst is mostly dropped and counted); one VPC host sends UDP
 * from a new source port as fast as it can (every datagram a new SNAT conntrack entry, so a
 * NEW and later a DESTROY event). The same series of API changes runs quiet and during the
 * burst, beside the kernel's floor measured the same way as `npm run bench` does. Printed,
 * never asserted (issue 9: the latency during a burst, as a benchmark figure). With `off`, the
 * same burst with flow logs and the event follower off: the part of the cost that is the
 * burst's own load on the machine, not natgw's following of it; with `both`, off then on in one
 * run and their ratio.
 */
import { performance } from 'node:perf_hooks';
import { join } from 'node:path';
import { api } from '../test/netns/daemon-util.js';
import { waitFor } from '../test/helpers/poll.js';
import { ADDR } from '../test/helpers/netns.js';
import { Gateway, type BackendName } from './gateway.js';
import { hasNc, measureFloors } from './floors.js';

const EIP = '172.20.0.10';
const SERIES = 40;

function metric(text: string, name: string, labels = ''): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels ? `{${labels}` : ' '}`) || l.startsWith(`${name}{${labels}`));
  return line ? Number(line.split(' ').at(-1)) : 0;
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? Number.NaN;
};

/** Alternate PUT and DELETE of one DNAT through the API; milliseconds per change. */
async function series(gw: Gateway, base: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < SERIES; i++) {
    const path = `/v1/dnats/${EIP},${base + (i >> 1)},tcp`;
    const t = performance.now();
    const r = i % 2 === 0 ? await api(gw.socket, 'PUT', path, { internalIp: ADDR.vpc1, internalPort: 80 }) : await api(gw.socket, 'DELETE', path);
    out.push(performance.now() - t);
    if (r.status >= 300) throw new Error(`${path}: HTTP ${r.status} ${r.text}`);
  }
  return out;
}

// The burst: a UDP datagram from a fresh socket (a new source port) each time, as fast as the loop goes.
const BURST = `
const dgram = require('node:dgram');
const until = Date.now() + Number(process.argv[1]) * 1000;
let sent = 0;
(function next() {
  if (Date.now() > until) { console.log(sent); return; }
  const s = dgram.createSocket('udp4');
  s.send('x', 7002, '${ADDR.extHost}', () => { s.close(); sent++; setImmediate(next); });
})();
`;

interface Figures {
  readonly text: string;
  /** Median API change latency quiet and during the burst, ms. */
  readonly quiet: number;
  readonly during: number;
}

async function figures(backend: BackendName, seconds: number, following: boolean): Promise<Figures> {
  const gw = await Gateway.bare({ backend, resync: '1h' });
  try {
    Object.assign(
      gw.topo.env,
      following
        ? { NATGW_FLOW_LOG: 'file', NATGW_FLOW_LOG_FILE: join(gw.topo.stateDir, 'flows.log'), NATGW_FLOW_LOG_RATE: '50', NATGW_FLOW_LOG_BURST: '100' }
        : { NATGW_FLOW_LOG: 'off', NATGW_CONNTRACK_METRICS: 'false' },
    );
    await gw.startDaemon();
    const doc = {
      initialized: true,
      interfaces: { vpc: 'eth0', ext: 'net1' },
      eips: [{ address: EIP, prefixLength: 24 }],
      snats: [{ eip: EIP, cidr: ADDR.vpcCidr }],
      dnats: [],
      fips: [],
    };
    await gw.putState(doc);
    if (following) {
      await waitFor(async () => metric((await api(gw.socket, 'GET', '/metrics')).text, 'natgw_conntrack_events_up') === 1, {
        what: 'the conntrack event follower to run',
      });
    }
    const floors = await measureFloors(gw, await gw.backendInfo(), 10, 15, await hasNc(gw));
    const quiet = await series(gw, 20000);

    const child = gw.topo.spawn('vpc1', [process.execPath, '-e', BURST, String(seconds)]);
    let sent = '';
    child.stdout?.on('data', (d: Buffer) => {
      sent += d.toString();
    });
    const done = new Promise<void>((resolve) => child.on('close', () => resolve()));
    const before = (await api(gw.socket, 'GET', '/metrics')).text;
    const during: number[] = [];
    const deadline = performance.now() + seconds * 1000;
    let base = 21000;
    while (performance.now() < deadline - 2000) {
      during.push(...(await series(gw, base)));
      base += SERIES;
    }
    await done;
    const after = (await api(gw.socket, 'GET', '/metrics')).text;
    const starts = metric(after, 'natgw_flow_starts_total', `eip="${EIP}"`) - metric(before, 'natgw_flow_starts_total', `eip="${EIP}"`);
    const written = metric(after, 'natgw_flow_log_lines_total') - metric(before, 'natgw_flow_log_lines_total');
    const dropped = metric(after, 'natgw_flow_log_dropped_total', 'reason="rate"') - metric(before, 'natgw_flow_log_dropped_total', 'reason="rate"');
    const overruns = metric(after, 'natgw_conntrack_events_overruns_total') - metric(before, 'natgw_conntrack_events_overruns_total');
    const q = median(quiet);
    const b = median(during);
    const text = [
      `${backend}, flow logs ${following ? 'on' : 'off (and no event follower)'}: burst of ${Number(sent.trim()) || 0} UDP datagrams from new source ports in ${seconds} s (${starts} flow starts counted, ${written} lines written, ${dropped} dropped by the rate limit, ${overruns} event overruns)`,
      `  API change median: quiet ${q.toFixed(1)} ms, during the burst ${b.toFixed(1)} ms (×${(b / q).toFixed(2)}; ${during.length} changes); floor: ${floors.kernelWhat} ${floors.kernel.median.toFixed(1)} ms`,
    ].join('\n');
    return { text, quiet: q, during: b };
  } finally {
    await gw.cleanup();
  }
}

async function main(): Promise<void> {
  const backend = (process.argv[2] ?? 'nftables') as BackendName;
  const seconds = Number(process.argv[3] ?? 20);
  const mode = process.argv[4] ?? 'on';
  if (mode !== 'both') {
    console.log((await figures(backend, seconds, mode !== 'off')).text);
    return;
  }
  // Off and on in one run, one after the other, so both see the same machine load.
  const off = await figures(backend, seconds, false);
  console.log(off.text);
  const on = await figures(backend, seconds, true);
  console.log(on.text);
  const ratio = (f: Figures) => f.during / f.quiet;
  console.log(
    `  flow logs on vs off: during the burst ×${(on.during / off.during).toFixed(2)}; burst/quiet ratio ×${ratio(on).toFixed(2)} on vs ×${ratio(off).toFixed(2)} off (×${(ratio(on) / ratio(off)).toFixed(2)})`,
  );
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((e: unknown) => {
    console.error(e);
    process.exit(1);
  });
}
