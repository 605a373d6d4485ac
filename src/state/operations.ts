import { resolveEipInterface, uplinkGateways, type UplinkNetwork } from '../model/uplinks.js';
import { ConflictError, RuleConflictError } from '../model/errors.js';
import { defaultOwnerOf, defaultRouteConflictText } from '../model/defaultRoute.js';
import { type Dnat, type DnatId, type Eip, type Fip, type Route, type ShareDnat, type Snat, dnatKey, fipKey, sameDnat, snatKey } from '../model/rules.js';
import type { DesiredState } from './state.js';
import { compose, diffStates, insertSnat, listChange, NO_CHANGE, scalarChange, type Collection, type Item, type StateChange } from './change.js';

/**
 * Pure operations over the desired state, carrying the script's semantics: strict adds by
 * identity (same target: no change; other target: conflict), lenient deletes (absent is
 * success). Each returns the new state and what it changed (change.ts, whose placement rule
 * they keep). Side effects the kernel needs besides state (ARP, conntrack) come back as
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
  readonly change: StateChange;
}

/**
 * What a transaction's function returns: an operation's result, or a state built otherwise (a
 * resync, init), whose change the engine then finds by identity key (change.ts).
 */
export type TxResult = Omit<OpResult, 'change'> & { readonly change?: StateChange | undefined };

export const unchanged = (state: DesiredState): OpResult => ({ state, effects: [], change: NO_CHANGE });

/** `next`, made from `s` by an operation on small collections: its change found by identity (change.ts). */
export const changedTo = (s: DesiredState, next: DesiredState): OpResult => ({ state: next, effects: [], change: diffStates(s, next) });

/** `a`, then `f` on its state: one result, effects and changes in order. */
export function chain(a: OpResult, f: (s: DesiredState) => OpResult): OpResult {
  const b = f(a.state);
  return { state: b.state, effects: [...a.effects, ...b.effects], change: compose(a.change, b.change) };
}

/** `x` put into `k` by identity: in place of the object `same` finds (an update), or added at the end. */
export function put<K extends 'routes' | 'eips' | 'shareDnats' | 'neighbours'>(s: DesiredState, k: K, x: Item<K>, same: (y: Item<K>) => boolean): OpResult {
  const list: readonly Item<K>[] = s[k];
  const at = list.findIndex(same);
  const old = list[at];
  const next = old === undefined ? [...list, x] : list.map((y, j) => (j === at ? x : y));
  return { state: { ...s, [k]: next }, effects: [], change: listChange(k, old === undefined ? { added: [x] } : { updated: [[old, x]] }) };
}

/** `k` without the objects `gone` picks (none: unchanged), with `effects` either way. */
export function remove<K extends Collection>(s: DesiredState, k: K, gone: (y: Item<K>) => boolean, effects: Effect[] = []): OpResult {
  const list: readonly Item<K>[] = s[k];
  const removed = list.filter(gone);
  if (removed.length === 0) return { ...unchanged(s), effects };
  return { state: { ...s, [k]: list.filter((y) => !gone(y)) }, effects, change: listChange(k, { removed }) };
}

export function addRoute(s: DesiredState, r: Route): OpResult {
  // One default route per family: while the external one (eip-add, GATEWAY_V4/V6) owns it, a
  // subnet route to it would replace it and be replaced back at every resync. Refused even when
  // the state already holds it (added before the gateway was known): the answer depends on the
  // state alone, never on the order the commands came in.
  const owner = defaultOwnerOf(s, r);
  if (owner) throw new ConflictError(defaultRouteConflictText(r, owner, s.interfaces));
  // `ip route replace` semantics: a new nexthop replaces the old one.
  if (s.routes.some((x) => x.cidr === r.cidr && x.nexthop === r.nexthop)) return unchanged(s);
  return put(s, 'routes', r, (x) => x.cidr === r.cidr);
}

export function delRoute(s: DesiredState, cidr: string): OpResult {
  return remove(s, 'routes', (x) => x.cidr === cidr, [{ kind: 'release', route: cidr }]);
}

/**
 * The gratuitous ARP goes only with an EIP that is new or whose prefix changed here: an eip-add
 * resent for one the gateway holds (after a divergence, or everything after a controller
 * restart) announces nothing, or a standby replica would pull the external side to itself.
 * The state holding it stands for the kernel holding it: the engine plans every change on that
 * premise, and a kernel that lost the address with its interface (down and up, recreated) is
 * announced again when the interface comes up (RestartHygiene).
 *
 * `networks`: the uplinks' connected networks, for a gateway with several external interfaces
 * (the EIP's interface is decided here and kept in the state, model/uplinks.ts).
 */
export function addEip(s: DesiredState, given: Eip, gateways: { v4?: string; v6?: string }, networks: readonly UplinkNetwork[] = []): OpResult {
  const old = s.eips.find((e) => e.address === given.address);
  const eip = resolveEipInterface(s.interfaces, given, old, networks, uplinkGateways(s.interfaces, gateways.v4 ?? s.defaultRoutes.v4));
  const defaultRoutes = {
    ...s.defaultRoutes,
    ...(gateways.v4 ? { v4: gateways.v4 } : {}),
    ...(gateways.v6 ? { v6: gateways.v6 } : {}),
  };
  // `ip addr replace` semantics: a new prefix length replaces the old one, in place.
  const held = old?.prefixLength === eip.prefixLength && old.interface === eip.interface;
  const r = held ? unchanged(s) : put(s, 'eips', eip, (e) => e.address === eip.address);
  const state = { ...r.state, defaultRoutes };
  return { state, effects: held ? [] : [{ kind: 'garp', ip: eip.address }], change: { ...r.change, scalars: scalarChange(s, state) } };
}

export function delEip(s: DesiredState, address: string): OpResult {
  return remove(s, 'eips', (e) => e.address === address, [{ kind: 'release', address }]);
}

// The three collections that grow to thousands come with batch forms: one pass and one copy
// per command, however many rules it carries (a redo or a bulk add), instead of one per rule.

/**
 * The objects of `list` under the identities of `items`, as a lookup by key: a command's few
 * are found by a scan comparing fields (no key string per object of ten thousand), a batch's
 * many through one Map.
 */
function heldBy<T, I>(list: readonly T[], items: readonly I[], key: (x: T | I) => string, same: (a: T, b: I) => boolean): (k: string) => T | undefined {
  if (items.length > 8) {
    const all = new Map(list.map((x) => [key(x), x] as const));
    return (k) => all.get(k);
  }
  const found = new Map<string, T>();
  for (const x of list) for (const i of items) if (same(x, i)) found.set(key(i), x);
  return (k) => found.get(k);
}

/**
 * Whether an object holds one of the identities `ids`: a command's few are compared field by
 * field, a batch's many looked up in one Set of keys (no key string per object of ten thousand).
 */
function oneOf<T, I>(ids: readonly I[], key: (x: T | I) => string, same: (a: T, b: I) => boolean): (x: T) => boolean {
  if (ids.length <= 8) return (x) => ids.some((i) => same(x, i));
  const wanted = new Set(ids.map(key));
  return (x) => wanted.has(key(x));
}

const sameFip = (a: Pick<Fip, 'eip'>, b: Pick<Fip, 'eip'>): boolean => a.eip === b.eip;
const sameSnat = (a: Pick<Snat, 'eip' | 'cidr'>, b: Pick<Snat, 'eip' | 'cidr'>): boolean => a.eip === b.eip && a.cidr === b.cidr;

/** The object of `list` under identity `k` (a scan: the API's look-up of one object). */
export function findByKey<T extends object>(list: readonly T[], key: (t: T) => string, k: string): T | undefined {
  return list.find((x) => key(x) === k);
}

export function addFips(s: DesiredState, fs: readonly Fip[]): OpResult {
  const byEip = heldBy(s.fips, fs, fipKey, sameFip);
  const added = new Map<string, Fip>();
  for (const f of fs) {
    const existing = byEip(f.eip) ?? added.get(f.eip);
    if (existing) {
      if (existing.internalIp === f.internalIp) continue;
      throw new RuleConflictError({ kind: 'fip', wanted: f, existing });
    }
    added.set(f.eip, f);
  }
  if (!added.size) return unchanged(s);
  const fresh = [...added.values()];
  return { state: { ...s, fips: s.fips.concat(fresh) }, effects: [], change: listChange('fips', { added: fresh }) };
}

export const addFip = (s: DesiredState, f: Fip): OpResult => addFips(s, [f]);

export function delFips(s: DesiredState, eips: readonly string[]): OpResult {
  // Flush even when natgw had no record: a stale entry from before a restart is just as stale.
  const effects: Effect[] = eips.map((dst) => ({ kind: 'conntrack-flush', dst }));
  const ids = eips.map((eip) => ({ eip }));
  return remove(s, 'fips', oneOf(ids, fipKey, sameFip), effects);
}

export const delFip = (s: DesiredState, eip: string): OpResult => delFips(s, [eip]);

const lastPort = (d: Pick<Dnat, 'port' | 'portEnd'>): number => d.portEnd ?? d.port;
const overlaps = (a: Pick<Dnat, 'port' | 'portEnd'>, b: Pick<Dnat, 'port' | 'portEnd'>): boolean => a.port <= lastPort(b) && b.port <= lastPort(a);

function dnatConflict(d: Dnat, holder: Dnat, overlap: boolean): RuleConflictError {
  return new RuleConflictError({ kind: 'dnat', wanted: d, existing: holder, overlap });
}

/**
 * Another DNAT of `candidates` with the eip and protocol of `d` holding a port of `d` under
 * another identity (a range over a single port, or two ranges that overlap); undefined when none does.
 */
function overlapHolder(d: Dnat, candidates: Iterable<Dnat>): Dnat | undefined {
  for (const x of candidates) if (x.eip === d.eip && x.protocol === d.protocol && !sameDnat(x, d) && overlaps(x, d)) return x;
  return undefined;
}

export function addDnats(s: DesiredState, ds: readonly Dnat[]): OpResult {
  const byKey = heldBy(s.dnats, ds, dnatKey, sameDnat);
  // Only a range can overlap under another identity, or a single port inside a range: the
  // state's ranges are few, and a range added is checked against every DNAT.
  const ranges = s.dnats.filter((d) => d.portEnd !== undefined);
  const added = new Map<string, Dnat>();
  const addedRanges: Dnat[] = [];
  for (const d of ds) {
    const existing = byKey(dnatKey(d)) ?? added.get(dnatKey(d));
    if (existing) {
      if (existing.internalIp === d.internalIp && existing.internalPort === d.internalPort) continue;
      throw dnatConflict(d, existing, false);
    }
    const holder =
      d.portEnd !== undefined ? (overlapHolder(d, s.dnats) ?? overlapHolder(d, added.values())) : (overlapHolder(d, ranges) ?? overlapHolder(d, addedRanges));
    if (holder) throw dnatConflict(d, holder, true);
    added.set(dnatKey(d), d);
    if (d.portEnd !== undefined) addedRanges.push(d);
  }
  if (!added.size) return unchanged(s);
  const fresh = [...added.values()];
  return { state: { ...s, dnats: s.dnats.concat(fresh) }, effects: [], change: listChange('dnats', { added: fresh }) };
}

export const addDnat = (s: DesiredState, d: Dnat): OpResult => addDnats(s, [d]);

export function delDnats(s: DesiredState, ids: readonly DnatId[]): OpResult {
  const effects: Effect[] = ids.map((id) => ({
    kind: 'conntrack-flush',
    dst: id.eip,
    protocol: id.protocol,
    port: id.port,
    ...(id.portEnd !== undefined ? { portEnd: id.portEnd } : {}),
  }));
  return remove(s, 'dnats', oneOf(ids, dnatKey, sameDnat), effects);
}

export const delDnat = (s: DesiredState, id: DnatId): OpResult => delDnats(s, [id]);

export function addSnats(s: DesiredState, ns: readonly Snat[]): OpResult {
  const held = heldBy(s.snats, ns, snatKey, sameSnat);
  const added = new Map<string, Snat>();
  for (const n of ns) if (held(snatKey(n)) === undefined && !added.has(snatKey(n))) added.set(snatKey(n), n);
  if (!added.size) return unchanged(s);
  const snats = [...s.snats];
  // Longest prefix first; a new rule goes after existing rules of equal length.
  for (const n of added.values()) insertSnat(snats, n);
  return { state: { ...s, snats }, effects: [], change: listChange('snats', { added: [...added.values()] }) };
}

export const addSnat = (s: DesiredState, n: Snat): OpResult => addSnats(s, [n]);

export function delSnats(s: DesiredState, ids: readonly Pick<Snat, 'eip' | 'cidr'>[]): OpResult {
  return remove(s, 'snats', oneOf(ids, snatKey, sameSnat));
}

export const delSnat = (s: DesiredState, id: Pick<Snat, 'eip' | 'cidr'>): OpResult => delSnats(s, [id]);

export function addShareDnat(s: DesiredState, d: ShareDnat): OpResult {
  // Re-adding replaces the backends (and the received protocol text, which names the chain).
  return put(s, 'shareDnats', d, (x) => sameDnat(x, d));
}

export function delShareDnat(s: DesiredState, id: Pick<ShareDnat, 'eip' | 'port' | 'protocol'>): OpResult {
  return remove(s, 'shareDnats', (x) => sameDnat(x, id), [{ kind: 'conntrack-flush', dst: id.eip, protocol: id.protocol, port: id.port }]);
}
