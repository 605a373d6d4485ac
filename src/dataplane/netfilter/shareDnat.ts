/**
 * Share DNAT in `table ip kube-ovn` (SPEC §2 nft-dnat-map-add/del), used by both netfilter
 * backends. The objects and the two-transaction protocol are described in shareDnatRender.ts;
 * this class only reads back, applies and retries. Conntrack flushes after a delete are the
 * engine's (state/operations.ts returns them as effects), never done here.
 */
import type { Logger } from 'pino';
import type { ShareDnat } from '../../model/rules.js';
import { ExecError, type Executor } from '../../system/exec.js';
import type { SyncOptions, SyncReport } from './backend.js';
import { SystemNftClient, type NftClient } from './nft/client.js';
import type { NftTableDump } from './nft/types.js';
import { KUBE_OVN_TABLE, type SharePlan, type ShareView, dedupe, deleteChainsTx, planShareDnat, shareDnatsFromKernel } from './shareDnatRender.js';

export class ShareDnatTable {
  /** What natgw's part of `table ip kube-ovn` held at the last read or successful apply; null: the table is absent. */
  private trusted: ShareView | null | undefined;

  private readonly nft: NftClient;

  constructor(
    exec: Executor,
    private readonly log?: Logger,
    nft?: NftClient,
  ) {
    this.nft = nft ?? new SystemNftClient(exec);
  }

  private read(): Promise<NftTableDump | null> {
    return this.nft.list('ip', KUBE_OVN_TABLE);
  }

  /** Make the share-DNAT objects hold exactly `items` (element-level; see shareDnatRender.ts). */
  async sync(items: readonly ShareDnat[], opts: SyncOptions = {}): Promise<SyncReport> {
    const kept = opts.mode === 'partial' ? this.trusted : undefined;
    const have = kept !== undefined ? kept : await this.read();
    let plan = planShareDnat(items, have);
    const script = (p: SharePlan): string => p.tx.text() + deleteChainsTx(p.staleChains).text();
    if (opts.dryRun) return { changes: plan.changes, script: script(plan) };
    if (plan.changes === 0) {
      this.trusted = have && { items: dedupe(items), leftover: [] };
      return { changes: 0, script: '' };
    }

    try {
      try {
        await this.nft.run(plan.tx);
      } catch (err) {
        // Another writer may have changed the table since the read-back (handles, elements):
        // render once more against a fresh one before giving up.
        if (!(err instanceof ExecError)) throw err;
        this.log?.warn({ err: err.message }, 'share dnat transaction refused; re-reading and retrying once');
        plan = planShareDnat(items, await this.read());
        await this.nft.run(plan.tx);
      }
      this.trusted = { items: dedupe(items), leftover: await this.deleteChains(plan.staleChains) };
    } catch (err) {
      this.forget();
      throw err;
    }
    this.log?.info({ changes: plan.changes, partial: kept !== undefined }, 'share dnat synced');
    return { changes: plan.changes, script: script(plan) };
  }

  /** Stop trusting the kept view: the next sync reads the table back. */
  forget(): void {
    this.trusted = undefined;
  }

  /**
   * Delete flushed, unreferenced chains: all in one transaction, else one by one. A refusal
   * (EBUSY on kernels before 6.2) leaves the chain flushed; the next sync deletes it.
   * Returns the chains still there.
   */
  private async deleteChains(chains: readonly string[]): Promise<string[]> {
    if (chains.length === 0) return [];
    try {
      await this.nft.run(deleteChainsTx(chains));
      return [];
    } catch (err) {
      if (!(err instanceof ExecError)) throw err;
    }
    const left: string[] = [];
    for (const c of chains) {
      try {
        await this.nft.run(deleteChainsTx([c]));
      } catch (err) {
        if (!(err instanceof ExecError)) throw err;
        this.log?.info({ chain: c, err: err.message }, 'stale share dnat chain not deleted yet; a later sync retries');
        left.push(c);
      }
    }
    return left;
  }

  /** The share DNATs the kernel holds (adoption); protocolText is the spelling that names the chain. */
  async readBack(): Promise<ShareDnat[]> {
    return shareDnatsFromKernel(await this.read());
  }
}
