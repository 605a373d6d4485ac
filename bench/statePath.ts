/**
 * The JavaScript of a bulk `PUT /v1/state` around the kernel apply, no kernel, no HTTP: the
 * body text parsed (JSON.parse, as express.json does), validated and normalised
 * (parseStateBody), planned against an empty gateway (diffStates, planOf, effectsOf) and the
 * answer's digest computed from scratch (digestOf; the daemon hashes it while the kernel
 * applies). CPU time per phase, garbage collection included, median of several runs.
 *
 *   node --max-semi-space-size=1 dist/bench/statePath.js [size=10000] [runs=15] [--against <another build's dist/>]
 *
 * Run it with the daemon's heap limits (DAEMON_NODE_FLAGS, src/cli/forward.ts): the young generation's size
 * decides what the garbage costs. `--against` alternates with another build run by run and
 * checks that both give the same digest.
 */
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { median, microArgs } from './stats.js';
import { stateDoc } from './workload.js';

type Fn = (...a: unknown[]) => unknown;
interface Build {
  readonly name: string;
  readonly run: (body: string, empty: unknown) => { ms: number[]; digest: string };
}

async function load(dist: string, name: string): Promise<Build> {
  const mod = (p: string) => import(pathToFileURL(path.join(dist, 'src', p)).href);
  const [doc, change] = await Promise.all([mod('api/stateDoc.js'), mod('state/change.js')]);
  return {
    name,
    run: (body, empty) => {
      const t0 = process.cpuUsage();
      const cpu = () => {
        const t = process.cpuUsage(t0);
        return (t.user + t.system) / 1000;
      };
      const parsed: unknown = JSON.parse(body);
      const t1 = cpu();
      const next = (doc.parseStateBody as Fn)(parsed);
      const t2 = cpu();
      const state = next;
      const diff = (change.diffStates as Fn)(empty, next);
      (doc.planOf as Fn)(diff);
      (doc.effectsOf as Fn)(diff);
      const t3 = cpu();
      const digest = (doc.digestOf as Fn)(state) as string;
      const t4 = cpu();
      return { ms: [t1, t2 - t1, t3 - t2, t4 - t3], digest };
    },
  };
}

async function main(): Promise<void> {
  const here = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
  const { size, runs, builds: roots } = microArgs(process.argv.slice(2), here);
  const builds = await Promise.all(roots.map((b) => load(path.resolve(b.root), b.name)));
  const body = JSON.stringify(stateDoc(size, false));
  const { desiredStateSchema } = await import(pathToFileURL(path.join(here, 'src', 'state/state.js')).href);
  const empty: unknown = desiredStateSchema.parse({ initialized: true, interfaces: { vpc: 'eth0', ext: 'net1' } });
  const phases = ['parse', 'validate', 'plan', 'digest'];
  const ms = builds.map(() => phases.map((): number[] => []));
  const digests = builds.map(() => '');
  for (let r = 0; r < runs; r++) {
    for (const [b, build] of builds.entries()) {
      const out = build.run(body, empty);
      out.ms.forEach((m, p) => ms[b]?.[p]?.push(m));
      digests[b] = out.digest;
    }
  }
  for (const [b, build] of builds.entries()) {
    const figures = phases.map((p, i) => `${p} ${median(ms[b]?.[i] ?? []).toFixed(1)}`).join(', ');
    console.log(`size ${size}, ${build.name}: CPU ms (median of ${runs}) ${figures}; ${digests[b]}`);
  }
  if (builds.length === 2 && digests[0] !== digests[1]) {
    console.log('the two builds give DIFFERENT digests');
    process.exitCode = 1;
  }
}

await main();
