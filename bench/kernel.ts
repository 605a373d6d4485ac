/**
 * Bench worker: runs INSIDE a gateway network namespace (bench/run.ts puts it there) and
 * drives the engine in-process at scale, printing one JSON line of figures.
 * argv: <mode iptables|nftables> <dnats> <snats> <fips> <stateDir>
 */
import pino from 'pino';
import { loadConfig } from '../src/config/config.js';
import { SystemExecutor } from '../src/system/exec.js';
import { Engine } from '../src/engine/engine.js';
import { runLegacy } from '../src/engine/legacy.js';

const [mode = 'iptables', dnatArg = '10000', snatArg = '2000', fipArg = '1000', stateDir = '/tmp/natgw-bench'] = process.argv.slice(2);
const N = { dnats: Number(dnatArg), snats: Number(snatArg), fips: Number(fipArg) };

const ip = (base: number, i: number): string => {
  const n = base + i;
  return `${(n >>> 24) & 255}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`;
};
const EIP_BASE = (172 << 24) | (20 << 16); // 172.20.x.y
// 172.20.1.10–209: clear of the lab's external host addresses in 172.20.0.0/24.
const eip = (i: number) => ip(EIP_BASE, 256 + 10 + (i % 200));

async function timed<T>(fn: () => Promise<T>): Promise<[T, number]> {
  const t = process.hrtime.bigint();
  const r = await fn();
  return [r, Number(process.hrtime.bigint() - t) / 1e6];
}

async function must(engine: Engine, cmd: string, rules: string[]): Promise<void> {
  const r = await runLegacy(engine, cmd, rules);
  if (r.status !== 0 || r.stderr !== '') throw new Error(`${cmd} failed: ${r.stdout}${r.stderr}`);
}

async function main(): Promise<void> {
  process.env.NATGW_STATE_DIR = stateDir;
  process.env.NATGW_ENV_FILE = `${stateDir}/nat-gateway.env`;
  process.env.GATEWAY_NETFILTER_MODE = mode;
  process.env.NATGW_IPTABLES_VARIANT = mode === 'iptables' ? 'legacy' : 'auto';
  const config = await loadConfig();
  const log = pino({ level: 'silent' });
  const engine = new Engine({ config, exec: new SystemExecutor(log), log });
  await must(engine, 'init', ['eth0,net1']);
  await must(engine, 'eip-add', Array.from({ length: 200 }, (_, i) => `${eip(i)}/16`));

  const dnatRules = Array.from({ length: N.dnats }, (_, i) => `${eip(i)},${1024 + Math.floor(i / 200)},tcp,${ip((10 << 24) | (1 << 8), 2 + (i % 250))},80`);
  const [, bulkDnatMs] = await timed(() => must(engine, 'dnat-add', dnatRules));
  const snatRules = Array.from({ length: N.snats }, (_, i) => `${eip(i)},10.${(i >> 8) & 255}.${i & 255}.0/${24 + (i % 9)}`);
  const [, bulkSnatMs] = await timed(() => must(engine, 'snat-add', snatRules));
  const fipRules = Array.from({ length: N.fips }, (_, i) => `${ip((172 << 24) | (21 << 16), i)},${ip((10 << 24) | (2 << 16), i)}`);
  const [, bulkFipMs] = await timed(() => must(engine, 'floating-ip-add', fipRules));

  // The controller's shape of work: one rule per command, against a full table.
  const singles: number[] = [];
  for (let i = 0; i < 20; i++) {
    const [, ms] = await timed(() => must(engine, 'dnat-add', [`172.20.250.1,${2000 + i},udp,10.0.1.9,53`]));
    singles.push(ms);
  }
  const deletes: number[] = [];
  for (let i = 0; i < 20; i++) {
    const [, ms] = await timed(() => must(engine, 'dnat-del', [`172.20.250.1,${2000 + i},udp`]));
    deletes.push(ms);
  }
  const [, resyncMs] = await timed(() => engine.resync('bench'));
  // Probes for the per-connection figure (bench/run.ts): the first and the last DNAT rule in
  // iptables order (natgw sorts DNATs by EIP, then port), both to vpc1:80.
  await must(engine, 'eip-add', ['172.20.1.9/16']);
  await must(engine, 'dnat-add', ['172.20.1.9,1,tcp,10.0.1.6,80', `${eip(199)},65000,tcp,10.0.1.6,80`]);
  const mem = process.memoryUsage();
  const median = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)] ?? 0;
  console.log(JSON.stringify({
    mode,
    objects: N,
    bulkDnatMs: Math.round(bulkDnatMs),
    bulkSnatMs: Math.round(bulkSnatMs),
    bulkFipMs: Math.round(bulkFipMs),
    singleAddMedianMs: Math.round(median(singles)),
    singleDelMedianMs: Math.round(median(deletes)),
    noopResyncMs: Math.round(resyncMs),
    rssMiB: Math.round(mem.rss / 1048576),
    heapUsedMiB: Math.round(mem.heapUsed / 1048576),
  }));
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
