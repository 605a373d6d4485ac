import type { Logger } from 'pino';
import type { Executor } from '../system/exec.js';
import { familyOf } from '../model/net.js';
import type { SyncMode } from './netfilter/backend.js';

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

/** PURE: the whole table (created when missing; its sets start empty). */
export function renderSkeleton(): string {
  return [
    `add table inet ${ACCT_TABLE}`,
    `add set inet ${ACCT_TABLE} ${SETS.rx4} { type ipv4_addr; counter; }`,
    `add set inet ${ACCT_TABLE} ${SETS.tx4} { type ipv4_addr; counter; }`,
    `add set inet ${ACCT_TABLE} ${SETS.rx6} { type ipv6_addr; counter; }`,
    `add set inet ${ACCT_TABLE} ${SETS.tx6} { type ipv6_addr; counter; }`,
    `add chain inet ${ACCT_TABLE} rx { type filter hook prerouting priority -160; }`,
    `add chain inet ${ACCT_TABLE} tx { type filter hook postrouting priority 200; }`,
    `add rule inet ${ACCT_TABLE} rx ip daddr @${SETS.rx4}`,
    `add rule inet ${ACCT_TABLE} rx ip6 daddr @${SETS.rx6}`,
    `add rule inet ${ACCT_TABLE} tx ip saddr @${SETS.tx4}`,
    `add rule inet ${ACCT_TABLE} tx ip6 saddr @${SETS.tx6}`,
  ].join('\n') + '\n';
}

/** PURE: element changes taking `have` to `want` (addresses are validated EIPs). */
export function renderElements(have: ReadonlySet<string>, want: readonly string[]): string {
  const lines: string[] = [];
  const wanted = new Set(want);
  for (const eip of wanted) {
    if (have.has(eip)) continue;
    const [rx, tx] = familyOf(eip) === 4 ? [SETS.rx4, SETS.tx4] : [SETS.rx6, SETS.tx6];
    lines.push(`add element inet ${ACCT_TABLE} ${rx} { ${eip} }`, `add element inet ${ACCT_TABLE} ${tx} { ${eip} }`);
  }
  for (const eip of have) {
    if (wanted.has(eip)) continue;
    const [rx, tx] = familyOf(eip) === 4 ? [SETS.rx4, SETS.tx4] : [SETS.rx6, SETS.tx6];
    lines.push(`delete element inet ${ACCT_TABLE} ${rx} { ${eip} }`, `delete element inet ${ACCT_TABLE} ${tx} { ${eip} }`);
  }
  return lines.length ? lines.join('\n') + '\n' : '';
}

/**
 * PURE: the accounting change taking what the sets hold to `want`, for one nft transaction of
 * its own or folded into a larger one. `have` undefined means the table is not known to be
 * whole (absent, damaged, or never read): it is then rebuilt from scratch, and `add` before
 * `delete` makes that valid whether or not the table exists. Counters restart only then.
 */
export function renderAccountingChange(have: ReadonlySet<string> | undefined, want: readonly string[]): string {
  if (have !== undefined) return renderElements(have, want);
  return `add table inet ${ACCT_TABLE}\ndelete table inet ${ACCT_TABLE}\n` + renderSkeleton() + renderElements(new Set(), want);
}

interface ElemJson {
  elem?: { val?: unknown; counter?: { packets?: number; bytes?: number } };
}

/** PURE: `nft -j list table inet natgw_acct` → counters per EIP, and whether the skeleton is whole. */
export function parseAccounting(json: string): { complete: boolean; traffic: Map<string, EipTraffic> } {
  const items = ((JSON.parse(json) as { nftables?: unknown[] }).nftables ?? []) as Record<string, Record<string, unknown>>[];
  const sets = new Map<string, { val: string; packets: number; bytes: number }[]>();
  let chains = 0;
  let rules = 0;
  for (const item of items) {
    if (item.chain) chains++;
    if (item.rule) rules++;
    const set = item.set;
    if (!set || typeof set.name !== 'string') continue;
    const elems = ((set.elem ?? []) as (ElemJson | string)[]).flatMap((e) => {
      if (typeof e === 'string') return [{ val: e, packets: 0, bytes: 0 }];
      const val = e.elem?.val;
      return typeof val === 'string' ? [{ val, packets: e.elem?.counter?.packets ?? 0, bytes: e.elem?.counter?.bytes ?? 0 }] : [];
    });
    sets.set(set.name, elems);
  }
  const traffic = new Map<string, EipTraffic>();
  const row = (eip: string) => traffic.get(eip) ?? { eip, rxPackets: 0, rxBytes: 0, txPackets: 0, txBytes: 0 };
  for (const name of [SETS.rx4, SETS.rx6]) for (const e of sets.get(name) ?? []) traffic.set(e.val, { ...row(e.val), rxPackets: e.packets, rxBytes: e.bytes });
  for (const name of [SETS.tx4, SETS.tx6]) for (const e of sets.get(name) ?? []) traffic.set(e.val, { ...row(e.val), txPackets: e.packets, txBytes: e.bytes });
  const complete = Object.values(SETS).every((n) => sets.has(n)) && chains === 2 && rules === 4;
  return { complete, traffic };
}

export interface EipCountersSyncOptions {
  /** Default `full` (SyncOptions' contract): `partial` trusts the sets as last applied. */
  readonly mode?: SyncMode;
}

export class EipCounters {
  /** The EIPs the accounting sets hold, with the skeleton whole, as of the last read or apply. */
  private trusted: ReadonlySet<string> | undefined;

  constructor(
    private readonly exec: Executor,
    private readonly log?: Logger,
  ) {}

  private async list(): Promise<{ complete: boolean; traffic: Map<string, EipTraffic> } | undefined> {
    const r = await this.exec.run({ file: 'nft', args: ['-j', 'list', 'table', 'inet', ACCT_TABLE] });
    return r.exitCode === 0 ? parseAccounting(r.stdout) : undefined;
  }

  /**
   * Count exactly the EIPs given. Accounting is auxiliary: a failure is logged and never fails
   * the NAT change that triggered it (the view is dropped, so the next sync reads and retries).
   */
  async sync(eips: readonly string[], opts: EipCountersSyncOptions = {}): Promise<number> {
    try {
      let have = opts.mode === 'partial' ? this.trusted : undefined;
      if (have === undefined) {
        const listed = await this.list();
        have = listed?.complete ? new Set(listed.traffic.keys()) : undefined;
      }
      const script = renderAccountingChange(have, eips);
      if (script !== '') {
        const r = await this.exec.run({ file: 'nft', args: ['-f', '-'], input: script });
        if (r.exitCode !== 0) throw new Error(r.stderr.trim());
      }
      this.trusted = new Set(eips);
      return script.split('\n').filter(Boolean).length;
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
  foldable(eips: readonly string[]): { script: string; done: () => void } | undefined {
    const have = this.trusted;
    if (have === undefined) return undefined;
    return { script: renderAccountingChange(have, eips), done: () => (this.trusted = new Set(eips)) };
  }

  /** Stop trusting the kept view: the next sync reads the table back. */
  forget(): void {
    this.trusted = undefined;
  }

  async read(): Promise<EipTraffic[]> {
    return [...((await this.list())?.traffic.values() ?? [])];
  }
}
