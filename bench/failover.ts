/**
 * The failover gap of active-active replicas (issue 30): 200 long-lived TCP flows (SNAT, FIP
 * outbound, DNAT, FIP inbound) and 20 UDP sessions through SNAT, each sending a line every
 * 100 ms, spread over the replicas by ECMP, the EIPs announced by BGP to an upstream router's
 * BIRD (BFD 100 ms x 3). Per flow, the largest gap between answers: first over a quiet window
 * (the floor, in the same run), then over the same window with one replica killed (links down,
 * SIGKILL; the router's BFD withdraws it, the VPC's ECMP drops it 300 ms later as OVN's BFD
 * would). Prints p50 and p99 over the flows, and each against the floor.
 *
 *   npm run build && node dist/bench/failover.js [--replicas 2] [--runs 3]
 *
 * Runs as root in throw-away namespaces (test/helpers/ecmpTopology.ts), nftables backend.
 * Prints a table, then one JSON line.
 */
import { parseArgs } from 'node:util';
import { percentile } from '../test/helpers/ecmpFlows.js';
import { cleanupLive, killBehindBgp, pair, startFlows } from '../test/helpers/ecmpReplicas.js';

const { values: opt } = parseArgs({
  options: {
    replicas: { type: 'string', default: '2' },
    runs: { type: 'string', default: '3' },
  },
});
const N = Number(opt.replicas);
const RUNS = Number(opt.runs);
if (!Number.isInteger(N) || N < 2 || N > 8 || !Number.isInteger(RUNS) || RUNS < 1) {
  console.error('usage: failover.js [--replicas 2..8] [--runs n]');
  process.exit(2);
}

interface Run {
  readonly floorP50: number;
  readonly floorP99: number;
  readonly p50: number;
  readonly p99: number;
  readonly max: number;
  readonly withdrawnMs: number;
  readonly lost: number;
}

const WINDOW_MS = 4000;

async function once(): Promise<Run> {
  try {
    const { t, logs } = await pair({ env: { GATEWAY_NETFILTER_MODE: 'nftables' } }, (i) => ({ NATGW_SNAT_PORT_SLICE: `${i}/${N}` }), { n: N, bgp: true });
    const { groups, report } = await startFlows(t, logs);
    await Promise.all(groups.map((g) => g.reset()));
    await new Promise((r) => setTimeout(r, WINDOW_MS));
    const floor = (await report()).map((f) => f.maxGapMs);
    await Promise.all(groups.map((g) => g.reset()));
    const { withdrawnMs } = await killBehindBgp(t, 0);
    const after = await report();
    const gaps = after.map((f) => f.maxGapMs);
    return {
      floorP50: percentile(floor, 50),
      floorP99: percentile(floor, 99),
      p50: percentile(gaps, 50),
      p99: percentile(gaps, 99),
      max: percentile(gaps, 100),
      withdrawnMs,
      lost: after.filter((f) => f.error !== null || (f.sinceLastMs ?? 1e9) > 1000).length,
    };
  } finally {
    await cleanupLive();
  }
}

const runs: Run[] = [];
for (let k = 0; k < RUNS; k++) runs.push(await once());
const median = (xs: number[]): number => percentile(xs, 50);
console.log(`failover gap, ${N} replicas behind BGP (BFD 100 ms x 3), 200 TCP + 20 UDP flows at 100 ms, one replica killed (nftables)`);
console.log('run  floor p50/p99 ms  failover p50/p99/max ms  p50/floor  p99/floor  BFD withdrawal ms  lost');
runs.forEach((r, k) =>
  console.log(
    `${String(k + 1).padEnd(4)} ${`${r.floorP50}/${r.floorP99}`.padEnd(17)} ${`${r.p50}/${r.p99}/${r.max}`.padEnd(24)} ${(r.p50 / r.floorP50).toFixed(2).padEnd(10)} ${(r.p99 / r.floorP99).toFixed(2).padEnd(10)} ${String(r.withdrawnMs).padEnd(18)} ${r.lost}`,
  ),
);
const summary = {
  replicas: N,
  runs: RUNS,
  p50Ms: median(runs.map((r) => r.p50)),
  p99Ms: median(runs.map((r) => r.p99)),
  maxMs: Math.max(...runs.map((r) => r.max)),
  floorP50Ms: median(runs.map((r) => r.floorP50)),
  floorP99Ms: median(runs.map((r) => r.floorP99)),
  withdrawnMs: median(runs.map((r) => r.withdrawnMs)),
  lost: runs.reduce((n, r) => n + r.lost, 0),
};
console.log(
  `median: failover p50 ${summary.p50Ms} ms (x${(summary.p50Ms / summary.floorP50Ms).toFixed(1)} the floor), p99 ${summary.p99Ms} ms (x${(summary.p99Ms / summary.floorP99Ms).toFixed(1)})`,
);
console.log(JSON.stringify(summary));
