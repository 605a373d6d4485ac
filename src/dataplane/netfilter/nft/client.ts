/**
 * The one door to nftables for natgw's three users (the NAT backend, share DNAT, accounting),
 * after knftables' Interface: JSON for reads, one plain-text transaction for writes. The
 * system client runs `nft` through the Executor; tests put an in-memory fake behind the same
 * interface (test/helpers/fakeNft.ts).
 */
import { ExecError, type ExecResult, type Executor, runChecked } from '../../../system/exec.js';
import { parseTableListing } from './readback.js';
import { dropCreated, type NftPhases } from './phases.js';
import type { NftTableFamily, NftTransaction } from './transaction.js';
import type { NftTableDump } from './types.js';

export interface NftClient {
  /** Whether nftables answers here at all (knftables' Present): the backend choice weighs it. */
  present(): Promise<boolean>;
  /** One table as `nft -j list table` shows it; null when it does not exist. Other failures throw ExecError. */
  list(family: NftTableFamily, table: string): Promise<NftTableDump | null>;
  /**
   * Apply one transaction atomically: all of it or, on a refusal (ExecError), none of it.
   * An empty transaction runs nothing. Text is accepted for scripts of objects NftTransaction
   * does not model (the connection timeouts' ct timeout objects, the uplinks' marks).
   * `concurrent`: one of several transactions run at once (a phased apply's groups), each as its
   * own `nft` process.
   */
  run(tx: NftTransaction | string, opts?: { readonly concurrent?: boolean }): Promise<void>;
  /**
   * One table as `nft -j list table` prints it, unparsed, for a user whose objects the dump does
   * not model (the connection timeouts' `ct timeout` objects and rule comments); null when it
   * does not exist. Optional: a client without it cannot serve that user.
   */
  listJson?(family: NftTableFamily, table: string): Promise<string | null>;
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

/** The tool's error, naming the phase it refused. */
const inPhase =
  (phase: 'first' | 'groups' | 'last') =>
  (e: unknown): never => {
    throw e instanceof ExecError ? new ExecError(e, `the ${phase} phase of the transaction`, e.script) : e;
  };

/**
 * Run phases (phases.ts): the first, then the groups at once, then the last. A refusal of the
 * first leaves nothing (one transaction). A refusal after it deletes the tables the first created
 * (only those: it created them with `create table`) before the tool's error is thrown, once every
 * group has ended, so nothing stays half-applied. When even that delete is refused,
 * `onUndoFailed` hears why; the error thrown is still the phase's.
 */
export async function runPhases(nft: NftClient, p: NftPhases, onUndoFailed?: (err: unknown) => void): Promise<PhaseTimings> {
  const t0 = performance.now();
  await nft.run(p.first).catch(inPhase('first'));
  const t1 = performance.now();
  let t2 = t1;
  try {
    const settled = await Promise.allSettled(p.groups.map((g) => nft.run(g, { concurrent: true }).catch(inPhase('groups'))));
    const refused = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (refused) throw refused.reason;
    t2 = performance.now();
    await nft.run(p.last).catch(inPhase('last'));
  } catch (e) {
    await nft.run(dropCreated(p)).catch((undo: unknown) => onUndoFailed?.(undo));
    throw e;
  }
  return { first: t1 - t0, groups: t2 - t1, last: performance.now() - t2 };
}
