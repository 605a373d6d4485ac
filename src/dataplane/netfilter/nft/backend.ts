/**
 * The nftables backend: a thin shell around the pure renderer. Read back natgw's tables
 * through the NftClient, render the difference, apply it as ONE transaction. Everything it
 * owns lives in `table ip natgw` (and `table ip6 natgw` while IPv6 objects exist).
 */
import type { Logger } from 'pino';
import { ToolError } from '../../../model/errors.js';
import type { Executor } from '../../../system/exec.js';
import type { NatTables, NetfilterBackend, SyncOptions, SyncReport } from '../backend.js';
import { SystemNftClient, type NftClient } from './client.js';
import { hasSkeleton, natTablesFromKernel, natgwKernel, type NatgwKernel, type NftTableDump } from './readback.js';
import { NATGW_TABLE, NFT_FAMILIES, needsFamily, planNatgw, removeAllTx, textPlan, type NftFamily, type NftTxPlan } from './render.js';
import { planPartial, type NftView } from './partial.js';
import { NftTransaction } from './transaction.js';

/** nft's refusals are ToolErrors like every tool's; the old name stays for its users. */
export { ToolError as NftError } from '../../../model/errors.js';

/**
 * The iptables version line when no iptables tool is installed. SPEC §2 get-iptables-version:
 * the controller enables --random-fully above 1.6.2, which nftables always supports, so this is
 * the iptables release whose semantics natgw reproduces — never nft's own version (1.0.x would
 * read as "older than 1.6.2" and switch --random-fully off).
 */
export const FALLBACK_VERSION_LINE = 'iptables v1.8.9 (natgw-nftables)';
const VERSION_LINE = /^iptables v\d+(\.\d+)+/;
const IPTABLES_TOOLS = ['iptables', 'iptables-nft', 'iptables-legacy'] as const;

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
    if (opts.mode === 'partial' && view) {
      const partial = planPartial(view, want);
      if (partial) {
        const plan = textPlan(partial);
        if (opts.dryRun) return plan;
        const tx = NftTransaction.concat(partial.tx, opts.append);
        if (tx.isEmpty) return plan;
        try {
          await this.nft.run(tx, { partial: true });
        } catch (e) {
          this.view = undefined;
          throw e;
        }
        // A partial plan never adds or drops a family's table (that needs a full sync).
        this.view = { tables: want, families: view.families };
        this.log?.debug({ changes: plan.changes }, 'nftables synced (partial)');
        return { ...plan, appended: opts.append !== undefined };
      }
      this.log?.info('nftables: a structural change needs a full sync');
    }
    return this.fullSync(want, opts);
  }

  private async fullSync(want: NatTables, opts: SyncOptions): Promise<SyncReport> {
    let planned: NftTxPlan = planNatgw(want, await this.kernel());
    if (opts.dryRun) return textPlan(planned);
    if (planned.tx.isEmpty) {
      this.view = viewOf(want);
      return textPlan(planned);
    }
    this.view = undefined;
    try {
      await this.nft.run(planned.tx);
    } catch (err) {
      // Handles in the script come from the read-back; another writer may have moved them
      // since. Render once more against a fresh read-back before giving up.
      if (!(err instanceof ToolError)) throw err;
      this.log?.warn({ err: err.message }, 'nft transaction refused; re-reading and retrying once');
      planned = planNatgw(want, await this.kernel());
      await this.nft.run(planned.tx);
    }
    this.view = viewOf(want);
    const plan = textPlan(planned);
    this.log?.info({ changes: plan.changes }, 'nftables synced');
    this.log?.debug({ script: plan.script }, 'nft script');
    return plan;
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
