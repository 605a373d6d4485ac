import { resolveEipInterface, uplinkGateways, type UplinkNetwork } from '../model/uplinks.js';
import { ConflictError, RuleConflictError } from '../model/errors.js';
import { defaultOwnerOf, defaultRouteConflictText } from '../model/defaultRoute.js';
import { type Dnat, type DnatId, type Eip, type Fip, type Route, type ShareDnat, type Snat, dnatKey, fipKey, sameDnat, snatKey } from '../model/rules.js';
import type { DesiredState } from './state.js';
import { compose, diffStates, insertSnat, listChange, NO_CHANGE, scalarChange, type StateChange } from './change.js';

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
  const old = s.routes[i];
  const routes = old === undefined ? [...s.routes, r] : s.routes.map((x, j) => (j === i ? r : x));
  return { state: { ...s, routes }, effects: [], change: listChange('routes', old === undefined ? { added: [r] } : { updated: [[old, r]] }) };
}

export function delRoute(s: DesiredState, cidr: string): OpResult {
  const effects: Effect[] = [{ kind: 'release', route: cidr }];
  const removed = s.routes.filter((x) => x.cidr === cidr);
  if (removed.length === 0) return { ...unchanged(s), effects };
  return { state: { ...s, routes: s.routes.filter((x) => x.cidr !== cidr) }, effects, change: listChange('routes', { removed }) };
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
  // `ip addr replace` semantics: a new prefix length replaces the old one, in place.
  const at = s.eips.findIndex((e) => e.address === given.address);
  const old = s.eips[at];
  const eip = resolveEipInterface(s.interfaces, given, old, networks, uplinkGateways(s.interfaces, gateways.v4 ?? s.defaultRoutes.v4));
  const held = old?.prefixLength === eip.prefixLength && old.interface === eip.interface;
  const eips = held ? s.eips : old === undefined ? [...s.eips, eip] : s.eips.map((e, j) => (j === at ? eip : e));
  const defaultRoutes = {
    ...s.defaultRoutes,
    ...(gateways.v4 ? { v4: gateways.v4 } : {}),
    ...(gateways.v6 ? { v6: gateways.v6 } : {}),
  };
  const state = { ...s, eips, defaultRoutes };
  const listed = held ? NO_CHANGE : listChange('eips', old === undefined ? { added: [eip] } : { updated: [[old, eip]] });
  return { state, effects: held ? [] : [{ kind: 'garp', ip: eip.address }], change: { ...listed, scalars: scalarChange(s, state) } };
}

export function delEip(s: DesiredState, address: string): OpResult {
  const effects: Effect[] = [{ kind: 'release', address }];
  const removed = s.eips.filter((e) => e.address === address);
  if (removed.length === 0) return { ...unchanged(s), effects };
  return { state: { ...s, eips: s.eips.filter((e) => e.address !== address) }, effects, change: listChange('eips', { removed }) };
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

/** `list` without the objects under the identities `ids`, and the change saying so. */
function without<K extends 'snats' | 'dnats' | 'fips', T extends DesiredState[K][number], I>(
  k: K,
  list: readonly T[],
  ids: readonly I[],
  key: (x: T | I) => string,
  same: (a: T, b: I) => boolean,
): { list: readonly T[]; change: StateChange } {
  const wanted = ids.length > 8 ? new Set(ids.map(key)) : undefined;
  const kept: T[] = [];
  const removed: T[] = [];
  for (const x of list) ((wanted ? wanted.has(key(x)) : ids.some((i) => same(x, i))) ? removed : kept).push(x);
  if (removed.length === 0) return { list, change: NO_CHANGE };
  return { list: kept, change: listChange(k, { removed: removed as DesiredState[K][number][] }) };
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
  const { list, change } = without(
    'fips',
    s.fips,
    eips.map((eip) => ({ eip })),
    fipKey,
    sameFip,
  );
  return {
    state: list === s.fips ? s : { ...s, fips: list as Fip[] },
    // Flush even when natgw had no record: a stale entry from before a restart is just as stale.
    effects: eips.map((dst) => ({ kind: 'conntrack-flush', dst })),
    change,
  };
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
  const { list, change } = without('dnats', s.dnats, ids, dnatKey, sameDnat);
  return {
    state: list === s.dnats ? s : { ...s, dnats: list as Dnat[] },
    effects: ids.map((id) => ({
      kind: 'conntrack-flush',
      dst: id.eip,
      protocol: id.protocol,
      port: id.port,
      ...(id.portEnd !== undefined ? { portEnd: id.portEnd } : {}),
    })),
    change,
  };
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
  const { list, change } = without('snats', s.snats, ids, snatKey, sameSnat);
  return { state: list === s.snats ? s : { ...s, snats: list as Snat[] }, effects: [], change };
}

export const delSnat = (s: DesiredState, id: Pick<Snat, 'eip' | 'cidr'>): OpResult => delSnats(s, [id]);

export function addShareDnat(s: DesiredState, d: ShareDnat): OpResult {
  const at = s.shareDnats.findIndex((x) => sameDnat(x, d));
  // Re-adding replaces the backends (and the received protocol text, which names the chain).
  const old = s.shareDnats[at];
  const shareDnats = old === undefined ? [...s.shareDnats, d] : s.shareDnats.map((x, j) => (j === at ? d : x));
  return { state: { ...s, shareDnats }, effects: [], change: listChange('shareDnats', old === undefined ? { added: [d] } : { updated: [[old, d]] }) };
}

export function delShareDnat(s: DesiredState, id: Pick<ShareDnat, 'eip' | 'port' | 'protocol'>): OpResult {
  const effects: Effect[] = [{ kind: 'conntrack-flush', dst: id.eip, protocol: id.protocol, port: id.port }];
  const removed = s.shareDnats.filter((x) => sameDnat(x, id));
  if (removed.length === 0) return { ...unchanged(s), effects };
  return { state: { ...s, shareDnats: s.shareDnats.filter((x) => !sameDnat(x, id)) }, effects, change: listChange('shareDnats', { removed }) };
}
