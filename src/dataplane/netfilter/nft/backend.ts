/**
 * The nftables backend: a thin shell around the pure renderer. Read back natgw's tables
 * through the NftClient, render the difference, apply it as ONE transaction. Everything it
 * owns lives in `table ip natgw` (and `table ip6 natgw` while IPv6 objects exist).
 */
import type { Logger } from 'pino';
import { ExecError, type Executor } from '../../../system/exec.js';
import type { NatTables, NetfilterBackend, SyncOptions, SyncReport } from '../backend.js';
import { SystemNftClient, type NftClient } from './client.js';
import { hasSkeleton, natTablesFromKernel, natgwKernel, type NatgwKernel, type NftTableDump } from './readback.js';
import { NATGW_TABLE, NFT_FAMILIES, natgwTable, needsFamily, planNatgw, removeAllTx, textPlan, type NftFamily, type NftTxPlan } from './render.js';
import { planPartial, type NftView } from './partial.js';
import { NftTransaction } from './transaction.js';
import { timelineMark } from '../../../system/timeline.js';

/**
 * The iptables version line when no iptables tool is installed. SPEC §2 get-iptables-version:
 * the controller enables --random-fully above 1.6.2, which nftables always supports, so this is
 * the iptables release whose semantics natgw reproduces — never nft's own version (1.0.x would
 * read as "older than 1.6.2" and switch --random-fully off).
 */
export const FALLBACK_VERSION_LINE = 'iptables v1.8.9 (natgw-nftables)';
const VERSION_LINE = /^iptables v\d+(\.\d+)+/;
const IPTABLES_TOOLS = ['iptables', 'iptables-nft', 'iptables-legacy'] as const;

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
  ) {}

  /** The `ip natgw` listing the init guard read with `reuseForSync`, for the next sync only. */
  private guardRead: { at: number; dump: NftTableDump | null } | undefined;

  dropGuardRead(): void {
    this.guardRead = undefined;
  }

  private async kernel(): Promise<NatgwKernel> {
    const cached = this.guardRead && Date.now() - this.guardRead.at < 1000 ? this.guardRead : undefined;
    this.guardRead = undefined;
    const [ip, ip6] = await Promise.all(
      NFT_FAMILIES.map((f: NftFamily) => (f === 'ip' && cached ? Promise.resolve(cached.dump) : this.nft.list(f, NATGW_TABLE))),
    );
    return natgwKernel(ip ?? null, ip6 ?? null);
  }

  async isInitialized(opts: { reuseForSync?: boolean } = {}): Promise<boolean> {
    const dump = await this.nft.list('ip', NATGW_TABLE);
    this.guardRead = opts.reuseForSync ? { at: Date.now(), dump } : undefined;
    return hasSkeleton(dump);
  }

  /** What natgw applied last (partial syncs plan against it); unset until a sync succeeded. */
  private view: NftView | undefined;

  forget(): void {
    this.view = undefined;
  }

  async sync(want: NatTables, opts: SyncOptions = {}): Promise<SyncReport> {
    const view = this.view;
    if (opts.mode === 'partial' && view && view.families.size === 0) return this.syncFromAbsent(want, opts);
    if (opts.mode === 'partial' && view) {
      const partial = planPartial(view, want);
      if (partial) {
        const plan = textPlan(partial);
        if (opts.dryRun) return plan;
        const extra = await opts.append;
        const tx = NftTransaction.concat(partial.tx, extra);
        if (tx.isEmpty) return extra ? { ...plan, appended: true } : plan;
        try {
          await this.nft.run(tx);
        } catch (e) {
          this.view = undefined;
          throw e;
        }
        // A partial plan never adds or drops a family's table (that needs a full sync).
        this.view = { tables: want, families: view.families };
        this.log?.debug({ changes: plan.changes }, 'nftables synced (partial)');
        return extra ? { ...plan, appended: true } : plan;
      }
      this.log?.info('nftables: a structural change needs a full sync');
    }
    return this.fullSync(want, opts);
  }

  /**
   * The first change into a gateway whose tables the last read found absent (observe): the
   * whole tables rendered from scratch, nothing read back. A table someone created since makes
   * the transaction fail; the engine then retries as a full sync.
   */
  private async syncFromAbsent(want: NatTables, opts: SyncOptions): Promise<SyncReport> {
    const planned = planNatgw(want, natgwKernel(null, null));
    timelineMark('nft: planned and rendered');
    if (opts.dryRun) return textPlan(planned);
    const extra = await opts.append;
    timelineMark('nft: accounting appended');
    // `create table` first: the kernel refuses it where someone made the table since natgw
    // looked, so natgw never merges its chains into another writer's table (the `add table`
    // of the plan that follows is then a no-op on the table just created).
    const created = new NftTransaction();
    for (const f of NFT_FAMILIES) if (needsFamily(want, f)) created.createTable(natgwTable(f));
    const tx = NftTransaction.concat(planned.tx, extra);
    this.view = undefined;
    if (!tx.isEmpty) await this.nft.run(NftTransaction.concat(created, tx));
    timelineMark('nft: applied');
    this.view = viewOf(want);
    const plan = textPlan(planned);
    this.log?.debug({ changes: plan.changes }, 'nftables synced (partial, into absent tables)');
    return extra ? { ...plan, appended: true } : plan;
  }

  private async fullSync(want: NatTables, opts: SyncOptions): Promise<SyncReport> {
    // The appended part may list its own table: both listings run at once.
    const [kernel, extra] = await Promise.all([this.kernel(), opts.dryRun ? undefined : opts.append]);
    // None of natgw's tables is there (a restore at start in a fresh namespace): they are
    // created as the first change into absent tables creates them. A refusal there (a table made meanwhile) is left to the one transaction below, which re-reads and retries.
    if (!opts.dryRun && kernel.ip === null && kernel.ip6 === null) {
      try {
        return await this.syncFromAbsent(want, { ...opts, append: Promise.resolve(extra) });
      } catch (err) {
        if (!(err instanceof ExecError)) throw err;
        this.log?.warn({ err: err.message }, 'nft: creating the absent tables was refused; applying them as one transaction');
      }
    }
    let planned: NftTxPlan = planNatgw(want, kernel);
    if (opts.dryRun) return textPlan(planned);
    let appended = extra !== undefined;
    const tx = NftTransaction.concat(planned.tx, extra);
    if (tx.isEmpty) {
      this.view = viewOf(want);
      return extra ? { ...textPlan(planned), appended } : textPlan(planned);
    }
    this.view = undefined;
    try {
      await this.nft.run(tx);
    } catch (err) {
      // Handles in the script come from the read-back; another writer may have moved them
      // since. Render once more against a fresh read-back before giving up, without the
      // appended part (its owner then syncs it on its own).
      if (!(err instanceof ExecError)) throw err;
      this.log?.warn({ err: err.message }, 'nft transaction refused; re-reading and retrying once');
      planned = planNatgw(want, await this.kernel());
      appended = false;
      if (!planned.tx.isEmpty) await this.nft.run(planned.tx);
    }
    this.view = viewOf(want);
    const plan = textPlan(planned);
    this.log?.info({ changes: plan.changes }, 'nftables synced');
    this.log?.debug({ script: plan.script }, 'nft script');
    return extra ? { ...plan, appended } : plan;
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
