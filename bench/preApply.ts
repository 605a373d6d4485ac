/**
 * The CPU a bulk `PUT /v1/state` spends before its kernel tool starts, no kernel: the body
 * text parsed (JSON.parse), validated (parseStateBody), then the engine's transaction as
 * agent.replaceState runs it, into a gateway whose start found natgw's tables absent, up to
 * the moment the executor is asked for the NAT transaction (`nft -f -` / `iptables-restore`);
 * then the rest of the transaction and the answer's digest ("after"). A recording executor
 * stands in for the tools. CPU with garbage collection, median of several runs, each in a
 * fresh engine and state dir.
 *
 *   node --max-semi-space-size=1 dist/bench/preApply.js [size=10000] [runs=15] [nftables|iptables] [--against <another build's dist/>]
 *
 * Run it with the daemon's heap limits (DAEMON_NODE_FLAGS, src/cli/forward.ts). `--against` alternates with
 * another build run by run and checks that both hand the tool the same script.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import pino from 'pino';
import { RecordingExecutor } from '../test/helpers/execCalls.js';
import { median, microArgs } from './stats.js';
import { stateDoc } from './workload.js';

type Fn = (...a: unknown[]) => unknown;
interface Req {
  readonly file: string;
  readonly args: readonly string[];
  readonly input?: string;
}
interface Figures {
  readonly ms: number[];
  readonly script: string;
}
interface Build {
  readonly name: string;
  readonly run: (body: string) => Promise<Figures>;
}

const cpu = (): number => {
  const t = process.cpuUsage();
  return (t.user + t.system) / 1000;
};

async function load(dist: string, name: string, backend: string): Promise<Build> {
  const mod = (p: string) => import(pathToFileURL(path.join(dist, 'src', p)).href);
  const [config, engineMod, doc, change] = await Promise.all([
    mod('config/config.js'),
    mod('engine/engine.js'),
    mod('api/stateDoc.js'),
    mod('state/change.js'),
  ]);
  return {
    name,
    run: async (body) => {
      const dir = mkdtempSync(path.join(tmpdir(), 'natgw-preapply-'));
      try {
        const cfg = await (config.loadConfig as Fn)({
          NATGW_ENV_FILE: path.join(dir, 'none.env'),
          NATGW_STATE_DIR: dir,
          GATEWAY_NETFILTER_MODE: backend,
          NATGW_IPTABLES_VARIANT: 'legacy',
        });
        let atTool: number | undefined;
        let script = '';
        const recorder = new RecordingExecutor((r: Req) => {
          const apply = (r.file === 'nft' && r.args.includes('-f')) || r.file.endsWith('-restore');
          // The NAT transaction: the one large script (the accounting's is a few KiB).
          if (apply && atTool === undefined && (r.input?.length ?? 0) > 100_000) {
            atTool = cpu();
            script = r.input ?? '';
          }
          if (r.file === 'nft' && r.args.includes('list')) return { exitCode: 1, stderr: 'Error: No such file or directory' };
          return undefined;
        });
        const engine = new engineMod.Engine({ config: cfg, exec: recorder, log: pino({ level: 'silent' }) });
        // The daemon's start: a full sync of a gateway not yet initialised.
        await engine.transact(({ state }: { state: unknown }) => ({ state, effects: [] }), { mode: 'full' });
        const t0 = cpu();
        const parsed: unknown = JSON.parse(body);
        const t1 = cpu();
        const next = (doc.parseStateBody as Fn)(parsed);
        const t2 = cpu();
        const done = await engine.transact(
          ({ state: current }: { state: unknown }) => {
            const diff = (change.diffStates as Fn)(current, next);
            return { state: next, effects: (doc.effectsOf as Fn)(diff), change: diff };
          },
          { qos: true },
        );
        (doc.digestOf as Fn)(done.state);
        const t3 = cpu();
        const tool = atTool ?? t3;
        return { ms: [t1 - t0, t2 - t1, tool - t2, tool - t0, t3 - tool], script };
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  };
}

async function main(): Promise<void> {
  const here = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
  const argv = process.argv.slice(2);
  const backendAt = argv.findIndex((a) => a === 'nftables' || a === 'iptables');
  const backend = backendAt >= 0 ? (argv.splice(backendAt, 1)[0] as string) : 'nftables';
  const { size, runs, builds: roots } = microArgs(argv, here);
  const builds = await Promise.all(roots.map((b) => load(path.resolve(b.root), b.name, backend)));
  const body = JSON.stringify(stateDoc(size, false));
  const phases = ['parse', 'validate', 'plan+render', 'to the tool', 'after'];
  const ms = builds.map(() => phases.map((): number[] => []));
  const scripts = builds.map(() => '');
  // Two runs each to warm up (the daemon has served requests before a bulk one), not counted.
  for (let r = 0; r < runs + 2; r++) {
    for (const [b, build] of builds.entries()) {
      const out = await build.run(body);
      if (r >= 2) out.ms.forEach((m, p) => ms[b]?.[p]?.push(m));
      scripts[b] = out.script;
    }
  }
  for (const [b, build] of builds.entries()) {
    const figures = phases.map((p, i) => `${p} ${median(ms[b]?.[i] ?? []).toFixed(1)}`).join(', ');
    console.log(`${backend} size ${size}, ${build.name}: CPU ms (median of ${runs}) ${figures}; script ${scripts[b]?.length ?? 0} bytes`);
  }
  if (builds.length === 2 && scripts[0] !== scripts[1]) {
    console.log('the two builds hand the tool DIFFERENT scripts');
    process.exitCode = 1;
  }
}

await main();
