/**
 * Share DNAT in `table ip kube-ovn` (SPEC §2 nft-dnat-map-add/del), used by both netfilter
 * backends. The objects and the two-transaction protocol are described in shareDnatRender.ts;
 * this class only reads back, applies and retries. Conntrack flushes after a delete are the
 * engine's (state/operations.ts returns them as effects), never done here.
 */
import type { Logger } from 'pino';
import type { ShareDnat } from '../../model/rules.js';
import type { Executor } from '../../system/exec.js';
import type { SyncOptions, SyncReport } from './backend.js';
import { NftError, applyScript, listTable } from './nft/backend.js';
import type { NftTableDump } from './nft/readback.js';
import {
  KUBE_OVN_TABLE, deleteChainLine, renderShareDnat, renderShareRemoveAll, shareDnatsFromKernel,
} from './shareDnatRender.js';

export class ShareDnatTable {
  constructor(
    private readonly exec: Executor,
    private readonly log?: Logger,
  ) {}

  private read(): Promise<NftTableDump | null> {
    return listTable(this.exec, 'ip', KUBE_OVN_TABLE);
  }

  /** Make the share-DNAT objects hold exactly `items` (element-level; see shareDnatRender.ts). */
  async sync(items: readonly ShareDnat[], opts: SyncOptions = {}): Promise<SyncReport> {
    let plan = renderShareDnat(items, await this.read());
    const script = (p: typeof plan): string => p.main + p.staleChains.map((c) => `${deleteChainLine(c)}\n`).join('');
    if (plan.changes === 0 || opts.dryRun) return { changes: plan.changes, script: script(plan) };

    if (plan.main !== '') {
      try {
        await applyScript(this.exec, plan.main);
      } catch (err) {
        // Another writer may have changed the table since the read-back (handles, elements):
        // render once more against a fresh one before giving up.
        if (!(err instanceof NftError)) throw err;
        this.log?.warn({ err: err.message }, 'share dnat transaction refused; re-reading and retrying once');
        plan = renderShareDnat(items, await this.read());
        if (plan.main !== '') await applyScript(this.exec, plan.main);
      }
    }
    await this.deleteChains(plan.staleChains);
    this.log?.info({ changes: plan.changes }, 'share dnat synced');
    return { changes: plan.changes, script: script(plan) };
  }

  /**
   * Delete flushed, unreferenced chains: all in one transaction, else one by one. A refusal
   * (EBUSY on kernels before 6.2) leaves the chain flushed; the next sync deletes it.
   */
  private async deleteChains(chains: readonly string[]): Promise<void> {
    if (chains.length === 0) return;
    const all = chains.map((c) => `${deleteChainLine(c)}\n`).join('');
    try {
      await applyScript(this.exec, all);
      return;
    } catch (err) {
      if (!(err instanceof NftError)) throw err;
    }
    for (const c of chains) {
      try {
        await applyScript(this.exec, `${deleteChainLine(c)}\n`);
      } catch (err) {
        if (!(err instanceof NftError)) throw err;
        this.log?.info({ chain: c, err: err.message }, 'stale share dnat chain not deleted yet; a later sync retries');
      }
    }
  }

  /** The share DNATs the kernel holds (adoption); protocolText is the spelling that names the chain. */
  async readBack(): Promise<ShareDnat[]> {
    return shareDnatsFromKernel(await this.read());
  }

  /** Remove natgw's share-DNAT objects; the table goes too when nothing else lives in it. */
  async removeAll(): Promise<void> {
    const plan = renderShareRemoveAll(await this.read());
    if (plan.main !== '') await applyScript(this.exec, plan.main);
    // With foreign objects in the table, the table itself stays (it is theirs too).
    await this.deleteChains(plan.staleChains);
  }
}
