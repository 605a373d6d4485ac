/**
 * The nftables backend: a thin shell around the pure renderer. Read back natgw's tables
 * (`nft -j list table …`), render the difference, apply it as ONE `nft -f -` transaction.
 * Everything it owns lives in `table ip natgw` (and `table ip6 natgw` while IPv6 objects exist).
 */
import type { Logger } from 'pino';
import { ToolError } from '../../../model/errors.js';
import type { ExecResult, Executor } from '../../../system/exec.js';
import type { NatTables, NetfilterBackend, SyncOptions, SyncReport } from '../backend.js';
import { hasSkeleton, natTablesFromKernel, natgwKernel, parseTableListing, type NatgwKernel, type NftTableDump } from './readback.js';
import { NATGW_TABLE, NFT_FAMILIES, needsFamily, renderNatgw, renderRemoveAll, type NftFamily } from './render.js';
import { renderPartial, type NftView } from './partial.js';

/** nft's refusals are ToolErrors like every tool's; the old name stays for its users. */
export { ToolError as NftError } from '../../../model/errors.js';

/** `nft` answers a listing of an absent table with ENOENT's text. */
function isMissingTable(r: ExecResult): boolean {
  return r.exitCode !== 0 && /No such file or directory/.test(r.stderr);
}

/** List one table as JSON; null when it does not exist. Shared with the share-DNAT table. */
export async function listTable(exec: Executor, family: string, table: string): Promise<NftTableDump | null> {
  const args = ['-j', 'list', 'table', family, table];
  const r = await exec.run({ file: 'nft', args });
  if (isMissingTable(r)) return null;
  if (r.exitCode !== 0) throw new ToolError(`nft ${args.join(' ')}`, 'the listing', r.exitCode, r.stderr, undefined, r.timedOut);
  return parseTableListing(r.stdout, family, table);
}

/** Apply a script as one transaction (`nft -f -`). */
export async function applyScript(exec: Executor, script: string): Promise<void> {
  const r = await exec.run({ file: 'nft', args: ['-f', '-'], input: script });
  if (r.exitCode !== 0) throw new ToolError('nft -f -', 'the transaction', r.exitCode, r.stderr, script, r.timedOut);
}

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
    private readonly exec: Executor,
    private readonly log?: Logger,
  ) {}

  /** The `ip natgw` listing the init guard read with `reuseForSync`, for the next sync only. */
  private guardRead: { at: number; dump: NftTableDump | null } | undefined;

  private async kernel(): Promise<NatgwKernel> {
    const cached = this.guardRead && Date.now() - this.guardRead.at < 1000 ? this.guardRead : undefined;
    this.guardRead = undefined;
    const [ip, ip6] = await Promise.all(
      NFT_FAMILIES.map((f: NftFamily) => (f === 'ip' && cached ? Promise.resolve(cached.dump) : listTable(this.exec, f, NATGW_TABLE))),
    );
    return natgwKernel(ip ?? null, ip6 ?? null);
  }

  async isInitialized(opts: { reuseForSync?: boolean } = {}): Promise<boolean> {
    const dump = await listTable(this.exec, 'ip', NATGW_TABLE);
    this.guardRead = opts.reuseForSync ? { at: Date.now(), dump } : undefined;
    return hasSkeleton(dump);
  }

  /** What natgw applied last (partial syncs plan against it); unset until a sync succeeded. */
  private view: NftView | undefined;

  forget(): void {
    this.view = undefined;
  }

  async sync(want: NatTables, opts: SyncOptions = {}): Promise<SyncReport> {
    if (opts.mode === 'partial' && this.view) {
      const plan = renderPartial(this.view, want);
      if (plan) {
        if (opts.dryRun) return plan;
        const script = plan.script + (opts.append ?? '');
        if (script === '') return plan;
        try {
          await applyScript(this.exec, script);
        } catch (e) {
          this.view = undefined;
          throw e;
        }
        this.view = viewOf(want);
        this.log?.debug({ changes: plan.changes }, 'nftables synced (partial)');
        return { ...plan, appended: opts.append !== undefined };
      }
      this.log?.info('nftables: a structural change needs a full sync');
    }
    return this.fullSync(want, opts);
  }

  private async fullSync(want: NatTables, opts: SyncOptions): Promise<SyncReport> {
    const plan = renderNatgw(want, await this.kernel());
    if (opts.dryRun) return plan;
    if (plan.script === '') {
      this.view = viewOf(want);
      return plan;
    }
    this.view = undefined;
    try {
      await applyScript(this.exec, plan.script);
    } catch (err) {
      // Handles in the script come from the read-back; another writer may have moved them
      // since. Render once more against a fresh read-back before giving up.
      if (!(err instanceof ToolError)) throw err;
      this.log?.warn({ err: err.message }, 'nft transaction refused; re-reading and retrying once');
      const again = renderNatgw(want, await this.kernel());
      if (again.script !== '') await applyScript(this.exec, again.script);
      this.view = viewOf(want);
      this.log?.info({ changes: again.changes }, 'nftables synced');
      this.log?.debug({ script: again.script }, 'nft script');
      return again;
    }
    this.view = viewOf(want);
    this.log?.info({ changes: plan.changes }, 'nftables synced');
    this.log?.debug({ script: plan.script }, 'nft script');
    return plan;
  }

  async readBack(): Promise<NatTables | null> {
    return natTablesFromKernel(await this.kernel());
  }

  async removeAll(): Promise<void> {
    this.view = undefined;
    const script = renderRemoveAll(await this.kernel());
    if (script !== '') await applyScript(this.exec, script);
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
