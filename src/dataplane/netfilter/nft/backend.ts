/**
 * The nftables backend: a thin shell around the pure renderer. Read back natgw's tables
 * through the NftClient, render the difference, apply it as ONE transaction. Everything it
 * owns lives in `table ip natgw` (and `table ip6 natgw` while IPv6 objects exist).
 */
import { availableParallelism } from 'node:os';
import type { Logger } from 'pino';
import { ExecError, type Executor } from '../../../system/exec.js';
import { withReplicaRules, type NatTables, type NetfilterBackend, type ReplicaRules, type SyncOptions, type SyncReport } from '../backend.js';
import { runPhases, SystemNftClient, type NftClient } from './client.js';
import { hasSkeleton, natTablesFromKernel, natgwKernel } from './readback.js';
import type { NatgwKernel, NftFamily } from './types.js';
import { NATGW_TABLE, NFT_FAMILIES, needsFamily, planNatgw, removeAllTx, textPlan, type NftTxPlan } from './render.js';
import { planPartial, type NftView } from './partial.js';
import { NftTransaction } from './transaction.js';
import { phases, type PhaseOptions } from './phases.js';
import { timelineMark } from '../../../system/timeline.js';

/**
 * The iptables version line when no iptables tool is installed. SPEC §2 get-iptables-version:
 * the controller enables --random-fully above 1.6.2, which nftables always supports, so this is
 * the iptables release whose semantics natgw reproduces — never nft's own version (1.0.x would
 * read as "older than 1.6.2" and switch --random-fully off).
 */
const FALLBACK_VERSION_LINE = 'iptables v1.8.9 (natgw-nftables)';
const VERSION_LINE = /^iptables v\d+(\.\d+)+/;
const IPTABLES_TOOLS = ['iptables', 'iptables-nft', 'iptables-legacy'] as const;

/**
 * When a change into absent tables is applied in phases (phases.ts). Below ~10,000 elements the
 * two extra `nft` runs cost what the parallel groups save (measured on 2 cores: 7,500 elements
 * even, 30,000 elements 0.75× one `nft -f`); one group per core, at most 4.
 * Kept for the bulk target (PUT /v1/state at most 2× one raw `nft -f`): with phases ×1.2–1.5,
 * as one `nft -f` ×2.0–2.3 (bench, 10,000 DNAT + FIP, alternated in one session). It rests on
 * nft accepting elements into an unhooked table from several processes at once and on
 * `create table` refusing an existing table; an nft that serialised those would void the gain.
 */
const PHASING: PhaseOptions = { minElements: 10_000, groups: Math.min(availableParallelism(), 4) };

/** natgw's tables absent. */
const NO_TABLES: NatgwKernel = { ip: null, ip6: null };

/** natgw owns no table (as last read): the next change creates them without reading back. */
const ABSENT: NftView = {
  tables: { vpcIf: '', extIf: '', eips: [], snats: [], dnats: [], fips: [] },
  families: new Set(),
};

/** The kernel as a successful apply of `t` left it. */
function viewOf(t: NatTables): NftView {
  return { tables: t, families: new Set(NFT_FAMILIES.filter((f) => needsFamily(t, f))) };
}

export class NftBackend implements NetfilterBackend {
  readonly kind = 'nftables' as const;

  constructor(
    /** For the iptables version line only: nftables itself is reached through the NftClient. */
    private readonly exec: Executor,
    private readonly log?: Logger,
    private readonly nft: NftClient = new SystemNftClient(exec),
    private readonly phasing: PhaseOptions = PHASING,
    /** What this replica adds to every state's rules (a port slice, invalid dropped). */
    private readonly replica?: ReplicaRules,
  ) {}

  private async kernel(): Promise<NatgwKernel> {
    const [ip, ip6] = await Promise.all(NFT_FAMILIES.map((f) => this.nft.list(f, NATGW_TABLE)));
    return natgwKernel(ip ?? null, ip6 ?? null);
  }

  async isInitialized(): Promise<boolean> {
    return hasSkeleton(await this.nft.list('ip', NATGW_TABLE));
  }

  /** What natgw applied last (partial syncs plan against it); unset until a sync succeeded. */
  private view: NftView | undefined;

  forget(): void {
    this.view = undefined;
  }

  async sync(given: NatTables, opts: SyncOptions = {}): Promise<SyncReport> {
    const want = withReplicaRules(given, this.replica);
    const view = this.view;
    if (opts.mode === 'partial' && view) {
      // Tables the last read found absent (observe) are rendered whole, nothing read back: a table
      // someone created since makes the transaction fail, and the engine retries as a full sync.
      // A partial plan never adds or drops a family's table (that needs a full sync).
      const absent = view.families.size === 0;
      const planned = absent ? planNatgw(want, NO_TABLES) : planPartial(view, want, opts.change);
      if (planned) {
        if (opts.dryRun) return textPlan(planned);
        return this.apply(want, planned, await opts.append, absent ? undefined : view.families);
      }
      this.log?.info('nftables: a structural change needs a full sync');
    }
    // The appended part may list its own table: both listings run at once.
    const [kernel, extra] = await Promise.all([this.kernel(), opts.dryRun ? undefined : opts.append]);
    const planned = planNatgw(want, kernel);
    if (opts.dryRun) return textPlan(planned);
    try {
      const report = await this.apply(want, planned, extra);
      // The script of an edit of tables that exist; a creation's (megabytes in a bulk load) is not logged.
      if (kernel.ip || kernel.ip6) this.log?.debug({ script: report.script }, 'nft script');
      return report;
    } catch (err) {
      // Handles in the script come from the read-back; another writer may have moved them
      // since (or created a table this one creates). Render once more against a fresh read-back
      // before giving up, without the appended part (its owner then syncs it on its own).
      if (!(err instanceof ExecError)) throw err;
      this.log?.warn({ err: err.message }, 'nft transaction refused; re-reading and retrying once');
      const report = await this.apply(want, planNatgw(want, await this.kernel()), undefined);
      return extra ? { ...report, appended: false } : report;
    }
  }

  /**
   * Run a plan with the appended part: one transaction, or in phases where it creates natgw's
   * tables and is large (phases.ts). `families`: those the view keeps (a partial plan's), else
   * found from `want`.
   */
  private async apply(want: NatTables, planned: NftTxPlan, extra: NftTransaction | undefined, families?: ReadonlySet<NftFamily>): Promise<SyncReport> {
    const tx = NftTransaction.concat(planned.tx, extra);
    this.view = undefined;
    const phased = tx.isEmpty ? null : phases(tx, this.phasing);
    // run() has started the tool when it returns: the report's script (a megabyte joined) and
    // the view are made while the kernel applies, not after it.
    const applying = tx.isEmpty ? undefined : phased ? this.runPhased(phased) : this.nft.run(tx);
    applying?.catch(() => undefined);
    const plan = textPlan(planned);
    const view: NftView = families ? { tables: want, families } : viewOf(want);
    if (applying) await applying;
    timelineMark('nft: applied');
    this.view = view;
    if (families) this.log?.debug({ changes: plan.changes }, 'nftables synced (partial)');
    else this.log?.info({ changes: plan.changes, phased: phased !== null }, 'nftables synced');
    return extra ? { ...plan, appended: true } : plan;
  }

  /** A change into absent tables in phases: elements loaded by several `nft` at once, unhooked. */
  private async runPhased(p: NonNullable<ReturnType<typeof phases>>): Promise<void> {
    const ms = await runPhases(this.nft, p, (err) =>
      this.log?.error({ err, tables: p.created.map((t) => `${t.family} ${t.name}`) }, 'nft: a phased apply failed and its tables could not be deleted'),
    );
    const round = (x: number) => Math.round(x * 10) / 10;
    this.log?.debug(
      { path: 'phased', groups: p.groups.length, elements: p.elements, ms: { first: round(ms.first), groups: round(ms.groups), last: round(ms.last) } },
      'nft: absent tables applied in phases',
    );
  }

  async observe(): Promise<void> {
    if (this.view) return;
    const k = await this.kernel();
    if (k.ip === null && k.ip6 === null) this.view = ABSENT;
  }

  async readBack(): Promise<NatTables | null> {
    return natTablesFromKernel(await this.kernel());
  }

  async removeAll(): Promise<void> {
    this.view = undefined;
    await this.nft.run(removeAllTx(await this.kernel()));
  }

  async versionLine(): Promise<string> {
    for (const file of IPTABLES_TOOLS) {
      const r = await this.exec.run({ file, args: ['--version'] });
      const line = r.exitCode === 0 ? r.stdout.trim().split('\n')[0]?.trim() : undefined;
      if (line && VERSION_LINE.test(line)) return line;
    }
    return FALLBACK_VERSION_LINE;
  }
}
