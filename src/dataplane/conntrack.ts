import type { Logger } from 'pino';
import type { ExecResult, Executor } from '../system/exec.js';
import { type ConntrackEntry, parseConntrackLines } from '../model/conntrackLine.js';
import { canonicalIp, familyOf } from '../model/net.js';
import { type HygieneTargets, deleteEntryArgs, staleEntries } from './conntrackStale.js';
import { timelineMark } from '../system/timeline.js';

export interface ConntrackFilter {
  readonly dst: string;
  readonly protocol?: 'tcp' | 'udp';
  readonly port?: number;
  /** With port: the last port of a range (conntrack's own filter takes one port only). */
  readonly portEnd?: number;
}

/** PURE: conntrack arguments deleting entries whose ORIGINAL destination matches. */
export function conntrackDeleteArgs(f: ConntrackFilter): string[] {
  const args = ['-D', '--orig-dst', f.dst];
  if (f.protocol) args.push('-p', f.protocol);
  if (f.protocol && f.port !== undefined) args.push('--orig-port-dst', String(f.port));
  return args;
}

/** A listing, or a restart hygiene's delete, that takes longer is given up (at start it holds readiness). */
const LIST_TIMEOUT_MS = 5000;

const isRange = (f: ConntrackFilter): boolean => f.portEnd !== undefined && f.protocol !== undefined && f.port !== undefined;

/** One key per flush owed: a range and its first port are different debts. */
const filterKey = (f: ConntrackFilter): string => `${conntrackDeleteArgs(f).join(' ')}${isRange(f) ? `-${f.portEnd}` : ''}`;

/** A flush that keeps failing is given up after this many attempts (logged each time). */
const MAX_FLUSH_ATTEMPTS = 5;
/** Flushes run side by side, this many at a time. */
const FLUSH_PARALLELISM = 8;

/** `run` for every item, FLUSH_PARALLELISM at a time. */
async function inParallel<T>(items: readonly T[], run: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < items.length) await run(items[next++] as T);
  };
  await Promise.all(Array.from({ length: Math.min(FLUSH_PARALLELISM, items.length) }, worker));
}
/** Above this many filters, one listing picks the filters that match anything before any delete runs. */
const LIST_FIRST_ABOVE = 16;

/**
 * The kernel's conntrack statistics of this network namespace, one line per CPU under a header;
 * the first column (`entries`) is the namespace's entry count, the same on every line. Reading
 * it walks nothing (~20 µs), where the table's read walks every bucket of the hash (262,144
 * here: ~0.2-0.3 ms of kernel time whatever it holds).
 */
export const PROC_CONNTRACK_STAT = '/proc/net/stat/nf_conntrack';

/**
 * PURE: /proc/net/stat/nf_conntrack text → how many entries the namespace holds; undefined
 * when the text is not that file's (then nothing is proved). The count is of every entry
 * allocated, before it is confirmed into the hash and until it is freed: zero means the table
 * holds nothing, not even the entry of a packet still on its way through the hooks.
 */
export function parseConntrackEntries(text: string): number | undefined {
  const lines = text.split('\n');
  if (lines[0]?.split(/\s+/)[0] !== 'entries') return undefined;
  const first = lines[1]?.split(/\s+/)[0];
  return first !== undefined && /^[0-9a-f]{1,16}$/.test(first) ? Number.parseInt(first, 16) : undefined;
}

/** PURE: whether a flush with this filter would delete the flow. */
export function matches(f: ConntrackFilter, e: Pick<ConntrackEntry, 'protocol' | 'original'>): boolean {
  const { dst, dport } = e.original;
  if (canonicalIp(f.dst) !== dst) return false;
  if (f.protocol && f.protocol !== e.protocol) return false;
  if (!f.protocol || f.port === undefined) return true;
  if (f.portEnd === undefined) return f.port === dport;
  return dport !== undefined && dport >= f.port && dport <= f.portEnd;
}

/**
 * Flush stale conntrack entries after a NAT mapping went away, so existing flows stop using
 * the old translation. conntrack exits 1 when nothing matched; that is success here, and its
 * summary line (on stderr) never reaches natgw's stderr.
 */
export class Conntrack {
  constructor(
    private readonly exec: Executor,
    private readonly log?: Logger,
  ) {}

  /**
   * Flush for every filter, deciding by the tracked connections (flows) where they are known:
   * a filter that matches none owes nothing and is skipped, a port range deletes each port of it
   * that has any. Where they are not (a few filters), each filter runs its delete. `skipped`:
   * the given filters the flows proved owe nothing.
   *
   * Why skipping is safe: the caller flushes after the commit that removed the translation, so
   * from then on no packet is translated by it and no entry that needs the flush is created.
   * With an HA peer, conntrackd writes the peer's flows into this table, so they are counted and
   * listed as any other.
   */
  async flushOwed(given: readonly ConntrackFilter[]): Promise<{ deleted: number; skipped: readonly ConntrackFilter[] }> {
    // Flushes that failed before go again with these (and at every resync, see retryFailed).
    const filters = [...given, ...[...this.failed.values()].map((x) => x.filter)];
    if (filters.length === 0) return { deleted: 0, skipped: [] };
    const flows = await this.flows(filters);
    const skipped: ConntrackFilter[] = [];
    const deletes: ConntrackFilter[] = [];
    for (const f of filters) {
      if (!Array.isArray(flows)) {
        // Not known: a port runs its delete; a range, whose ports only a listing names, is owed.
        if (!isRange(f)) deletes.push(f);
        else if (flows) this.failedFlush(f, flows);
        continue;
      }
      const hits = flows.filter((flow) => matches(f, flow));
      // Nothing to delete, or a range split into its ports: a debt owed from before is paid too.
      if (hits.length === 0 || isRange(f)) this.failed.delete(filterKey(f));
      if (hits.length === 0) {
        if (given.includes(f)) skipped.push(f);
        this.log?.debug({ filter: f }, 'conntrack flush skipped: no tracked connection matches');
      } else if (!isRange(f)) deletes.push(f);
      else for (const port of new Set(hits.map((flow) => flow.original.dport as number))) deletes.push({ dst: f.dst, protocol: f.protocol, port });
    }
    let deleted = 0;
    await inParallel(deletes, async (f) => {
      // Awaited before the sum: `deleted += await …` would add to the value read before the wait.
      const n = await this.flush(f);
      deleted += n;
    });
    return { deleted, skipped };
  }

  /**
   * The tracked connections a flush decides by: none when the entry count says so; else a
   * listing per family, for a bulk of filters (one listing instead of a process per filter) or
   * a port range (its ports). Else undefined (not known), or the listing's result where it failed.
   */
  private async flows(filters: readonly ConntrackFilter[]): Promise<ConntrackEntry[] | ExecResult | undefined> {
    // Most deletes find a table with nothing in it (a gateway nobody connects through yet, the
    // shim talks to the daemon over a Unix socket): the count says so without walking the hash.
    if (await this.tracksNothing()) return [];
    timelineMark('conntrack: table counted');
    if (filters.length <= LIST_FIRST_ABOVE && !filters.some(isRange)) return undefined;
    const listed = await Promise.all([...new Set(filters.map((f) => familyOf(f.dst)))].map((fam) => this.list(fam)));
    const flows: ConntrackEntry[] = [];
    for (const l of listed) {
      if (!Array.isArray(l)) {
        this.log?.warn({ exitCode: l.exitCode, stderr: l.stderr.trim() }, 'conntrack listing failed: flushing filter by filter');
        return l;
      }
      flows.push(...l);
    }
    return flows;
  }

  /** Whether the namespace's entry count (PROC_CONNTRACK_STAT) proves it tracks no connection at all. */
  private async tracksNothing(): Promise<boolean> {
    const stat = await this.exec.readKernelFile?.(PROC_CONNTRACK_STAT);
    return stat !== undefined && parseConntrackEntries(stat) === 0;
  }

  /** One family's `conntrack -L`; the result itself where the listing failed. */
  private async list(family: 4 | 6): Promise<ConntrackEntry[] | ExecResult> {
    const r = await this.exec.run({ file: 'conntrack', args: ['-L', '-f', family === 4 ? 'ipv4' : 'ipv6', '-o', 'extended'], timeoutMs: LIST_TIMEOUT_MS });
    // An empty table may exit 1 with its summary line: that is an answer.
    if (r.failedToStart || r.timedOut || (r.exitCode !== 0 && r.stdout.trim() === '' && !/ 0 flow entries/.test(r.stderr))) return r;
    return parseConntrackLines(r.stdout);
  }

  /**
   * Flushes that failed (a hung or crashed conntrack, a netlink error), by filter, with the
   * attempts made: the change itself is applied and acknowledged, so a failure here is logged
   * at error and retried with the next flush and at every resync, a bounded number of times.
   */
  private readonly failed = new Map<string, { filter: ConntrackFilter; attempts: number }>();

  /** Flushes still owed (for the log and tests). */
  get pendingFlushes(): number {
    return this.failed.size;
  }

  /** Retry the flushes that failed before (the resync calls this). */
  async retryFailed(): Promise<number> {
    return this.failed.size > 0 ? (await this.flushOwed([])).deleted : 0;
  }

  /** Delete the entries of one filter (a single port, or none): the count deleted. */
  async flush(f: ConntrackFilter): Promise<number> {
    const r = await this.exec.run({ file: 'conntrack', args: conntrackDeleteArgs(f) });
    const m = /(\d+) flow entries have been deleted/.exec(r.stderr + r.stdout);
    // conntrack exits 1 with its summary line when nothing matched: that is success.
    if (r.failedToStart || r.timedOut || (r.exitCode !== 0 && !m)) {
      this.failedFlush(f, r);
      return 0;
    }
    this.failed.delete(filterKey(f));
    const n = m ? Number(m[1]) : 0;
    this.log?.info({ filter: f, deleted: n }, 'conntrack flushed');
    return n;
  }

  /** A flush (or the listing a range needs) failed: owed again a bounded number of times, unless the tool is missing. */
  private failedFlush(f: ConntrackFilter, r: ExecResult): void {
    const key = filterKey(f);
    if (r.failedToStart) {
      this.log?.warn({ filter: f }, 'conntrack tool missing: stale connections were not flushed');
      this.failed.delete(key);
      return;
    }
    const attempts = (this.failed.get(key)?.attempts ?? 0) + 1;
    if (attempts >= MAX_FLUSH_ATTEMPTS) this.failed.delete(key);
    else this.failed.set(key, { filter: f, attempts });
    this.log?.error(
      { filter: f, exitCode: r.exitCode, timedOut: r.timedOut, stderr: r.stderr.trim().slice(0, 500), attempts, willRetry: attempts < MAX_FLUSH_ATTEMPTS },
      'conntrack flush failed: connections may keep the old translation',
    );
  }

  /**
   * Restart hygiene: list both families at once (the listing holds the daemon's readiness after
   * a start), then delete, entry by exact tuple, every untranslated entry that touches the
   * targets (conntrackStale.ts). Each tool run is bounded by LIST_TIMEOUT_MS; a missing tool or
   * a failed listing is logged and skips that family.
   */
  async deleteUntranslated(targets: HygieneTargets): Promise<ConntrackEntry[]> {
    // A pod just (re)started holds no entry at all: the count says so without two processes.
    if (await this.tracksNothing()) return [];
    const stale: ConntrackEntry[] = [];
    for (const listed of await Promise.all(([4, 6] as const).map((fam) => this.list(fam)))) {
      if (Array.isArray(listed)) stale.push(...staleEntries(listed, targets));
      else this.log?.warn({ exitCode: listed.exitCode, stderr: listed.stderr.trim() }, 'conntrack listing failed: untranslated entries not cleaned up');
    }
    const deleted: ConntrackEntry[] = [];
    await inParallel(stale, async (e) => {
      // Exit 1 means the entry went away meanwhile (timed out, or a packet replaced it): nothing to do.
      const r = await this.exec.run({ file: 'conntrack', args: deleteEntryArgs(e), timeoutMs: LIST_TIMEOUT_MS });
      if (r.exitCode === 0) deleted.push(e);
    });
    return deleted;
  }
}
