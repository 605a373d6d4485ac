import type { Logger } from 'pino';
import type { Executor } from '../system/exec.js';
import { familyOf } from '../model/net.js';
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
 * whole (absent, damaged, or its listing failed): it is then rebuilt from scratch, and `add`
 * before `delete` makes that valid whether or not the table exists. Counters restart only then.
 *
 * `absent`: the read found no table. It is then created (`create table`, which the kernel
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

/** The accounting table of the kernel: read at every change (one small listing), planned by accountingTx. */
export class EipCounters {
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
      this.log?.debug({ err: e }, 'accounting table not listed: rebuilt');
      return undefined;
    }
  }

  /**
   * The change taking what the table holds now to count exactly `eips`, for a transaction of its
   * own (sync) or for the nftables backend's to carry (so a change runs one `nft`).
   */
  async change(eips: readonly string[]): Promise<NftTransaction> {
    const listed = await this.list();
    return accountingTx(listed?.complete ? new Set(listed.traffic.keys()) : undefined, eips, { absent: listed === null });
  }

  /**
   * Count exactly the EIPs given. Accounting is auxiliary: a failure is logged and never fails
   * the NAT change that triggered it (the next full sync repairs the table).
   */
  async sync(eips: readonly string[]): Promise<number> {
    try {
      const tx = await this.change(eips);
      await this.nft.run(tx);
      return tx.ops.length;
    } catch (e) {
      this.log?.warn({ err: e }, 'per-EIP accounting not updated; the next sync retries');
      return 0;
    }
  }

  async read(): Promise<EipTraffic[]> {
    return [...((await this.list())?.traffic.values() ?? [])];
  }
}
