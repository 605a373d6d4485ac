/**
 * The whole state at once: natgw's bulk PUT /v1/state into an empty gateway, and natgw's start
 * with a saved state into an empty namespace (restore), each against applying the very
 * ruleset natgw renders (`PUT /v1/state?dryRun=true` → `script`) with ONE raw tool run in a
 * fresh namespace.
 */
import { copyFileSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Gateway, iptablesTools, withRetryIfVanished, type BackendInfo, type GatewayOptions } from './gateway.js';
import type { Memory } from './daemon.js';
import { progress } from './progress.js';
import { round } from './stats.js';
import { stateDoc } from './workload.js';

export interface BulkFigures {
  readonly size: number;
  readonly documentBytes: number;
  readonly dryRunMs: number;
  readonly putStateMs: number;
  readonly rssAfterPut?: Memory;
  /** The rendered script split by tool: netfilter lines for nft/iptables-restore, address and route lines for ip -batch. */
  readonly scriptLines: { netfilter: number; link: number };
  readonly rawNetfilterMs?: number;
  readonly rawLinkMs?: number;
  readonly rawError?: string;
  /** Spawn → /readyz 200 in a fresh namespace with the state dir kept. */
  readonly restoreCold?: { healthzMs: number; readyzMs: number; rss?: Memory };
  /** Spawn → /readyz 200 in the same namespace, kernel still holding everything. */
  readonly restartWarm?: { healthzMs: number; readyzMs: number; rss?: Memory };
}

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
function copyStateFiles(from: string, to: string): void {
  for (const name of readdirSync(from)) {
    const p = join(from, name);
    if (statSync(p).isFile() && !name.endsWith('.log')) copyFileSync(p, join(to, name));
  }
}

export async function bulkFigures(opts: GatewayOptions, size: number, fipEips: boolean): Promise<BulkFigures> {
  const doc = stateDoc(size, fipEips);
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
        // After the stop: the daemon finishes writing its applied-ruleset cache as it shuts down.
        copyStateFiles(gw.topo.stateDir, saved);
        const warm = await gw.startDaemon();
        return { dryRunMs: round(dry.ms), putStateMs: round(put.ms), rssAfterPut, restartWarm: { ...warm, rss: gw.daemon?.memory() } };
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
        return { ...t, rss: gw.daemon?.memory() };
      },
    );
    return {
      size,
      documentBytes: Buffer.byteLength(JSON.stringify(doc)),
      ...first,
      scriptLines: { netfilter: lines(parts.netfilter), link: lines(parts.link) },
      ...raw,
      restoreCold: { healthzMs: round(restoreCold.healthzMs), readyzMs: round(restoreCold.readyzMs), rss: restoreCold.rss },
    };
  } finally {
    removeSaved();
    process.removeListener('exit', removeSaved);
  }
}

const lines = (s: string): number => (s === '' ? 0 : s.trimEnd().split('\n').length);

async function rawApply(
  opts: GatewayOptions,
  backend: BackendInfo,
  parts: { netfilter: string; link: string },
): Promise<Pick<BulkFigures, 'rawNetfilterMs' | 'rawLinkMs' | 'rawError'>> {
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
