/**
 * The one door to nftables for natgw's three users (the NAT backend, share DNAT, accounting),
 * after knftables' Interface: JSON for reads, one plain-text transaction for writes. The
 * system client runs `nft` through the Executor; tests put an in-memory fake behind the same
 * interface (test/helpers/fakeNft.ts).
 */
import { rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { ExecError, type ExecResult, type Executor, runChecked } from '../../../system/exec.js';
import { parseTableListing } from './readback.js';
import { dropCreated, type NftPhases } from './phases.js';
import { phaseRun } from './phaseScript.js';
import type { NftTableFamily, NftTransaction } from './transaction.js';
import type { NftTableDump } from './types.js';
import { timelineMark } from '../../../system/timeline.js';

export interface NftClient {
  /** Whether nftables answers here at all (knftables' Present): the backend choice weighs it. */
  present(): Promise<boolean>;
  /** One table as `nft -j list table` shows it; null when it does not exist. Other failures throw ExecError. */
  list(family: NftTableFamily, table: string): Promise<NftTableDump | null>;
  /**
   * Apply one transaction atomically: all of it or, on a refusal (ExecError), none of it.
   * An empty transaction runs nothing. Text is accepted for scripts of objects NftTransaction
   * does not model (the connection timeouts' ct timeout objects, the uplinks' marks).
   */
  run(tx: NftTransaction | string): Promise<void>;
  /**
   * One table as `nft -j list table` prints it, unparsed, for a user whose objects the dump does
   * not model (the connection timeouts' `ct timeout` objects and rule comments); null when it
   * does not exist. Optional: a client without it cannot serve that user.
   */
  listJson?(family: NftTableFamily, table: string): Promise<string | null>;
  /**
   * Run phases (phases.ts) in order, the groups at once; throws PhaseRefused. Optional: without
   * it runPhases() runs them one `run()` at a time.
   */
  runPhases?(p: NftPhases): Promise<PhaseTimings>;
}

/**
 * A table listing's JSON from nft's answer (the tool's or libnftables'): null for an absent table,
 * which nft answers with ENOENT's text; any other failure throws.
 */
export function listingText(r: ExecResult): string | null {
  if (r.exitCode !== 0 && /No such file or directory/.test(r.stderr)) return null;
  if (r.exitCode !== 0) throw new ExecError(r, 'the listing');
  return r.stdout;
}

export class SystemNftClient implements NftClient {
  constructor(private readonly exec: Executor) {}

  /**
   * The phases sequenced by one small bash process, not by natgw's event loop: a bulk change
   * hashes and serialises its new state on natgw's thread while the kernel applies, and a phase
   * that ended during that work would wait for it before the next one started (measured: the
   * groups started 20-90 ms after the first phase ended). The scripts are files in a private
   * temporary directory, written before the start; the bash text is constant, their paths its
   * arguments. Each `nft` reads its phase on stdin, as every other natgw run does.
   */
  async runPhases(p: NftPhases): Promise<PhaseTimings> {
    let run: ReturnType<typeof phaseRun>;
    try {
      const texts = { first: p.first.text(), groups: p.groups.map((g) => g.text()), last: p.last.text() };
      timelineMark('nft: phase texts');
      run = phaseRun(texts, tmpdir(), 'natgw-phases');
    } catch {
      // No temp directory to write to (a read-only /tmp): the event loop sequences them.
      return runInTurn(this, p);
    }
    timelineMark('nft: phase files written');
    try {
      const [file, ...args] = run.argv as [string, ...string[]];
      const r = await this.exec.run({ file, args });
      const stamps = [...r.stdout.matchAll(/^t (\d+)[.,](\d{6})$/gm)].map((m) => Number(m[1]) * 1000 + Number(m[2]) / 1000);
      if (r.exitCode === 0 && stamps.length === 4) {
        const [a, b, c, d] = stamps as [number, number, number, number];
        return { first: b - a, groups: c - b, last: d - c };
      }
      const failed = /^natgw-phase-refused: (\w+)$/m.exec(r.stderr)?.[1] ?? (stamps.length >= 2 ? (stamps.length >= 3 ? 'last' : 'groups') : 'first');
      const stderr = r.stderr.replace(/^natgw-phase-refused: \w+\n?/m, '');
      const script = failed === 'first' ? p.first.text() : failed === 'last' ? p.last.text() : undefined;
      // The first phase committed once its stamp was written: only then are the tables natgw's to delete.
      throw new PhaseRefused(new ExecError({ ...r, command: 'nft -f -', stderr }, `the ${failed} phase of the transaction`, script), stamps.length >= 2);
    } finally {
      rmSync(run.dir, { recursive: true, force: true });
    }
  }

  async present(): Promise<boolean> {
    return (await this.exec.run({ file: 'nft', args: ['list', 'tables'] })).exitCode === 0;
  }

  async list(family: NftTableFamily, table: string): Promise<NftTableDump | null> {
    const text = await this.listJson(family, table);
    return text === null ? null : parseTableListing(text, family, table);
  }

  async listJson(family: NftTableFamily, table: string): Promise<string | null> {
    return listingText(await this.exec.run({ file: 'nft', args: ['-j', 'list', 'table', family, table] }));
  }

  async run(tx: NftTransaction | string): Promise<void> {
    const script = typeof tx === 'string' ? tx : tx.text();
    if (script === '') return;
    await runChecked(this.exec, { file: 'nft', args: ['-f', '-'], input: script }, 'the transaction');
  }
}

/** Milliseconds each phase of a phased apply took (what the backend logs at debug). */
export interface PhaseTimings {
  readonly first: number;
  readonly groups: number;
  readonly last: number;
}

/** A phase refused: `cause` is the tool's error; `undo` when the first phase had committed (its tables stay until deleted). */
class PhaseRefused extends Error {
  constructor(
    override readonly cause: unknown,
    readonly undo: boolean,
  ) {
    super(cause instanceof Error ? cause.message : String(cause));
  }
}

/** The phases one `run()` at a time (the groups at once), for a client without runPhases (the fake). */
async function runInTurn(nft: NftClient, p: NftPhases): Promise<PhaseTimings> {
  const t0 = performance.now();
  await nft.run(p.first).catch((e: unknown) => {
    throw new PhaseRefused(e, false);
  });
  const t1 = performance.now();
  const settled = await Promise.allSettled(p.groups.map((g) => nft.run(g)));
  const refused = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (refused) throw new PhaseRefused(refused.reason, true);
  const t2 = performance.now();
  await nft.run(p.last).catch((e: unknown) => {
    throw new PhaseRefused(e, true);
  });
  return { first: t1 - t0, groups: t2 - t1, last: performance.now() - t2 };
}

/**
 * Run phases through any client: the first, then the groups at once, then the last. A refusal
 * after the first deletes the tables the first created (only those: it created them with
 * `create table`) before the tool's error is thrown, once every group has ended, so nothing
 * stays half-applied; a refusal of the first left nothing (one transaction). When even that
 * delete is refused, `onUndoFailed` hears why; the error thrown is still the phase's.
 */
export async function runPhases(nft: NftClient, p: NftPhases, onUndoFailed?: (err: unknown) => void): Promise<PhaseTimings> {
  try {
    return await (nft.runPhases ? nft.runPhases(p) : runInTurn(nft, p));
  } catch (e) {
    if (!(e instanceof PhaseRefused)) throw e;
    if (e.undo) {
      try {
        await nft.run(dropCreated(p));
      } catch (undo) {
        onUndoFailed?.(undo);
      }
    }
    throw e.cause;
  }
}
