/**
 * Hit witnesses: whether a DNAT or a floating IP being deleted ever translated a connection,
 * so that its conntrack flush runs only when one may exist. `conntrack -D --orig-dst …` walks
 * the kernel's whole conntrack hash (~10 ms at 262,144 buckets) even when nothing matches, and
 * most deleted mappings never carried a connection.
 *
 * The scheme (nftables backend only). Two dynamic sets per family, `dnat_hit` and `fip_hit`,
 * filled by the packet path: the first rules of the nat prerouting chain, before any DNAT rule,
 *
 *   meta l4proto { tcp, udp } ip daddr . meta l4proto . th dport @port_dnat add @dnat_hit { ip daddr . meta l4proto . th dport }
 *   ip daddr @fip_dnat add @fip_hit { ip daddr }
 *
 * leave the key of every new connection that a port_dnat or fip_dnat element exists for (NAT
 * chains see a connection's first packet only) — whichever of natgw's rules then translates it.
 * On a delete, the partial sync's transaction removes the map element (nothing translates by
 * it from then on, and nothing adds its key any more); only then, in the flush step, are the
 * hit sets listed (`list set`, through the nft session: a fraction of a millisecond). The read
 * comes after the delete, so no connection can slip in unseen: a packet still evaluating the
 * old ruleset generation when the delete commits matched the witness rule before the map rule
 * in the same evaluation, so its key is in the set by then. A key found there is deleted from
 * the set again (it is there, so the delete cannot be refused). A full sync clears the hit
 * sets and stops trusting the keys it found in them (they need their flush anyway), so the
 * sets hold only hits since the last full sync and their listing stays small.
 *
 * Rejected: per-element counters read with `nft get element` (nft 1.0.6 first fills its cache
 * with every element of the table: 0.1–0.2 s at 20,000 elements); learning a key's presence from
 * whether deleting it is refused (the kernel's abort of a refused batch waits for an RCU grace
 * period, ~10 ms, as long as the conntrack walk it would save).
 *
 * What a missing hit element proves, and only then is the flush skipped (`flushable`):
 *   - the element was created by this process, in a partial sync after the last full apply
 *     (WitnessTrust): a full sync that changed anything, a table found replaced (its handle or
 *     the hit sets' handles differ), the start's replay, a backend switch or a restart all
 *     leave flows the sets never saw, so every key then present is untrusted;
 *   - the flush is exactly the mapping's (witnessFor): a DNAT's `--orig-dst eip -p proto
 *     --orig-port-dst port` with no floating IP or share DNAT on that address (they translate
 *     the same tuples, possibly since before the witness), a floating IP's `--orig-dst eip`
 *     with no DNAT or share DNAT on its address. Share DNAT lives in another table whose
 *     chains may translate before natgw's (then natgw's chain never sees the packet). A
 *     translator deleted earlier flushed its own flows, so only those still present matter.
 *   - fip_snat (internal → eip) needs no witness: its flows' original destination is never
 *     the EIP, so `--orig-dst eip` never deleted them and still does not.
 * Port ranges (rules, not map elements), share DNAT and the iptables backend keep the flush.
 */
import { canonicalIp, familyOfValid } from '../../../model/net.js';
import { dnatKey, fipKey, type Dnat, type Fip } from '../../../model/rules.js';
import { findByKey } from '../../../state/operations.js';
import { refDiff } from '../../../state/refDiff.js';
import type { NatTables, WitnessItem } from '../backend.js';
import { NftTransaction } from './transaction.js';
import type { NatgwKernel, NftFamily } from './types.js';

/** The hit sets (render.ts declares them, `add @…` in prerouting fills them). */
export const HIT = { dnat: 'dnat_hit', fip: 'fip_hit' } as const;

/**
 * Room for every key a map can hold, and stale ones: a full dynamic set refuses the packet
 * path's add, and a hit that is not recorded would skip a flush that is owed.
 */
export const HIT_SIZE = 1 << 20;

/** Beyond this many flushes in one change the conntrack part lists once first (conntrack.ts): no witness then. */
export const WITNESS_MAX = 16;

export type { WitnessItem, WitnessOutcome } from '../backend.js';

export const witnessId = (w: WitnessItem): string => `${w.family} ${w.kind} ${w.key}`;

const famOf = (ip: string): NftFamily => (familyOfValid(ip) === 6 ? 'ip6' : 'ip');

/** The objects a flush's witness is checked against (DesiredState has them). */
export interface WitnessObjects {
  readonly dnats: readonly Dnat[];
  readonly fips: readonly Fip[];
  readonly shareDnats: readonly Pick<Dnat, 'eip' | 'port' | 'protocol'>[];
}

export interface FlushFilter {
  readonly dst: string;
  readonly protocol?: 'tcp' | 'udp';
  readonly port?: number;
  readonly portEnd?: number;
}

/**
 * PURE: the witness that can answer for this flush, or undefined when only the flush can (see
 * the module comment). `before` and `after` are the change's states: the mapping must be in
 * the first and gone from the second.
 */
export function witnessFor(f: FlushFilter, before: WitnessObjects, after: WitnessObjects): WitnessItem | undefined {
  const dst = canonicalIp(f.dst);
  // Presence in a list is asked of its identity index (operations keep it with the list), and
  // what left it of the diff a delete recorded: no walk of ten thousand objects per delete.
  if (f.protocol !== undefined && f.port !== undefined && f.portEnd === undefined) {
    const same = (d: Dnat) => d.eip === dst && d.port === f.port && d.protocol === f.protocol && d.portEnd === undefined;
    const d = removedFrom(before.dnats, after.dnats).find(same);
    if (!d || findByKey(after.dnats, dnatKey, dnatKey(d)) !== undefined) return undefined;
    if (findByKey(before.fips, fipKey, dst) !== undefined) return undefined;
    if (before.shareDnats.some((x) => x.eip === dst && x.port === f.port && x.protocol === f.protocol)) return undefined;
    return { family: famOf(d.eip), kind: 'dnat', key: `${d.eip} . ${d.protocol} . ${d.port}` };
  }
  if (f.protocol !== undefined || f.port !== undefined) return undefined;
  if (!removedFrom(before.fips, after.fips).some((x) => x.eip === dst) || findByKey(after.fips, fipKey, dst) !== undefined) return undefined;
  if (before.dnats.some((x) => x.eip === dst) || before.shareDnats.some((x) => x.eip === dst)) return undefined;
  return { family: famOf(dst), kind: 'fip', key: dst };
}

/** The objects of `before` not in `after`, by reference (a command's delete recorded the diff: refDiff.ts). */
function removedFrom<T>(before: readonly T[], after: readonly T[]): T[] {
  const d = refDiff(before, after);
  if (d) return d.removed.map((i) => before[i] as T);
  const kept = new Set(after);
  return before.filter((x) => !kept.has(x));
}

/** A hit set to list: the sets of the families and kinds among `items`. */
export interface HitSetRef {
  readonly family: NftFamily;
  readonly set: string;
}

export function hitSetsOf(items: readonly WitnessItem[]): HitSetRef[] {
  const refs = new Map(items.map((w) => [`${w.family} ${w.kind}`, { family: w.family, set: HIT[w.kind] }] as const));
  return [...refs.values()];
}

/**
 * PURE: `list set` output (nft's text, one `table <family> <name> { set <name> { … } }` block
 * per set) → the witness ids of the hits in it. Addresses are compared canonical.
 */
export function hitsInListing(text: string): Set<string> {
  const ids = new Set<string>();
  for (const block of text.split(/^table /m).slice(1)) {
    const family = /^(ip6?) /.exec(block)?.[1] as NftFamily | undefined;
    const set = /^\s*set (\w+) \{/m.exec(block)?.[1];
    const kind = set === HIT.dnat ? 'dnat' : set === HIT.fip ? 'fip' : undefined;
    const elements = /elements = \{([^}]*)\}/.exec(block)?.[1];
    if (!family || !kind || elements === undefined) continue;
    for (const raw of elements.split(',')) {
      const parts = raw.trim().split(' . ');
      if (parts[0] === undefined || parts[0] === '') continue;
      const key = [canonicalIp(parts[0]), ...parts.slice(1)].join(' . ');
      ids.add(witnessId({ family, kind, key }));
    }
  }
  return ids;
}

/** PURE: the `list set` output of `sets` listings is whole: one closing brace of a table per listing. */
export const listingsDone = (stdout: string, sets: number): boolean => (stdout.match(/^}$/gm) ?? []).length >= sets;

/** PURE: delete these hit elements (they were listed: only the packet path adds, so none can be refused). */
export function hitDeletesTx(items: readonly WitnessItem[], table: string): NftTransaction {
  const tx = new NftTransaction();
  for (const ref of hitSetsOf(items)) {
    const keys = items.filter((w) => w.family === ref.family && HIT[w.kind] === ref.set).map((w) => w.key);
    tx.deleteElements({ family: ref.family, name: table }, ref.set, keys);
  }
  return tx;
}

/** The hits a full sync read back, as witness items. */
function hitsOf(k: NatgwKernel): WitnessItem[] {
  const out: WitnessItem[] = [];
  for (const [family, t] of [['ip', k.ip] as const, ['ip6', k.ip6] as const]) {
    for (const kind of ['dnat', 'fip'] as const) for (const e of t?.sets.get(HIT[kind])?.elements ?? []) out.push({ family, kind, key: e.key });
  }
  return out;
}

/**
 * PURE: a full sync's first commands: every hit it read back goes (WitnessTrust.full stops
 * trusting those keys), so that the sets hold only hits since, and their listing stays short.
 */
export function hitCleanupTx(k: NatgwKernel, table: string): NftTransaction {
  const hits = hitsOf(k);
  return hits.length === 0 ? new NftTransaction() : hitDeletesTx(hits, table);
}

/** Added and removed objects between two lists (by reference, as the partial sync compares them). */
function changed<T>(before: readonly T[], after: readonly T[]): { added: T[]; removed: T[] } {
  if (before === after) return { added: [], removed: [] };
  const d = refDiff(before, after);
  if (d) return { added: d.added.map(([, x]) => x), removed: d.removed.map((i) => before[i] as T) };
  const b = new Set(before);
  const a = new Set(after);
  return { added: after.filter((x) => !b.has(x)), removed: before.filter((x) => !a.has(x)) };
}

const dnatItem = (d: Dnat): WitnessItem => ({ family: famOf(d.eip), kind: 'dnat', key: `${d.eip} . ${d.protocol} . ${d.port}` });
const fipItem = (f: Fip): WitnessItem => ({ family: famOf(f.eip), kind: 'fip', key: f.eip });

/** The table handle and the hit sets' handles, per family: a table or set created anew changes them. */
export function hitFingerprint(k: NatgwKernel): string {
  return [k.ip, k.ip6]
    .map((t) => (t === null ? '-' : `${t.handle ?? '?'}/${t.sets.get(HIT.dnat)?.handle ?? '-'}/${t.sets.get(HIT.fip)?.handle ?? '-'}`))
    .join(' ');
}

/**
 * Which hit keys this process may trust: those whose map element (and so whose witnessing)
 * it created in a partial sync since the last full apply that could have replaced the sets.
 */
export class WitnessTrust {
  private readonly keys = new Set<string>();
  /** hitFingerprint at the last full sync that changed nothing; undefined when none since a change. */
  private mark: string | undefined;

  get size(): number {
    return this.keys.size;
  }

  /** Nothing is trusted any more (a rewrite, a replay, a failure, a backend switch). */
  clear(): void {
    this.keys.clear();
    this.mark = undefined;
  }

  /** After a partial sync from `prev` to `next` succeeded: the mappings it created are witnessed from their first packet. */
  partial(prev: NatTables, next: NatTables): void {
    const dn = changed(prev.dnats, next.dnats);
    const fp = changed(prev.fips, next.fips);
    // A removed mapping stays trusted until its flush step takes it. One deleted and added in
    // the same change (a new target) keeps its hit element, and its old target's flows were
    // not witnessed as such: untrusted.
    const removed = new Set([...dn.removed.filter((d) => d.portEnd === undefined).map(dnatItem), ...fp.removed.map(fipItem)].map(witnessId));
    const added = [...dn.added.filter((d) => d.portEnd === undefined).map(dnatItem), ...fp.added.map(fipItem)].map(witnessId);
    for (const id of added) {
      if (removed.has(id)) this.keys.delete(id);
      else this.keys.add(id);
    }
  }

  /**
   * After a full sync planned against `kernel`: trust survives only a sync that changed nothing
   * in tables whose hit sets are the very ones the last such sync saw.
   */
  full(kernel: NatgwKernel, changes: number): void {
    const mark = hitFingerprint(kernel);
    if (changes > 0 || this.mark !== mark) this.keys.clear();
    this.mark = changes > 0 ? undefined : mark;
    // Hit already: flushed at its delete whatever comes; its hit element goes with this sync.
    for (const w of hitsOf(kernel)) this.keys.delete(witnessId(w));
  }

  /** Whether the key is trusted; it is forgotten either way (its mapping is gone). */
  take(w: WitnessItem): boolean {
    return this.keys.delete(witnessId(w));
  }
}
