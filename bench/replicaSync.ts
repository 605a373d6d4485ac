/**
 * What active-active replica sync costs (issue 30): new TCP connections per second through one
 * replica's SNAT with conntrackd syncing to a peer, against the same replica without sync (the
 * floor, measured in the same run); and how many new flows per second the pair synchronises
 * (the peer's conntrackd writing them into its kernel), against the rate they were created.
 *
 *   npm run build && node dist/bench/replicaSync.js [--flows 4000] [--concurrency 32] [--runs 3]
 *
 * Runs as root in throw-away namespaces (test/helpers/ecmpTopology.ts), nftables backend (the
 * sync cost does not depend on the NAT backend). Prints a table, then one JSON line.
 */
import { parseArgs } from 'node:util';
import { EcmpTopology, ECMP_ADDR } from '../test/helpers/ecmpTopology.js';
import { waitFor } from '../test/helpers/poll.js';
import { startServer } from '../test/helpers/traffic.js';
import { api } from './daemon.js';

const { values: opt } = parseArgs({
  options: {
    flows: { type: 'string', default: '4000' },
    concurrency: { type: 'string', default: '32' },
    runs: { type: 'string', default: '3' },
  },
});
const FLOWS = Number(opt.flows);
const CONCURRENCY = Number(opt.concurrency);
const RUNS = Number(opt.runs);
const EIP = '172.20.0.10';
const PORT = 9003;

/** `count` connections, `concurrency` at a time, each closed once established; prints {perSecond}. */
const CONNECT_LOOP = `
const net = require('node:net');
const [host, port, count, concurrency] = process.argv.slice(1).map((v, i) => (i ? Number(v) : v));
let started = 0, done = 0, failed = 0;
const t0 = process.hrtime.bigint();
const one = () => new Promise((resolve) => {
  const c = net.connect({ host, port }, () => { c.destroy(); done++; resolve(); });
  c.on('error', () => { failed++; resolve(); });
});
const worker = async () => { while (started < count) { started++; await one(); } };
Promise.all(Array.from({ length: concurrency }, worker)).then(() => {
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({ perSecond: Math.round(done / s), seconds: s, done, failed }));
});`;

interface Sample {
  readonly perSecond: number;
  readonly seconds: number;
  readonly done: number;
  readonly failed: number;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
const haStatus = async (t: EcmpTopology, i: number): Promise<any> => (await api(t.socket(i), 'GET', '/v1/ha')).body;
const injected = async (t: EcmpTopology, i: number): Promise<number> => {
  const e = (await haStatus(t, i)).sync?.stats?.external;
  return e ? e.created + e.updated + e.createFailed + e.updateFailed : 0;
};

async function legacy(t: EcmpTopology, i: number, command: string, ...rules: string[]): Promise<void> {
  const r = await api(t.socket(i), 'POST', '/v1/legacy', { command, rules });
  if (r.status !== 200 || (r.body as { status: number }).status !== 0) throw new Error(`${command} on g${i}: ${r.text}`);
}

/** One run: a replica with sync on or off; all traffic through g0. */
interface Synced {
  /** Flows the peer received per second, from the burst's start until its inject counters stopped. */
  readonly flowsPerSecond: number;
  /** flowsPerSecond over the rate the flows were created at (1: the peer keeps up). */
  readonly ofCreated: number;
  /** How long after the burst's end the peer was still catching up. */
  readonly lagMs: number;
  /** Sync messages the peer wrote into its kernel (new, update, failed) for the burst. */
  readonly messages: number;
}

async function run(sync: boolean): Promise<{ rate: Sample; synced?: Synced }> {
  const t = await EcmpTopology.create(2);
  try {
    const started = sync ? [0, 1] : [0];
    for (const i of started) {
      const env: Record<string, string> = sync ? { NATGW_SNAT_PORT_SLICE: `${i}/2` } : { NATGW_HA_PEERS: '', NATGW_HA_PEER_API: '' };
      const child = t.spawnNatgw(i, { GATEWAY_NETFILTER_MODE: 'nftables', NATGW_LOG_LEVEL: 'warn', ...env }, 'serve');
      child.stdout?.resume();
      child.stderr?.resume();
      await waitFor(async () => (await api(t.socket(i), 'GET', '/healthz', undefined, 1000).catch(() => ({ status: 0 }))).status === 200, {
        what: `g${i} answering`,
        timeoutMs: 20_000,
      });
      await legacy(t, i, 'init');
      await legacy(t, i, 'eip-add', `${EIP}/24`);
      await legacy(t, i, 'snat-add', `${EIP},${ECMP_ADDR.vpcCidr},--random-fully`);
    }
    for (const i of started) {
      await waitFor(async () => (await api(t.socket(i), 'GET', '/readyz')).status === 200 && (!sync || (await haStatus(t, i)).health.healthy), {
        what: `g${i} ready`,
        timeoutMs: 30_000,
      });
    }
    await t.routeEips([EIP]);
    await t.failNexthop(1);
    const server = startServer(t.traffic, 'ext', 'tcp', PORT, ECMP_ADDR.extHost);
    await server.ready;
    try {
      const before = sync ? await injected(t, 1) : 0;
      const t0 = Date.now();
      const r = await t.exec('vpc1', [process.execPath, '-e', CONNECT_LOOP, ECMP_ADDR.extHost, String(PORT), String(FLOWS), String(CONCURRENCY)], {
        timeoutMs: 600_000,
      });
      const rate = JSON.parse(r.stdout.trim()) as Sample;
      if (!sync) return { rate };
      // Each flow is a new entry, an update or two and a destroy on the way to TIME_WAIT: the
      // peer has synchronised the burst once its inject counters stop moving.
      let last = -1;
      let lastChange = Date.now();
      while (Date.now() - lastChange < 1000) {
        const n = await injected(t, 1);
        if (n !== last) {
          last = n;
          lastChange = Date.now();
        }
        await new Promise((res) => setTimeout(res, 50));
      }
      const syncedMs = lastChange - t0;
      const messages = last - before;
      const flowsPerSecond = Math.round((rate.done / syncedMs) * 1000);
      return {
        rate,
        synced: { flowsPerSecond, ofCreated: flowsPerSecond / rate.perSecond, lagMs: Math.max(0, Math.round(syncedMs - rate.seconds * 1000)), messages },
      };
    } finally {
      await server.stop();
    }
  } finally {
    await t.cleanup();
  }
}

const median = (xs: readonly number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

const rows: Array<{ run: number; off: number; on: number; ratio: number; syncedPerSec: number; syncedOfCreated: number; lagMs: number }> = [];
for (let k = 0; k < RUNS; k++) {
  // Alternated in one session, so both see the same load.
  const off = await run(false);
  const on = await run(true);
  rows.push({
    run: k + 1,
    off: off.rate.perSecond,
    on: on.rate.perSecond,
    ratio: on.rate.perSecond / off.rate.perSecond,
    syncedPerSec: on.synced?.flowsPerSecond ?? 0,
    syncedOfCreated: on.synced?.ofCreated ?? 0,
    lagMs: on.synced?.lagMs ?? 0,
  });
  if (off.rate.failed + on.rate.failed > 0) console.error(`run ${k + 1}: failed connections off ${off.rate.failed}, on ${on.rate.failed}`);
}
console.log(`replica sync, ${FLOWS} new TCP connections through one replica's SNAT, ${CONCURRENCY} at a time (nftables)`);
console.log('run  sync off/s  sync on/s  on/off  synced flows/s  synced/created  lag ms');
for (const r of rows) {
  console.log(
    `${String(r.run).padStart(3)}  ${String(r.off).padStart(10)}  ${String(r.on).padStart(9)}  ${r.ratio.toFixed(2).padStart(6)}  ${String(r.syncedPerSec).padStart(14)}  ${r.syncedOfCreated.toFixed(2).padStart(14)}  ${String(r.lagMs).padStart(6)}`,
  );
}
const summary = {
  flows: FLOWS,
  concurrency: CONCURRENCY,
  offPerSec: median(rows.map((r) => r.off)),
  onPerSec: median(rows.map((r) => r.on)),
  onOverOff: median(rows.map((r) => r.ratio)),
  syncedPerSec: median(rows.map((r) => r.syncedPerSec)),
  syncedOverCreated: median(rows.map((r) => r.syncedOfCreated)),
  lagMs: median(rows.map((r) => r.lagMs)),
  runs: rows,
};
console.log(`median: on/off ${summary.onOverOff.toFixed(2)}, synced/created ${summary.syncedOverCreated.toFixed(2)}`);
console.log(JSON.stringify(summary));
