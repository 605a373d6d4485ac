/**
 * PURE partial sync of natgw's nftables tables (kube-proxy's model): the change between the
 * NatTables natgw applied last and the new one, as one transaction, without reading the kernel.
 *
 * The renderer plans it as it plans a full sync, between two small tables: what the change
 * touched, before and after (planTrusted). Map and set elements change one by one, so a DNAT or
 * a floating IP costs one element whatever the number of others; shared SNAT is laid out so that
 * its changes are elements too, or a CIDR's own small chain (snatLayout.ts). A touched floating
 * IP brings every floating IP of its internal IP (which EIP SNATs it depends on them all), a
 * touched SNAT every SNAT rule of its CIDR (their order decides).
 *
 * Anything structural — an interface renamed, a replica's rules changed, a family's table
 * appearing or going, a port range (a rule of its own, deleted by handle) — returns null: the
 * caller then runs a full sync, which reads back and repairs.
 */
import { hasFamily, type NatTables } from '../backend.js';
import { diffStates, touches, type StateChange, type Touched } from '../../../state/change.js';
import { emptyState } from '../../../state/state.js';
import { needsFamily, planTrusted, type NftTxPlan } from './render.js';
import type { NftFamily } from './types.js';
import { snatCidr } from './snatLayout.js';
import type { Fip } from '../../../model/rules.js';

/** What a partial sync trusts: the tables natgw applied last, and which families have a table. */
export interface NftView {
  readonly tables: NatTables;
  readonly families: ReadonlySet<NftFamily>;
}

/** The change between two NatTables by identity key, for a caller that holds none (a tool, a test). */
function tablesChange(prev: NatTables, next: NatTables): StateChange {
  const state = (t: NatTables) => ({
    ...emptyState(t.vpcIf, t.extIf),
    eips: t.eips.map((address) => ({ address, prefixLength: 0 })),
    snats: [...t.snats],
    dnats: [...t.dnats],
    fips: [...t.fips],
  });
  return diffStates(state(prev), state(next));
}

const samePorts = (a: NatTables['snatPorts'], b: NatTables['snatPorts']): boolean => a?.lo === b?.lo && a?.hi === b?.hi;

/** What one side of the change holds of the objects it touched. */
function sideOf<T>(touched: ReadonlyMap<string, Touched<T>> | undefined, side: 'before' | 'after'): T[] {
  const out: T[] = [];
  for (const t of touched?.values() ?? []) if (t[side] !== undefined) out.push(t[side]);
  return out;
}

/** The part of `t` (one side of `change`) that the change touched. */
function touchedPart(t: NatTables, change: StateChange, side: 'before' | 'after'): NatTables {
  const { lists } = change;
  const both = <T>(touched: ReadonlyMap<string, Touched<T>> | undefined): T[] => [...sideOf(touched, 'before'), ...sideOf(touched, 'after')];
  // A floating IP's SNAT element depends on every floating IP of its internal IP: all of them come along.
  const internal = new Set(both(lists.fips).map((f) => f.internalIp));
  const fips: Fip[] = [];
  if (internal.size > 0) for (const f of t.fips) if (internal.has(f.internalIp)) fips.push(f);
  const cidrs = new Set(both(lists.snats).map((s) => snatCidr(s.cidr).chain));
  return {
    ...t,
    eips: sideOf(lists.eips, side).map((e) => e.address),
    dnats: sideOf(lists.dnats, side),
    fips,
    snats: cidrs.size === 0 ? [] : t.snats.filter((s) => cidrs.has(snatCidr(s.cidr).chain)),
  };
}

/** The transaction taking the kernel from `view` to `next`, which `change` made from the state `view` holds; null when only a full sync can. */
export function planPartial(view: NftView, next: NatTables, change: StateChange = tablesChange(view.tables, next)): NftTxPlan | null {
  const prev = view.tables;
  if (prev.vpcIf !== next.vpcIf || prev.extIf !== next.extIf || String(prev.uplinks ?? []) !== String(next.uplinks ?? [])) return null;
  // A replica's rules are the same at every sync.
  if (
    prev.dropInvalid !== next.dropInvalid ||
    String(prev.handOff?.peers ?? []) !== String(next.handOff?.peers ?? []) ||
    prev.handOff?.rate !== next.handOff?.rate ||
    !samePorts(prev.snatPorts, next.snatPorts)
  )
    return null;
  const before = touchedPart(prev, change, 'before');
  const after = touchedPart(next, change, 'after');
  // A port range is a rule in prerouting, not a map element: a change of one takes a full sync
  // (ranges are few; the full sync inserts or deletes just that rule by handle).
  if ([...before.dnats, ...after.dnats].some((d) => d.portEnd !== undefined)) return null;
  // Whether the ip6 table is still needed, from the change alone: scanning ten thousand objects
  // for an IPv6 address would cost more than the command's transaction.
  const hadV6 = view.families.has('ip6');
  const needsV6 = hadV6 ? !hasFamily(before, 6) || needsFamily(next, 'ip6') : hasFamily(after, 6);
  if (needsV6 !== hadV6 || !view.families.has('ip')) return null;
  const snats = touches(change, 'snats') ? ([prev.snats, next.snats] as const) : ([[], []] as const);
  return planTrusted(before, after, view.families, snats);
}
