/**
 * The one door to nftables for natgw's three users (the NAT backend, share DNAT, accounting),
 * after knftables' Interface: JSON for reads, one plain-text transaction for writes. The
 * system client runs `nft` through the Executor; tests put an in-memory fake behind the same
 * interface (test/helpers/fakeNft.ts).
 */
import { ExecError, type ExecResult, type Executor } from '../../../system/exec.js';
import { parseTableListing } from './readback.js';
import type { NftTableFamily, NftTransaction } from './transaction.js';
import type { NftTableDump } from './types.js';

export interface NftClient {
  /** Whether nftables answers here at all (knftables' Present): the backend choice weighs it. */
  present(): Promise<boolean>;
  /** One table as `nft -j list table` shows it; null when it does not exist. Other failures throw ExecError. */
  list(family: NftTableFamily, table: string): Promise<NftTableDump | null>;
  /**
   * Apply one transaction atomically: all of it or, on a refusal (ExecError), none of it.
   * An empty transaction runs nothing. Text is accepted for scripts natgw did not build with
   * NftTransaction (tests, tools); natgw's own users hand transactions.
   */
  run(tx: NftTransaction | string): Promise<void>;
}

/** `nft` answers a listing of an absent table with ENOENT's text. */
function isMissingTable(r: ExecResult): boolean {
  return r.exitCode !== 0 && /No such file or directory/.test(r.stderr);
}

export class SystemNftClient implements NftClient {
  constructor(private readonly exec: Executor) {}

  async present(): Promise<boolean> {
    return (await this.exec.run({ file: 'nft', args: ['list', 'tables'] })).exitCode === 0;
  }

  async list(family: NftTableFamily, table: string): Promise<NftTableDump | null> {
    const args = ['-j', 'list', 'table', family, table];
    const r = await this.exec.run({ file: 'nft', args });
    if (isMissingTable(r)) return null;
    if (r.exitCode !== 0) throw new ExecError(r, 'the listing');
    return parseTableListing(r.stdout, family, table);
  }

  async run(tx: NftTransaction | string): Promise<void> {
    const script = typeof tx === 'string' ? tx : tx.text();
    if (script === '') return;
    const r = await this.exec.run({ file: 'nft', args: ['-f', '-'], input: script });
    if (r.exitCode !== 0) throw new ExecError(r, 'the transaction', script);
  }
}
