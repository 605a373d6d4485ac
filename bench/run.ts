/**
 * `npm run bench` (as root): natgw at ten thousand rules, per backend, on the real kernel in
 * throw-away network namespaces; plus the pure planners on their own. Prints figures only;
 * tests check behaviour, not time.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createTopology, type Topology } from '../test/helpers/netns.js';
import { startServer } from '../test/helpers/traffic.js';
import { desiredTables, planTable } from '../src/dataplane/netfilter/iptables/plan.js';
import { emptyTable } from '../src/dataplane/netfilter/iptables/save.js';
import type { NatTables } from '../src/dataplane/netfilter/backend.js';

const DNATS = Number(process.env.BENCH_DNATS ?? 10000);
const SNATS = Number(process.env.BENCH_SNATS ?? 2000);
const FIPS = Number(process.env.BENCH_FIPS ?? 1000);

function syntheticTables(): NatTables {
  const dnats = Array.from({ length: DNATS }, (_, i) => ({
    eip: `172.20.${Math.floor(i / 250)}.${i % 250}`, port: 1024 + (i % 1000), protocol: 'tcp' as const, internalIp: `10.0.${i % 250}.${(i % 200) + 2}`, internalPort: 80,
  }));
  const snats = Array.from({ length: SNATS }, (_, i) => ({ eip: '172.20.0.10', cidr: `10.${(i >> 8) & 255}.${i & 255}.0/24`, randomFully: false }));
  const fips = Array.from({ length: FIPS }, (_, i) => ({ eip: `172.21.${i >> 8}.${i & 255}`, internalIp: `10.2.${i >> 8}.${i & 255}` }));
  return { vpcIf: 'eth0', extIf: 'net1', eips: ['172.20.0.10'], snats, dnats, fips };
}

function planFigures(): Record<string, number> {
  const want = syntheticTables();
  const t0 = performance.now();
  const desired = desiredTables(want);
  const full = planTable(emptyTable, desired.nat);
  const t1 = performance.now();
  // The kernel already holds everything: the no-op diff natgw runs on every command.
  const have = { chains: new Set(desired.nat.owned.keys()), rules: new Map([...desired.nat.owned].map(([c, r]) => [c, [...r]])) };
  const t2 = performance.now();
  const noop = planTable(have, desired.nat);
  const t3 = performance.now();
  return { iptablesFullPlanMs: Math.round(t1 - t0), iptablesFullPlanLines: full.lines.length, iptablesNoopDiffMs: Math.round(t3 - t2), iptablesNoopLines: noop.lines.length };
}

async function kernelFigures(mode: 'iptables' | 'nftables'): Promise<Record<string, unknown>> {
  const topo = await createTopology();
  const stateDir = mkdtempSync(path.join(tmpdir(), 'natgw-bench-'));
  try {
    const worker = path.join(path.dirname(fileURLToPath(import.meta.url)), 'kernel.js');
    const r = await topo.exec('gw', [process.execPath, worker, mode, String(DNATS), String(SNATS), String(FIPS), stateDir], { timeoutMs: 15 * 60_000 });
    const figures = JSON.parse(r.stdout.trim().split('\n').at(-1) ?? '{}') as Record<string, unknown>;
    return { ...figures, ...(await connectionRates(topo)) };
  } finally {
    await topo.cleanup();
    rmSync(stateDir, { recursive: true, force: true });
  }
}

/**
 * New TCP connections per second from the external host through the FIRST and the LAST DNAT
 * rule: NAT rules see the first packet of every connection, so a linear chain shows up here
 * and a map lookup does not.
 */
const CONNECT_LOOP = `
const net = require('node:net');
const [host, port, count] = process.argv.slice(1);
let done = 0; const t0 = process.hrtime.bigint();
const next = () => {
  if (done === Number(count)) {
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(JSON.stringify({ perSecond: Math.round(done / s) }));
    return;
  }
  const c = net.connect({ host, port: Number(port), localAddress: '172.20.0.100' }, () => { c.destroy(); done++; next(); });
  c.on('error', (e) => { console.error(e.message); process.exit(1); });
};
next();`;

async function connectionRates(topo: Topology): Promise<Record<string, number>> {
  await topo.exec('ext', ['ip', 'route', 'replace', '172.20.0.0/16', 'dev', 'e0']);
  if (process.env.BENCH_DEBUG) console.log((await topo.exec('ext', ['ip', 'route'])).stdout, (await topo.exec('ext', ['ip', '-br', 'addr'])).stdout);
  const server = startServer(topo, 'vpc1', 'tcp', 80);
  await server.ready;
  try {
    const rate = async (host: string, port: number) => {
      const r = await topo.exec('ext', [process.execPath, '-e', CONNECT_LOOP, host, String(port), '2000'], { timeoutMs: 120_000 });
      return (JSON.parse(r.stdout.trim()) as { perSecond: number }).perSecond;
    };
    return { connPerSecFirstRule: await rate('172.20.1.9', 1), connPerSecLastRule: await rate('172.20.1.209', 65000) };
  } finally {
    await server.stop();
  }
}

async function main(): Promise<void> {
  console.log(`natgw bench: ${DNATS} DNAT, ${SNATS} SNAT, ${FIPS} FIP rules`);
  console.log('pure planner:', JSON.stringify(planFigures()));
  for (const mode of ['iptables', 'nftables'] as const) {
    console.log(`${mode} (real kernel, in-process engine):`, JSON.stringify(await kernelFigures(mode)));
  }
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
