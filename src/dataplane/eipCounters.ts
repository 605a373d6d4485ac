import type { Logger } from 'pino';
import { ExecError, type Executor } from '../system/exec.js';
import { familyOf } from '../model/net.js';
import type { SyncMode } from './netfilter/backend.js';
import { SystemNftClient, type NftClient } from './netfilter/nft/client.js';
import type { NftTableDump } from './netfilter/nft/types.js';
import { NftTransaction, type NftRule, type NftTableRef } from './netfilter/nft/transaction.js';

/**
 * Per-EIP packet and byte counters, in natgw's own accounting table `inet natgw_acct`, the
 * same in either netfilter backend: sets with per-element counters, so counting costs one
 * set lookup per packet however many EIPs there are. Inbound is counted before DNAT (the
 * destination is still the EIP), outbound after SNAT (the source already is).
 */
export const ACCT_TABLE = 'natgw_acct';

export interface EipTraffic {
  readonly eip: string;
  readonly rxPackets: number;
  readonly rxBytes: number;
  readonly txPackets: number;
  readonly txBytes: number;
}

const SETS = { rx4: 'eip_rx4', tx4: 'eip_tx4', rx6: 'eip_rx6', tx6: 'eip_tx6' } as const;

const T: NftTableRef = { family: 'inet', name: ACCT_TABLE };

/** `ip daddr @eip_rx4`: the rule, and its expression as `nft -j` lists it. */
function lookup(proto: 'ip' | 'ip6', field: 'daddr' | 'saddr', set: string): NftRule {
  return {
    text: `${proto} ${field} @${set}`,
    expr: [{ match: { op: '==', left: { payload: { protocol: proto, field } }, right: `@${set}` } }],
  };
}

/** PURE: the whole table (created when missing; its sets start empty). */
export function skeletonTx(): NftTransaction {
  return new NftTransaction()
    .addTable(T)
    .addSet(T, { name: SETS.rx4, type: 'ipv4_addr', counter: true })
    .addSet(T, { name: SETS.tx4, type: 'ipv4_addr', counter: true })
    .addSet(T, { name: SETS.rx6, type: 'ipv6_addr', counter: true })
    .addSet(T, { name: SETS.tx6, type: 'ipv6_addr', counter: true })
    .addChain(T, { name: 'rx', base: { type: 'filter', hook: 'prerouting', priority: -160 } })
    .addChain(T, { name: 'tx', base: { type: 'filter', hook: 'postrouting', priority: 200 } })
    .addRule(T, 'rx', lookup('ip', 'daddr', SETS.rx4))
    .addRule(T, 'rx', lookup('ip6', 'daddr', SETS.rx6))
    .addRule(T, 'tx', lookup('ip', 'saddr', SETS.tx4))
    .addRule(T, 'tx', lookup('ip6', 'saddr', SETS.tx6));
}

/** PURE: element changes taking `have` to `want` (addresses are validated EIPs). */
export function elementsTx(have: ReadonlySet<string>, want: readonly string[]): NftTransaction {
  const tx = new NftTransaction();
  const wanted = new Set(want);
  const setsOf = (eip: string) => (familyOf(eip) === 4 ? [SETS.rx4, SETS.tx4] : [SETS.rx6, SETS.tx6]);
  for (const eip of wanted) {
    if (have.has(eip)) continue;
    for (const set of setsOf(eip)) tx.addElements(T, set, [{ key: eip }]);
  }
  for (const eip of have) {
    if (wanted.has(eip)) continue;
    for (const set of setsOf(eip)) tx.deleteElements(T, set, [eip]);
  }
  return tx;
}

/**
 * PURE: the accounting change taking what the sets hold to `want`, for one nft transaction of
 * its own or folded into a larger one. `have` undefined means the table is not known to be
 * whole (absent, damaged, or never read): it is then rebuilt from scratch, and `add` before
 * `delete` makes that valid whether or not the table exists. Counters restart only then.
 *
 * `absent`: the last read found no table. It is then created (`create table`, which the kernel
 * refuses where someone made one since: the transaction fails and is retried as a full sync)
 * rather than deleted first: a delete makes the commit wait for an RCU grace period (a bulk
 * change's last phase took 30-33 ms with it, 13-21 ms without), and a table the transaction
 * creates is one the phased apply can load beside natgw's own (phases.ts).
 */
export function accountingTx(have: ReadonlySet<string> | undefined, want: readonly string[], opts: { readonly absent?: boolean } = {}): NftTransaction {
  if (have !== undefined) return elementsTx(have, want);
  const fresh = opts.absent ? new NftTransaction().createTable(T) : new NftTransaction().addTable(T).deleteTable(T);
  return NftTransaction.concat(fresh, skeletonTx(), elementsTx(new Set(), want));
}

export interface Accounting {
  /** The skeleton is whole: four sets, two chains, four rules. */
  readonly complete: boolean;
  readonly traffic: Map<string, EipTraffic>;
}

/** PURE: the accounting table as the NftClient lists it → counters per EIP, and whether the skeleton is whole. */
export function accountingOf(dump: NftTableDump): Accounting {
  const traffic = new Map<string, EipTraffic>();
  const row = (eip: string) => traffic.get(eip) ?? { eip, rxPackets: 0, rxBytes: 0, txPackets: 0, txBytes: 0 };
  const elements = (names: readonly string[]) => names.flatMap((n) => dump.sets.get(n)?.elements ?? []);
  for (const e of elements([SETS.rx4, SETS.rx6])) traffic.set(e.key, { ...row(e.key), rxPackets: e.counter?.packets ?? 0, rxBytes: e.counter?.bytes ?? 0 });
  for (const e of elements([SETS.tx4, SETS.tx6])) traffic.set(e.key, { ...row(e.key), txPackets: e.counter?.packets ?? 0, txBytes: e.counter?.bytes ?? 0 });
  const rules = [...dump.chains.values()].reduce((n, c) => n + c.rules.length, 0);
  const complete = Object.values(SETS).every((n) => dump.sets.has(n)) && dump.chains.size === 2 && rules === 4;
  return { complete, traffic };
}

export interface EipCountersSyncOptions {
  /** Default `full` (SyncOptions' contract): `partial` trusts the sets as last applied. */
  readonly mode?: SyncMode;
}

/** Accounting changes carried by another nft transaction; `done` once that transaction succeeded. */
export interface AccountingFold {
  readonly tx: NftTransaction;
  readonly done: () => void;
}

export class EipCounters {
  /** The EIPs the accounting sets hold, with the skeleton whole, as of the last read or apply. */
  private trusted: ReadonlySet<string> | undefined;
  /**
   * The last read found no accounting table (observe): the next change builds it from scratch
   * without reading first (accountingTx(undefined) is valid whether or not the table exists).
   */
  private absent = false;

  private readonly nft: NftClient;

  constructor(
    exec: Executor,
    private readonly log?: Logger,
    nft?: NftClient,
  ) {
    this.nft = nft ?? new SystemNftClient(exec);
  }

  /** Null when the table is absent, undefined when it cannot be listed: either way it is rebuilt. */
  private async list(): Promise<Accounting | null | undefined> {
    try {
      const dump = await this.nft.list('inet', ACCT_TABLE);
      return dump ? accountingOf(dump) : null;
    } catch (e) {
      if (e instanceof ExecError) return undefined;
      throw e;
    }
  }

  /**
   * Count exactly the EIPs given. Accounting is auxiliary: a failure is logged and never fails
   * the NAT change that triggered it (the view is dropped, so the next sync reads and retries).
   */
  async sync(eips: readonly string[], opts: EipCountersSyncOptions = {}): Promise<number> {
    try {
      let have = opts.mode === 'partial' ? this.trusted : undefined;
      let absent = opts.mode === 'partial' && have === undefined && this.absent;
      if (have === undefined && !absent) {
        const listed = await this.list();
        have = listed?.complete ? new Set(listed.traffic.keys()) : undefined;
        absent = listed === null;
      }
      const tx = accountingTx(have, eips, { absent });
      await this.nft.run(tx);
      this.trusted = new Set(eips);
      this.absent = false;
      return tx.ops.length;
    } catch (e) {
      this.forget();
      this.log?.warn({ err: e }, 'per-EIP accounting not updated; the next sync retries');
      return 0;
    }
  }

  /**
   * The change as nft commands for another transaction to carry (the nftables backend's, so a
   * command runs one process), when the kept view is trusted; `done` once that transaction
   * succeeded. Undefined without a view: then sync() reads and applies on its own.
   */
  foldable(eips: readonly string[]): AccountingFold | undefined {
    const have = this.trusted;
    if (have === undefined && !this.absent) return undefined;
    return this.fold(have, eips, have === undefined);
  }

  /**
   * foldable() for a full sync, or without a trusted view: the table is listed first (the
   * caller runs this beside its own read-back). Never rejects: undefined means sync() on its own.
   */
  async readFoldable(eips: readonly string[]): Promise<AccountingFold | undefined> {
    try {
      const listed = await this.list();
      return this.fold(listed?.complete ? new Set(listed.traffic.keys()) : undefined, eips, listed === null);
    } catch (e) {
      this.log?.debug({ err: e }, 'accounting table not listed; synced on its own');
      return undefined;
    }
  }

  private fold(have: ReadonlySet<string> | undefined, eips: readonly string[], absent: boolean): AccountingFold {
    return {
      tx: accountingTx(have, eips, { absent }),
      done: () => {
        this.trusted = new Set(eips);
        this.absent = false;
      },
    };
  }

  /** See `absent`: read the table, and remember when there is none. Never rejects. */
  async observe(): Promise<void> {
    if (this.trusted !== undefined) return;
    try {
      this.absent = (await this.nft.list('inet', ACCT_TABLE)) === null;
    } catch {
      this.absent = false;
    }
  }

  /** Stop trusting the kept view: the next sync reads the table back. */
  forget(): void {
    this.trusted = undefined;
    this.absent = false;
  }

  async read(): Promise<EipTraffic[]> {
    return [...((await this.list())?.traffic.values() ?? [])];
  }
}
