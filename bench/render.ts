/**
 * The full-sync render alone, no kernel: the state of a given size parsed afresh each run (as
 * a daemon start or a bulk `PUT /v1/state` holds new objects, so no per-object memo is warm),
 * then what a full sync of a fresh namespace computes before its one transaction — the nft
 * plan against an empty kernel view and its script text; the iptables desired chains, the plan
 * against empty tables and the restore text; the accounting table. Median of several runs.
 *
 *   node dist/bench/render.js [size=10000] [runs=9]
 *
 * `node --cpu-prof dist/bench/render.js` writes a profile of the same work.
 */
import { desiredStateSchema, type DesiredState } from '../src/state/state.js';
import { natTablesOf } from '../src/dataplane/netfilter/backend.js';
import { planNatgw } from '../src/dataplane/netfilter/nft/render.js';
import { desiredTables, planTable, renderRestore, type TableName } from '../src/dataplane/netfilter/iptables/plan.js';
import { ofFamily } from '../src/dataplane/netfilter/iptables/backend.js';
import { emptyTable } from '../src/dataplane/netfilter/iptables/save.js';
import { accountingTx } from '../src/dataplane/eipCounters.js';
import { stateDoc } from './workload.js';

const size = Number(process.argv[2] ?? 10000);
const runs = Number(process.argv[3] ?? 9);

const fresh = (): DesiredState => desiredStateSchema.parse(stateDoc(size, false));

function nft(s: DesiredState): number {
  const plan = planNatgw(natTablesOf(s), { ip: null, ip6: null });
  return plan.tx.text().length + accountingTx(undefined, s.eips.map((e) => e.address)).text().length;
}

function iptables(s: DesiredState): number {
  const want = desiredTables(ofFamily(natTablesOf(s), 4));
  let n = 0;
  for (const table of ['nat', 'mangle'] as TableName[]) n += renderRestore(table, planTable(emptyTable, want[table])).length;
  return n;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] as number;
}

function time(name: string, f: (s: DesiredState) => number): void {
  const ms: number[] = [];
  let bytes = 0;
  // Parsed before the clock starts (and before a profile's interesting part): one state per run.
  const states = Array.from({ length: runs }, fresh);
  for (const s of states) {
    const t0 = process.hrtime.bigint();
    bytes = f(s);
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  const spread = `${Math.min(...ms).toFixed(1)}–${Math.max(...ms).toFixed(1)}`;
  console.log(`${name.padEnd(9)} size ${size}: median ${median(ms).toFixed(1)} ms (${spread}, ${runs} runs), script ${bytes} bytes`);
}

time('nftables', nft);
time('iptables', iptables);
