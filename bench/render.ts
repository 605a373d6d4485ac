/**
 * The full-sync render alone, no kernel: the state of a given size parsed afresh for each run
 * (as a daemon start or a bulk `PUT /v1/state` holds new objects, so no per-object cache is
 * warm), then what a full sync of a fresh namespace computes before its one transaction — the
 * nft plan against an empty kernel view and its script text, with the accounting table; the
 * iptables desired chains, the plan against empty tables and the restore text. Median of
 * several runs.
 *
 *   node --expose-gc dist/bench/render.js [size=10000] [runs=15] [--against <another build's dist/>]
 *
 * `--against` runs the same work through another build (a checkout of an older commit, built)
 * in the same process, the two alternating run by run, and checks that both render the same
 * bytes. With --expose-gc each run starts after a collection (steadier figures);
 * `node --cpu-prof dist/bench/render.js` profiles it.
 */
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { median, microArgs } from './stats.js';
import { stateDoc } from './workload.js';

interface Build {
  readonly name: string;
  readonly nft: (doc: unknown) => () => string;
  readonly iptables: (doc: unknown) => () => string;
}

async function load(dist: string, name: string): Promise<Build> {
  const mod = (p: string) => import(pathToFileURL(path.join(dist, 'src', p)).href);
  const [state, backend, render, plan, ipBackend, save, counters] = await Promise.all([
    mod('state/state.js'),
    mod('dataplane/netfilter/backend.js'),
    mod('dataplane/netfilter/nft/render.js'),
    mod('dataplane/netfilter/iptables/plan.js'),
    mod('dataplane/netfilter/iptables/backend.js'),
    mod('dataplane/netfilter/iptables/save.js'),
    mod('dataplane/eipCounters.js'),
  ]);
  // Parsing is not timed: each returns the timed work over a freshly parsed state.
  return {
    name,
    nft: (doc) => {
      const s = state.desiredStateSchema.parse(doc);
      return () => {
        const tx = render.planNatgw(backend.natTablesOf(s), { ip: null, ip6: null }).tx;
        return (
          tx.text() +
          counters
            .accountingTx(
              undefined,
              s.eips.map((e: { address: string }) => e.address),
            )
            .text()
        );
      };
    },
    iptables: (doc) => {
      const s = state.desiredStateSchema.parse(doc);
      return () => {
        const want = plan.desiredTables((backend.ofFamily ?? ipBackend.ofFamily)(backend.natTablesOf(s), 4));
        return ['nat', 'mangle'].map((t) => plan.renderRestore(t, plan.planTable(save.emptyTable, want[t]))).join('');
      };
    },
  };
}

async function main(): Promise<void> {
  const here = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
  const { size, runs, builds: roots } = microArgs(process.argv.slice(2), here);
  const builds = await Promise.all(roots.map((b) => load(path.resolve(b.root), b.name)));
  const doc = stateDoc(size, false);

  for (const backend of ['nft', 'iptables'] as const) {
    const ms = builds.map((): number[] => []);
    const out = builds.map(() => '');
    for (let r = 0; r < runs; r++) {
      for (const [b, build] of builds.entries()) {
        const work = build[backend](doc);
        // With --expose-gc, the parse's garbage is collected before the clock starts.
        (globalThis as { gc?: () => void }).gc?.();
        const t0 = process.hrtime.bigint();
        out[b] = work();
        ms[b]?.push(Number(process.hrtime.bigint() - t0) / 1e6);
      }
    }
    for (const [b, build] of builds.entries()) {
      const m = ms[b] as number[];
      const spread = `${Math.min(...m).toFixed(1)}–${Math.max(...m).toFixed(1)}`;
      console.log(
        `${backend.padEnd(8)} size ${size}, ${build.name}: median ${median(m).toFixed(1)} ms (${spread}, ${runs} runs), script ${out[b]?.length} bytes`,
      );
    }
    if (builds.length === 2 && out[0] !== out[1]) {
      console.log(`${backend}: the two builds render DIFFERENT scripts`);
      process.exitCode = 1;
    }
  }
}

await main();
