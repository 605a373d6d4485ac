/**
 * `npm run bench` (as root): natgw's command latency, bulk apply, restore and memory at several
 * gateway sizes, per backend, each figure next to the floor the kernel and the process model
 * impose, in throw-away network namespaces. Prints tables, then one JSON line with every
 * figure. Prints figures only; tests check behaviour, not time. `--help` lists the flags.
 */
import { spawnSync } from 'node:child_process';
import os from 'node:os';
import { bulkFigures } from './bulk.js';
import { apiRounds, shimRounds } from './commands.js';
import { compare } from './compare.js';
import { connectionRates } from './connrate.js';
import { floorSummary, hasNc, openKernelFloor, processFloors } from './floors.js';
import { Gateway, VanishedError, setLibnft, vanishedNote, type BackendName } from './gateway.js';
import { parseOptions, type Options } from './options.js';
import { note, progress, runNotes } from './progress.js';
import { backendSection, closingSection, compareSection, headerSection } from './report.js';
import type { BackendFigures, Results, SizeFigures } from './results.js';
import { round } from './stats.js';
import { WARMUP_K0, WARMUP_SHIM_K0, mixOf, stateDoc } from './workload.js';

const message = (e: unknown): string => (e instanceof Error ? e.message : String(e)).slice(0, 3000);

function version(argv: string[]): string {
  const r = spawnSync(argv[0]!, argv.slice(1), { encoding: 'utf8' });
  return r.status === 0 ? (r.stdout.trim().split('\n')[0] ?? '') : 'absent';
}

async function measureSize(gw: Gateway, backend: BackendName, size: number, o: Options, nc: boolean, b: BackendFigures, fresh: boolean): Promise<SizeFigures> {
  progress(`${backend} size ${size}: fill (PUT /v1/state)`);
  const fill = await gw.putState(stateDoc(size, o.fipEips));
  await gw.settleAnnouncements();
  b.info = await gw.backendInfo();
  progress(`${backend} size ${size}: floors`);
  const processes = await processFloors(gw, o.samples, nc);
  // A fresh daemon's first commands run its command path for the first time (V8 compiles it,
  // its inline caches settle): once in a daemon's life, long done in one that serves a gateway.
  let warmup: SizeFigures['warmup'];
  if (fresh && o.warmup > 0) {
    progress(`${backend} size ${size}: warm-up, ${o.warmup} rounds of every command`);
    warmup = { rounds: o.warmup, api: (await apiRounds(gw, o.warmup, { k0: WARMUP_K0 })).api, shim: await shimRounds(gw, o.warmup, WARMUP_SHIM_K0) };
  }
  progress(`${backend} size ${size}: API commands, the kernel floor beside them`);
  const floor = await openKernelFloor(gw, b.info, size + 1);
  let rounds: Awaited<ReturnType<typeof apiRounds>>;
  try {
    rounds = await apiRounds(gw, o.samples, { floor });
  } finally {
    await floor.close();
  }
  const floors = { ...floorSummary(rounds.floor), kernelWhat: floor.what, ...processes };
  progress(`${backend} size ${size}: shim commands`);
  const shim = await shimRounds(gw, o.samples);
  return { mix: mixOf(size, o.fipEips), fillMs: round(fill.ms), floors, api: rounds.api, shim, ...(warmup ? { warmup } : {}), memory: gw.daemon?.memory() };
}

/** Ascending sizes on one gateway, each filled from the previous one. */
async function sizeSeries(b: BackendFigures, backend: BackendName, o: Options): Promise<void> {
  const make = () => Gateway.withDaemon({ backend, resync: o.resync });
  let gw = await make();
  try {
    const nc = await hasNc(gw);
    if (!nc) note('nc is not installed; the client floor is skipped');
    let fresh = true;
    for (const size of o.sizes) {
      for (let attempt = 1; ; attempt++) {
        try {
          const figures = await measureSize(gw, backend, size, o, nc, b, fresh);
          fresh = false;
          if (gw.vanished()) throw new VanishedError('namespace or state dir gone after the run');
          b.sizes.push(figures);
          break;
        } catch (e) {
          if (!(e instanceof VanishedError || gw.vanished()) || attempt >= 2) throw e;
          note(`${vanishedNote(`${backend} size ${size}`)} (its fill is then from an empty gateway)`);
          await gw.cleanup();
          gw = await make();
          fresh = true;
        }
      }
    }
    if (o.connRate) {
      const size = o.sizes.at(-1) ?? 0;
      progress(`${backend} size ${size}: connections per second`);
      try {
        b.connRate = { size, ...(await connectionRates(gw, b.info ?? { kind: backend })) };
      } catch (e) {
        b.errors.push(`connection rate: ${message(e)}`);
      }
    }
  } finally {
    await gw.cleanup();
  }
}

async function benchBackend(backend: BackendName, o: Options): Promise<BackendFigures> {
  const b: BackendFigures = { backend, sizes: [], errors: [] };
  // Phases are independent: one that fails is reported and the others still run.
  try {
    if (o.sizes.length > 0) await sizeSeries(b, backend, o);
  } catch (e) {
    b.errors.push(`per-size series: ${message(e)}`);
  }
  if (o.bulkSize > 0) {
    try {
      b.bulk = await bulkFigures({ backend, resync: o.resync }, o.bulkSize, o.fipEips, o.bulkRuns, (what, e) =>
        b.errors.push(`bulk/restore ${what}: ${message(e)}`),
      );
    } catch (e) {
      b.errors.push(`bulk/restore: ${message(e)}`);
    }
  }
  return b;
}

async function main(): Promise<void> {
  const o = parseOptions(process.argv.slice(2), process.env);
  if (process.getuid?.() !== 0) throw new Error('the bench needs root (network namespaces)');
  setLibnft(o.libnft);
  if (process.env.NODE_EXTRA_CA_CERTS) {
    // Node.js reads that bundle at every start, before any code runs (~30 ms on the 2-core
    // machine, more than node -e 0 costs without it). A gateway pod does not set it, so neither
    // natgw's processes nor the node floor get it here; the run says so.
    note(`NODE_EXTRA_CA_CERTS (${process.env.NODE_EXTRA_CA_CERTS}) is unset for everything the bench starts, as in a gateway pod`);
    delete process.env.NODE_EXTRA_CA_CERTS;
  }

  const results: Results = {
    options: o,
    environment: {
      cpus: String(os.cpus().length),
      kernel: os.release(),
      node: process.version,
      nft: version(['nft', '--version']),
      iptables: version(['iptables', '--version']),
      // Other work on the machine shows up in every figure; the load says how much there was.
      'load at start': os
        .loadavg()
        .map((x) => x.toFixed(1))
        .join(' '),
    },
    backends: [],
    notes: [],
  };
  progress(`sizes ${o.sizes.join(',')}, backends ${o.backends.join(',')}, ${o.samples} samples per figure`);
  console.log(headerSection(results));
  for (const backend of o.sizes.length > 0 || o.bulkSize > 0 ? o.backends : []) {
    const b = await benchBackend(backend, o);
    results.backends.push(b);
    console.log(backendSection(b));
  }
  if (o.compare) {
    results.compare = { prefix: o.compare, runs: [] };
    try {
      results.compare.runs.push(...(await compare(o.compare, o.compareSizes, o.backends, o.resync)));
    } catch (e) {
      results.compare.error = message(e);
    }
    console.log(compareSection(results.compare));
  }
  results.environment['load at end'] = os
    .loadavg()
    .map((x) => x.toFixed(1))
    .join(' ');
  results.notes.push(...runNotes);
  console.log(closingSection(results));
  console.log(JSON.stringify(results));
  const failed = results.backends.some((b) => b.errors.length > 0) || results.compare?.error !== undefined;
  process.exitCode = failed ? 1 : 0;
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
