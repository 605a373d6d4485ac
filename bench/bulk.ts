/**
 * The whole state at once: natgw's bulk PUT /v1/state into an empty gateway, and natgw's start
 * with a saved state into an empty namespace (restore), each against applying the very
 * ruleset natgw renders (`PUT /v1/state?dryRun=true` → `script`) with ONE raw tool run in a
 * fresh namespace. The sequence runs several times: on a shared machine one wall time swings 2×
 * from run to run, so a figure is a median, and a ratio the median of the runs' own ratios.
 */
import { copyFileSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Gateway, iptablesTools, withRetryIfVanished, type BackendInfo, type GatewayOptions } from './gateway.js';
import type { Memory } from './daemon.js';
import { progress } from './progress.js';
import { round, spread } from './stats.js';
import { stateDoc } from './workload.js';

/** A daemon start: spawn → /healthz and → /readyz 200, and its memory then. */
export interface StartFigures {
  readonly healthzMs: number;
  readonly readyzMs: number;
  readonly rss?: Memory;
}

/** One run of the whole sequence, in its own fresh namespaces; its ratios are taken against its own raw apply. */
export interface BulkRun {
  /** 1-based, of `runsAsked`: a failed run leaves a gap. */
  readonly run: number;
  readonly dryRunMs: number;
  readonly putStateMs: number;
  readonly rssAfterPut?: Memory;
  /** The rendered script split by tool: netfilter lines for nft/iptables-restore, address and route lines for ip -batch. */
  readonly scriptLines: { netfilter: number; link: number };
  readonly rawNetfilterMs?: number;
  readonly rawLinkMs?: number;
  readonly rawError?: string;
  /** Spawn → /readyz 200 in a fresh namespace with the state dir kept. */
  readonly restoreCold: StartFigures;
  /** Spawn → /readyz 200 in the same namespace, kernel still holding everything. */
  readonly restartWarm: StartFigures;
}

/**
 * The runs that finished, and the median of each figure over them under the keys a single run's
 * figures had (consumers of the JSON line read those); ranges and per-run ratios come from `runs`.
 */
export type BulkFigures = Omit<BulkRun, 'run' | 'restoreCold' | 'restartWarm'> & {
  readonly size: number;
  readonly documentBytes: number;
  readonly runsAsked: number;
  readonly restoreCold?: StartFigures;
  readonly restartWarm?: StartFigures;
  readonly runs: readonly BulkRun[];
};

/** ip -batch commands (link.ts) against everything else (nft statements, iptables-restore lines). */
export function splitScript(script: string): { netfilter: string; link: string } {
  const nf: string[] = [];
  const link: string[] = [];
  for (const line of script.split('\n')) {
    if (line.trim() === '') continue;
    (/^(-[46] +)?(addr|address|route|link|neigh|rule)\b/.test(line) ? link : nf).push(line);
  }
  return { netfilter: nf.length ? `${nf.join('\n')}\n` : '', link: link.length ? `${link.join('\n')}\n` : '' };
}

/** The regular files of a state dir (state, backend record, journal); not its socket, lock or log. */
export function copyStateFiles(from: string, to: string): void {
  for (const name of readdirSync(from)) {
    const p = join(from, name);
    if (statSync(p).isFile() && !name.endsWith('.log')) copyFileSync(p, join(to, name));
  }
}

/**
 * `runs` runs of the sequence, one after the other; a run that throws is handed to `failed` and
 * the others still count. Undefined when none finished.
 */
export async function bulkFigures(
  opts: GatewayOptions,
  size: number,
  fipEips: boolean,
  runs: number,
  failed: (what: string, e: unknown) => void,
): Promise<BulkFigures | undefined> {
  const doc = stateDoc(size, fipEips);
  const done: BulkRun[] = [];
  for (let i = 1; i <= runs; i++) {
    progress(`${opts.backend} bulk ${size}: run ${i}/${runs}`);
    try {
      done.push(await bulkRun(opts, doc, size, i));
    } catch (e) {
      failed(`run ${i}/${runs}`, e);
    }
  }
  return done.length > 0 ? medians(size, Buffer.byteLength(JSON.stringify(doc)), runs, done) : undefined;
}

/** natgw (dry run, PUT, warm restart), then the raw apply, then the cold restore: natgw and raw see the same load. */
async function bulkRun(opts: GatewayOptions, doc: unknown, size: number, run: number): Promise<BulkRun> {
  // Per run: a state dir kept from an earlier run could hold files this run's daemon did not write.
  const saved = mkdtempSync(join(tmpdir(), 'natgw-bench-state-'));
  // `finally` does not run when a signal ends the run through process.exit().
  const removeSaved = () => rmSync(saved, { recursive: true, force: true });
  process.once('exit', removeSaved);
  try {
    progress(`${opts.backend} bulk ${size}: dry run, then PUT /v1/state into an empty gateway`);
    let backend: BackendInfo = { kind: opts.backend };
    let script = '';
    const first = await withRetryIfVanished(
      `${opts.backend} bulk PUT`,
      () => Gateway.withDaemon(opts),
      async (gw) => {
        const dry = await gw.putState(doc, '?dryRun=true');
        script = String(dry.body?.script ?? '');
        const put = await gw.putState(doc);
        backend = await gw.backendInfo();
        const rssAfterPut = gw.daemon?.memory();
        progress(`${opts.backend} bulk ${size}: warm restart (kernel intact)`);
        await gw.stopDaemon();
        copyStateFiles(gw.topo.stateDir, saved);
        const warm = await gw.startDaemon();
        return { dryRunMs: round(dry.ms), putStateMs: round(put.ms), rssAfterPut, restartWarm: startFigures(warm, gw.daemon?.memory()) };
      },
    );
    const parts = splitScript(script);
    const raw = await rawApply(opts, backend, parts);
    progress(`${opts.backend} bulk ${size}: restore at daemon start in a fresh namespace`);
    const restoreCold = await withRetryIfVanished(
      `${opts.backend} restore`,
      () => Gateway.bare(opts),
      async (gw) => {
        copyStateFiles(saved, gw.topo.stateDir);
        const t = await gw.startDaemon();
        return startFigures(t, gw.daemon?.memory());
      },
    );
    return { run, ...first, scriptLines: { netfilter: lines(parts.netfilter), link: lines(parts.link) }, ...raw, restoreCold };
  } finally {
    removeSaved();
    process.removeListener('exit', removeSaved);
  }
}

const startFigures = (t: { healthzMs: number; readyzMs: number }, rss: Memory | undefined): StartFigures => ({
  healthzMs: round(t.healthzMs),
  readyzMs: round(t.readyzMs),
  rss,
});

function medians(size: number, documentBytes: number, runsAsked: number, runs: readonly BulkRun[]): BulkFigures {
  const mid = (pick: (r: BulkRun) => number | undefined) => spread(runs.map(pick))?.median;
  const start = (pick: (r: BulkRun) => StartFigures): StartFigures => ({
    healthzMs: mid((r) => pick(r).healthzMs) ?? Number.NaN,
    readyzMs: mid((r) => pick(r).readyzMs) ?? Number.NaN,
    rss: medianMemory(runs.map((r) => pick(r).rss)),
  });
  const rawErrors = runs.filter((r) => r.rawError).map((r) => `run ${r.run}: ${r.rawError}`);
  return {
    size,
    documentBytes,
    runsAsked,
    dryRunMs: mid((r) => r.dryRunMs) ?? Number.NaN,
    putStateMs: mid((r) => r.putStateMs) ?? Number.NaN,
    rssAfterPut: medianMemory(runs.map((r) => r.rssAfterPut)),
    // The same document renders the same script in every run.
    scriptLines: runs[0]!.scriptLines,
    rawNetfilterMs: mid((r) => r.rawNetfilterMs),
    rawLinkMs: mid((r) => r.rawLinkMs),
    ...(rawErrors.length ? { rawError: rawErrors.join('; ') } : {}),
    restoreCold: start((r) => r.restoreCold),
    restartWarm: start((r) => r.restartWarm),
    runs,
  };
}

/** RSS and peak each the median of its own: the two may come from different runs. */
function medianMemory(ms: ReadonlyArray<Memory | undefined>): Memory | undefined {
  const rss = spread(ms.map((m) => m?.rssKiB));
  const peak = spread(ms.map((m) => m?.peakKiB));
  return rss && peak ? { rssKiB: rss.median, peakKiB: peak.median } : undefined;
}

const lines = (s: string): number => (s === '' ? 0 : s.trimEnd().split('\n').length);

export async function rawApply(
  opts: GatewayOptions,
  backend: BackendInfo,
  parts: { netfilter: string; link: string },
): Promise<Pick<BulkRun, 'rawNetfilterMs' | 'rawLinkMs' | 'rawError'>> {
  progress(`${opts.backend}: the same ruleset with one raw ${backend.kind === 'nftables' ? 'nft -f' : 'iptables-restore'} in a fresh namespace`);
  return withRetryIfVanished(
    `${opts.backend} raw apply`,
    () => Gateway.bare(opts),
    async (gw) => {
      const nfArgv = backend.kind === 'nftables' ? ['nft', '-f', '-'] : [iptablesTools(backend.variant).restore, '--noflush', '--wait'];
      const nf = await gw.runner.run(nfArgv, { input: parts.netfilter, timeoutMs: 600_000 });
      if (nf.exitCode !== 0) return { rawError: `${nfArgv.join(' ')}: exit ${nf.exitCode}: ${nf.stderr.trim().slice(0, 500)}` };
      const link = parts.link ? await gw.runner.run(['ip', '-batch', '-'], { input: parts.link, timeoutMs: 600_000 }) : undefined;
      if (link && link.exitCode !== 0)
        return { rawNetfilterMs: round(nf.ms), rawError: `ip -batch -: exit ${link.exitCode}: ${link.stderr.trim().slice(0, 500)}` };
      return { rawNetfilterMs: round(nf.ms), rawLinkMs: round(link?.ms ?? 0) };
    },
  );
}
