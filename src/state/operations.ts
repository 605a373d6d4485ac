import { ConflictError } from '../model/errors.js';
import { defaultOwnerOf, defaultRouteConflictText } from '../model/defaultRoute.js';
import {
  type Dnat,
  type DnatId,
  type Eip,
  type Fip,
  type Route,
  type ShareDnat,
  type Snat,
  dnatKey,
  fipKey,
  portText,
  prefixOf,
  sameDnat,
  snatKey,
} from '../model/rules.js';
import { appendLine, CHAINS, dnatSpec, fipDnatSpec } from '../model/ruleText.js';
import type { DesiredState } from './state.js';
import { recordRefDiff } from './refDiff.js';

/**
 * Pure operations over the desired state, carrying the script's semantics: strict adds by
 * identity (same target: no change; other target: conflict), lenient deletes (absent is
 * success). Side effects the kernel needs besides state (ARP, conntrack) come back as
 * effects for the engine to carry out after the apply succeeded.
 */

export type Effect =
  | { kind: 'garp'; ip: string }
  | { kind: 'conntrack-flush'; dst: string; protocol?: 'tcp' | 'udp'; port?: number; portEnd?: number }
  /**
   * A delete named an address or route: it leaves natgw's interface whether or not the state
   * listed it (SPEC §5). Unlike the others this is carried out inside the transaction.
   */
  | { kind: 'release'; address?: string; route?: string };

export interface OpResult {
  readonly state: DesiredState;
  readonly effects: readonly Effect[];
}

const unchanged = (state: DesiredState): OpResult => ({ state, effects: [] });

export function addRoute(s: DesiredState, r: Route): OpResult {
  // One default route per family: while the external one (eip-add, GATEWAY_V4/V6) owns it, a
  // subnet route to it would replace it and be replaced back at every resync. Refused even when
  // the state already holds it (added before the gateway was known): the answer depends on the
  // state alone, never on the order the commands came in.
  const owner = defaultOwnerOf(s, r);
  if (owner) throw new ConflictError(defaultRouteConflictText(r, owner, s.interfaces));
  const i = s.routes.findIndex((x) => x.cidr === r.cidr);
  if (i !== -1 && s.routes[i]?.nexthop === r.nexthop) return unchanged(s);
  // `ip route replace` semantics: a new nexthop replaces the old one.
  const routes = i === -1 ? [...s.routes, r] : s.routes.map((x, j) => (j === i ? r : x));
  return { state: { ...s, routes }, effects: [] };
}

export function delRoute(s: DesiredState, cidr: string): OpResult {
  return { state: { ...s, routes: s.routes.filter((x) => x.cidr !== cidr) }, effects: [{ kind: 'release', route: cidr }] };
}

export function addEip(s: DesiredState, eip: Eip, gateways: { v4?: string; v6?: string }): OpResult {
  // `ip addr replace` semantics: a new prefix length replaces the old one, in place.
  const at = s.eips.findIndex((e) => e.address === eip.address);
  const eips = at === -1 ? [...s.eips, eip] : s.eips.map((e, j) => (j === at ? eip : e));
  const defaultRoutes = {
    ...s.defaultRoutes,
    ...(gateways.v4 ? { v4: gateways.v4 } : {}),
    ...(gateways.v6 ? { v6: gateways.v6 } : {}),
  };
  return { state: { ...s, eips, defaultRoutes }, effects: [{ kind: 'garp', ip: eip.address }] };
}

export function delEip(s: DesiredState, address: string): OpResult {
  return { state: { ...s, eips: s.eips.filter((e) => e.address !== address) }, effects: [{ kind: 'release', address }] };
}

// The three collections that grow to thousands come with batch forms: one index and one copy
// per command, however many rules it carries (a redo or a bulk add), instead of one per rule.
// The index of a collection is kept with the array it indexes and handed on to the array an
// add makes from it, so a command at ten thousand rules does not rebuild it.
const indexes = new WeakMap<readonly object[], Map<string, object>>();

function indexOf<T extends object>(list: readonly T[], key: (t: T) => string): Map<string, T> {
  let idx = indexes.get(list) as Map<string, T> | undefined;
  if (!idx) {
    idx = new Map(list.map((x) => [key(x), x]));
    indexes.set(list, idx);
  }
  return idx;
}

/** The object of `list` under `k` (the collection's own identity key), through the kept index. */
export function findByKey<T extends object>(list: readonly T[], key: (t: T) => string, k: string): T | undefined {
  return indexOf(list, key).get(k);
}

/**
 * `list` without the objects under `keys`, or `list` itself when none is there; its index
 * moves to the new array, so a delete does not make the next add rebuild it.
 */
function without<T extends object>(list: T[], keys: Iterable<string>, key: (t: T) => string): T[] {
  const idx = indexOf(list, key);
  const gone = new Set<T>();
  for (const k of keys) {
    const x = idx.get(k);
    if (x) gone.add(x);
  }
  if (gone.size === 0) return list;
  if (idx.size !== list.length) {
    // Two objects under one key (a state that did not come through these operations): by key, as always.
    const keys2 = new Set([...gone].map(key));
    indexes.delete(list);
    return list.filter((x) => !keys2.has(key(x)));
  }
  const out = dropped(list, gone);
  indexes.delete(list);
  for (const x of gone) idx.delete(key(x));
  indexes.set(out, idx);
  return out;
}

/**
 * `list` without the objects of `gone` (each in it once), and what was removed recorded for
 * the diffs by reference (refDiff.ts): a command's few objects are found by the native
 * `indexOf` and cut out by slices, not by a filter calling back for each of ten thousand.
 */
function dropped<T extends object>(list: readonly T[], gone: ReadonlySet<T>): T[] {
  let removed = gone.size <= 8 ? [...gone].map((x) => list.indexOf(x)).sort((a, b) => a - b) : undefined;
  let out: T[];
  if (removed && !removed.includes(-1)) {
    const pieces: T[][] = [];
    let from = 0;
    for (const i of removed) {
      pieces.push(list.slice(from, i));
      from = i + 1;
    }
    out = ([] as T[]).concat(...pieces, list.slice(from));
  } else {
    const kept: T[] = [];
    const cut: number[] = [];
    list.forEach((x, i) => (gone.has(x) ? cut.push(i) : kept.push(x)));
    removed = cut;
    out = kept;
  }
  recordRefDiff(list, out, { removed, added: [] });
  return out;
}

/** `list` with `added` appended; its index moves to the new array (the old one rebuilds its own if ever asked). */
function appended<T extends object>(list: readonly T[], added: readonly T[], idx: Map<string, T>, key: (t: T) => string): T[] {
  const out = list.concat(added);
  recordRefDiff(list, out, { removed: [], added: added.map((x, k) => [list.length + k, x] as const) });
  indexes.delete(list);
  for (const x of added) idx.set(key(x), x);
  indexes.set(out, idx);
  return out;
}

export function addFips(s: DesiredState, fs: readonly Fip[]): OpResult {
  const byEip = indexOf(s.fips, fipKey);
  const added = new Map<string, Fip>();
  for (const f of fs) {
    const existing = byEip.get(f.eip) ?? added.get(f.eip);
    if (existing) {
      if (existing.internalIp === f.internalIp) continue;
      throw new ConflictError(
        `eip ${f.eip} already bindTo rule: ${appendLine(CHAINS.exclusiveDnat, fipDnatSpec(existing))}, but expected internalIp ${f.internalIp}`,
      );
    }
    added.set(f.eip, f);
  }
  return added.size ? { state: { ...s, fips: appended(s.fips, [...added.values()], byEip, fipKey) }, effects: [] } : unchanged(s);
}

export const addFip = (s: DesiredState, f: Fip): OpResult => addFips(s, [f]);

export function delFips(s: DesiredState, eips: readonly string[]): OpResult {
  return {
    state: { ...s, fips: without(s.fips, eips, fipKey) },
    // Flush even when natgw had no record: a stale entry from before a restart is just as stale.
    effects: eips.map((dst) => ({ kind: 'conntrack-flush', dst })),
  };
}

export const delFip = (s: DesiredState, eip: string): OpResult => delFips(s, [eip]);

/**
 * The port ranges of a DNAT list by eip and protocol, kept with the list like the identity index:
 * an overlap check walks the ranges of one eip and protocol only, never the whole list.
 */
const rangeIndexes = new WeakMap<readonly Dnat[], Map<string, Dnat[]>>();
const eipProto = (d: Pick<Dnat, 'eip' | 'protocol'>): string => `${d.eip}|${d.protocol}`;

function rangesOf(list: readonly Dnat[]): Map<string, Dnat[]> {
  let idx = rangeIndexes.get(list);
  if (!idx) {
    idx = new Map();
    for (const d of list) if (d.portEnd !== undefined) idx.set(eipProto(d), [...(idx.get(eipProto(d)) ?? []), d]);
    rangeIndexes.set(list, idx);
  }
  return idx;
}

const lastPort = (d: Pick<Dnat, 'port' | 'portEnd'>): number => d.portEnd ?? d.port;
const overlaps = (a: Pick<Dnat, 'port' | 'portEnd'>, b: Pick<Dnat, 'port' | 'portEnd'>): boolean => a.port <= lastPort(b) && b.port <= lastPort(a);

function dnatConflict(d: Dnat, holder: Dnat, what: string): ConflictError {
  return new ConflictError(
    `dnat (${d.eip}, ${portText(d)}, ${d.protocol}) ${what}: ${appendLine(CHAINS.sharedDnat, dnatSpec(holder))}, but expected ${d.internalIp}:${d.internalPort}`,
  );
}

/**
 * Another DNAT of the same eip and protocol holding a port of `d` under another identity (a
 * range over a single port, or two ranges that overlap); undefined when none does. `lists` are
 * the ranges by eip and protocol (the state's, and the batch's own), `singles` the identity
 * indexes (the state's, and the batch's own): no scan of the whole list.
 */
function overlapHolder(d: Dnat, lists: ReadonlyArray<ReadonlyMap<string, Dnat[]>>, singles: ReadonlyArray<ReadonlyMap<string, Dnat>>): Dnat | undefined {
  const key = dnatKey(d);
  const other = (x: Dnat | undefined): x is Dnat => x !== undefined && dnatKey(x) !== key && overlaps(x, d);
  for (const ranges of lists) {
    const hit = ranges.get(eipProto(d))?.find(other);
    if (hit) return hit;
  }
  if (d.portEnd === undefined) return undefined;
  // A range holds each of its ports: a single-port DNAT on any of them is a conflict.
  for (let p = d.port; p <= d.portEnd; p++) {
    for (const byKey of singles) {
      const single = byKey.get(`${d.eip}|${p}|${d.protocol}`);
      if (other(single)) return single;
    }
  }
  return undefined;
}

export function addDnats(s: DesiredState, ds: readonly Dnat[]): OpResult {
  const byKey = indexOf(s.dnats, dnatKey);
  const ranges = rangesOf(s.dnats);
  const added = new Map<string, Dnat>();
  const addedRanges = new Map<string, Dnat[]>();
  for (const d of ds) {
    const existing = byKey.get(dnatKey(d)) ?? added.get(dnatKey(d));
    if (existing) {
      if (existing.internalIp === d.internalIp && existing.internalPort === d.internalPort) continue;
      throw dnatConflict(d, existing, 'already exists');
    }
    // Only a range can overlap under another identity, or a single port inside a range.
    if (d.portEnd !== undefined || ranges.size > 0 || addedRanges.size > 0) {
      const holder = overlapHolder(d, [ranges, addedRanges], [byKey, added]);
      if (holder) throw dnatConflict(d, holder, 'overlaps the existing rule');
    }
    added.set(dnatKey(d), d);
    if (d.portEnd !== undefined) addedRanges.set(eipProto(d), [...(addedRanges.get(eipProto(d)) ?? []), d]);
  }
  if (!added.size) return unchanged(s);
  const dnats = appended(s.dnats, [...added.values()], byKey, dnatKey);
  rangeIndexes.delete(s.dnats);
  if (addedRanges.size === 0) rangeIndexes.set(dnats, ranges);
  else {
    const idx = new Map(ranges);
    for (const [k, list] of addedRanges) idx.set(k, [...(idx.get(k) ?? []), ...list]);
    rangeIndexes.set(dnats, idx);
  }
  return { state: { ...s, dnats }, effects: [] };
}

export const addDnat = (s: DesiredState, d: Dnat): OpResult => addDnats(s, [d]);

export function delDnats(s: DesiredState, ids: readonly DnatId[]): OpResult {
  const dnats = without(s.dnats, ids.map(dnatKey), dnatKey);
  // The range index follows the list when no range left it (ranges are few; else it is rebuilt when asked).
  const ranges = rangeIndexes.get(s.dnats);
  if (dnats !== s.dnats && ranges && !ids.some((id) => id.portEnd !== undefined)) rangeIndexes.set(dnats, ranges);
  return {
    state: { ...s, dnats },
    effects: ids.map((id) => ({
      kind: 'conntrack-flush',
      dst: id.eip,
      protocol: id.protocol,
      port: id.port,
      ...(id.portEnd !== undefined ? { portEnd: id.portEnd } : {}),
    })),
  };
}

export const delDnat = (s: DesiredState, id: DnatId): OpResult => delDnats(s, [id]);

export function addSnats(s: DesiredState, ns: readonly Snat[]): OpResult {
  const idx = indexOf(s.snats, snatKey);
  const added = new Map<string, Snat>();
  let snats: Snat[] | undefined;
  for (const n of ns) {
    if (idx.has(snatKey(n)) || added.has(snatKey(n))) continue;
    added.set(snatKey(n), n);
    snats ??= [...s.snats];
    // Longest prefix first; a new rule goes after existing rules of equal length.
    const len = prefixOf(n.cidr);
    const at = snats.findIndex((x) => prefixOf(x.cidr) < len);
    snats.splice(at === -1 ? snats.length : at, 0, n);
  }
  if (!snats) return unchanged(s);
  const placed = snats;
  if (added.size <= 8) {
    const at = [...added.values()].map((n) => [placed.indexOf(n), n] as const).sort((a, b) => a[0] - b[0]);
    recordRefDiff(s.snats, placed, { removed: [], added: at });
  }
  indexes.delete(s.snats);
  for (const [k, n] of added) idx.set(k, n);
  indexes.set(snats, idx);
  return { state: { ...s, snats }, effects: [] };
}

export const addSnat = (s: DesiredState, n: Snat): OpResult => addSnats(s, [n]);

export function delSnats(s: DesiredState, ids: readonly Pick<Snat, 'eip' | 'cidr'>[]): OpResult {
  return { state: { ...s, snats: without(s.snats, ids.map(snatKey), snatKey) }, effects: [] };
}

export const delSnat = (s: DesiredState, id: Pick<Snat, 'eip' | 'cidr'>): OpResult => delSnats(s, [id]);

export function addShareDnat(s: DesiredState, d: ShareDnat): OpResult {
  const at = s.shareDnats.findIndex((x) => sameDnat(x, d));
  // Re-adding replaces the backends (and the received protocol text, which names the chain).
  const shareDnats = at === -1 ? [...s.shareDnats, d] : s.shareDnats.map((x, j) => (j === at ? d : x));
  return { state: { ...s, shareDnats }, effects: [] };
}

export function delShareDnat(s: DesiredState, id: Pick<ShareDnat, 'eip' | 'port' | 'protocol'>): OpResult {
  return {
    state: { ...s, shareDnats: s.shareDnats.filter((x) => !sameDnat(x, id)) },
    effects: [{ kind: 'conntrack-flush', dst: id.eip, protocol: id.protocol, port: id.port }],
  };
}
