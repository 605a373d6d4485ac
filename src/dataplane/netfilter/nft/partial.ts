/**
 * PURE partial sync of natgw's nftables tables (kube-proxy's model): the change between the
 * NatTables natgw applied last and the new one, as one script, without reading the kernel.
 *
 * Map and set elements change one by one, so a DNAT or a floating IP costs one element
 * whatever the number of others. Shared SNAT is laid out per CIDR (snatLayout.ts) so that its
 * changes are element-level too: nft deletes a rule only by its handle, which it reports only by
 * reading back (`--echo` fetches the whole ruleset, as slow as a listing at ten thousand
 * elements). A CIDR with one single-EIP rule is one element of a data map; a CIDR with more
 * has its own chain, which a change flushes and rewrites (a rule or two). A CIDR moving between
 * the two forms is an element or two and that one chain, in the same transaction.
 *
 * Anything structural — an interface renamed, a family's table appearing or going — returns
 * null: the caller then runs a full sync, which reads back and repairs.
 */
import { compareIp, type NatTables } from '../backend.js';
import { diffStates, sameValue, split, touches, type StateChange } from '../../../state/change.js';
import { emptyState } from '../../../state/state.js';
import { snatKey, type Dnat, type Fip, type Snat } from '../../../model/rules.js';
import {
  NftRenderError,
  SET,
  famOf,
  natgwTable,
  needsFamily,
  nftRule,
  ruleText,
  snatRule,
  textPlan,
  type NatgwRule,
  type NftFamily,
  type NftPlan,
  type NftTxPlan,
} from './render.js';
import { NftTransaction, type NftElement } from './transaction.js';
import { planSnatChange, snatCidr, type SnatItem } from './snatLayout.js';

/** What a partial sync trusts: the tables natgw applied last, and which families have a table. */
export interface NftView {
  readonly tables: NatTables;
  readonly families: ReadonlySet<NftFamily>;
}

const FAMILIES: readonly NftFamily[] = ['ip', 'ip6'];

/** A collection's change as what goes in and what goes out (an update is both: its old element out, its new one in). */
function changed<K extends 'dnats' | 'fips'>(change: StateChange, k: K): { added: NatTables[K][number][]; removed: NatTables[K][number][] } {
  const { added, removed } = split(change, k);
  // An object only moved (a document's new order) changes no element.
  const updated = split(change, k).updated.filter((u) => !sameValue(u.before, u.after));
  return { added: [...added, ...updated.map((u) => u.after)], removed: [...removed, ...updated.map((u) => u.before)] };
}

class Lines {
  readonly deletes = new NftTransaction();
  readonly adds = new NftTransaction();
  changes = 0;

  add(fam: NftFamily, set: string, items: readonly NftElement[]): void {
    this.adds.addElements(natgwTable(fam), set, items);
    this.changes += items.length;
  }

  delete(fam: NftFamily, set: string, keys: readonly string[]): void {
    this.deletes.deleteElements(natgwTable(fam), set, keys);
    this.changes += keys.length;
  }
}

const dnatElementKey = (d: Dnat): string => `${d.eip} . ${d.protocol} . ${d.port}`;

function checkFamily(what: string, a: string, b: string): void {
  if (famOf(a) !== famOf(b)) throw new NftRenderError(`${what}: ${a} and ${b} are not of the same IP family`);
}

/** The EIP that SNATs an internal IP bound by several floating IPs: the lowest (render.ts). */
function firstEips(fips: readonly Fip[], internal: ReadonlySet<string>): Map<string, string> {
  const first = new Map<string, string>();
  if (internal.size === 0) return first;
  for (const f of fips) {
    if (!internal.has(f.internalIp)) continue;
    const cur = first.get(f.internalIp);
    if (cur === undefined || compareIp(f.eip, cur) < 0) first.set(f.internalIp, f.eip);
  }
  return first;
}

/** A SNAT object's rule and its text (chains are compared by text before anything is written). */
interface RenderedSnat {
  readonly rule: NatgwRule;
  readonly text: string;
}

function renderedSnat(s: Snat, fam: NftFamily): RenderedSnat {
  checkFamily(`snat ${s.eip}`, s.eip, s.cidr.split('/')[0] ?? '');
  const rule: NatgwRule = snatRule(s);
  return { rule, text: ruleText(rule, fam) };
}

/** The SNAT rules of one family in chain order, with their text (compared before anything is written). */
function snatRules(snats: readonly Snat[], fam: NftFamily): RenderedSnat[] {
  const seen = new Set<string>();
  const out: RenderedSnat[] = [];
  for (const s of snats) {
    if (famOf(s.eip) !== fam || seen.has(snatKey(s))) continue;
    seen.add(snatKey(s));
    out.push(renderedSnat(s, fam));
  }
  return out;
}

/** A command-sized SNAT change; null for anything larger. A SNAT moved counts: order decides between rules of one CIDR. */
function changedSnats(change: StateChange): { added: Snat[]; removed: Snat[] } | null {
  if ((change.lists.snats?.size ?? 0) > SNAT_CHANGE_LIMIT) return null;
  const { added, removed, updated } = split(change, 'snats');
  return { added: [...added, ...updated.map((u) => u.after)], removed: [...removed, ...updated.map((u) => u.before)] };
}

/** Past this many SNAT objects added or removed, the change is planned over every SNAT rule. */
const SNAT_CHANGE_LIMIT = 64;

/** The CIDRs (by chain name, the canonical identity) of one family that a SNAT change touches. */
function touchedCidrs(change: { readonly added: readonly Snat[]; readonly removed: readonly Snat[] }, fam: NftFamily): Set<string> {
  const out = new Set<string>();
  for (const s of change.removed) if (famOf(s.eip) === fam) out.add(snatCidr(s.cidr).chain);
  for (const s of change.added) if (famOf(s.eip) === fam) out.add(snatCidr(s.cidr).chain);
  return out;
}

/** The prefix lengths one family's SNAT rules use, longest first (no object per rule). */
function lensIn(snats: readonly Snat[], fam: NftFamily): number[] {
  const lens = new Set<number>();
  for (const s of snats) if (famOf(s.eip) === fam) lens.add(snatCidr(s.cidr).len);
  return [...lens].sort((a, b) => b - a);
}

/**
 * The partial script taking the kernel from `view` to `next`, which `change` made from the
 * state `view` holds; null when only a full sync can (or no change was said).
 */
export function renderPartial(view: NftView, next: NatTables, change?: StateChange): NftPlan | null {
  const p = planPartial(view, next, change);
  return p && textPlan(p);
}

const samePorts = (a: NatTables['snatPorts'], b: NatTables['snatPorts']): boolean => a?.lo === b?.lo && a?.hi === b?.hi;

/** The change between two NatTables by identity key, for a caller that holds none (a tool, a test). */
export function tablesChange(prev: NatTables, next: NatTables): StateChange {
  const state = (t: NatTables) => ({
    ...emptyState(t.vpcIf, t.extIf),
    eips: t.eips.map((address) => ({ address, prefixLength: 0 })),
    snats: [...t.snats],
    dnats: [...t.dnats],
    fips: [...t.fips],
  });
  return diffStates(state(prev), state(next));
}

/** renderPartial as the transaction a client runs. */
export function planPartial(view: NftView, next: NatTables, change: StateChange = tablesChange(view.tables, next)): NftTxPlan | null {
  const prev = view.tables;
  if (prev.vpcIf !== next.vpcIf || prev.extIf !== next.extIf || String(prev.uplinks ?? []) !== String(next.uplinks ?? [])) return null;
  // A replica's rules are the same at every sync; a SNAT change under a port slice (every
  // SNAT statement twice, snatLayout.ts withPortSlice) is planned by the full sync.
  if (
    prev.dropInvalid !== next.dropInvalid ||
    String(prev.handOff?.peers ?? []) !== String(next.handOff?.peers ?? []) ||
    prev.handOff?.rate !== next.handOff?.rate ||
    !samePorts(prev.snatPorts, next.snatPorts)
  )
    return null;
  if (next.snatPorts && touches(change, 'snats')) return null;

  const out = new Lines();
  const byFam = <T>(items: readonly T[], ip: (t: T) => string, fam: NftFamily): T[] => items.filter((t) => famOf(ip(t)) === fam);

  const dn = changed(change, 'dnats');
  // A port range is a rule in prerouting, not a map element: a change of one takes a full sync
  // (ranges are few; the full sync inserts or deletes just that rule by handle).
  if (dn.added.some((d) => d.portEnd !== undefined) || dn.removed.some((d) => d.portEnd !== undefined)) return null;
  dn.added.forEach((d) => checkFamily(`dnat ${d.eip}:${d.port}/${d.protocol}`, d.eip, d.internalIp));
  const fp = changed(change, 'fips');
  fp.added.forEach((f) => checkFamily(`floating ip ${f.eip}`, f.eip, f.internalIp));
  // An EIP's element is its address, its identity: a new prefix length changes no element.
  const eipChange = split(change, 'eips');
  const ep = { added: eipChange.added.map((e) => e.address), removed: eipChange.removed.map((e) => e.address) };

  // Whether the ip6 table is still needed, from the change alone: scanning ten thousand objects
  // for an IPv6 address would cost more than the command's transaction.
  const snatsChanged = touches(change, 'snats');
  // A command's SNAT change (null: a bulk change, walked in full below).
  const sn = snatsChanged ? changedSnats(change) : { added: [], removed: [] };
  const isV6 = (ip: string) => famOf(ip) === 'ip6';
  const hadV6 = view.families.has('ip6');
  const snatV6 = (change: readonly Snat[] | undefined, all: readonly Snat[]) => (change ?? all).some((x) => isV6(x.eip));
  const addedV6 =
    dn.added.some((d) => isV6(d.eip)) || fp.added.some((f) => isV6(f.eip)) || ep.added.some(isV6) || (snatsChanged && snatV6(sn?.added, next.snats));
  const removedV6 =
    dn.removed.some((d) => isV6(d.eip)) || fp.removed.some((f) => isV6(f.eip)) || ep.removed.some(isV6) || (snatsChanged && snatV6(sn?.removed, prev.snats));
  const needsV6 = hadV6 ? (removedV6 ? needsFamily(next, 'ip6') : true) : addedV6;
  if (needsV6 !== hadV6 || !view.families.has('ip')) return null;
  // A FIP whose internal IP changes hands may change which EIP SNATs it.
  const touched = new Set([...fp.added, ...fp.removed].map((f) => f.internalIp));
  const firstBefore = firstEips(prev.fips, touched);
  const firstAfter = firstEips(next.fips, touched);

  for (const fam of FAMILIES) {
    if (!view.families.has(fam)) continue;
    // An identity removed and added again (a changed target) is deleted, then added: one transaction.
    out.delete(fam, SET.portDnat, byFam(dn.removed, (d) => d.eip, fam).map(dnatElementKey));
    out.add(
      fam,
      SET.portDnat,
      byFam(dn.added, (d) => d.eip, fam).map((d) => ({ key: dnatElementKey(d), value: `${d.internalIp} . ${d.internalPort}` })),
    );
    out.delete(
      fam,
      SET.fipDnat,
      byFam(fp.removed, (f) => f.eip, fam).map((f) => f.eip),
    );
    out.add(
      fam,
      SET.fipDnat,
      byFam(fp.added, (f) => f.eip, fam).map((f) => ({ key: f.eip, value: f.internalIp })),
    );
    const snatDel: string[] = [];
    const snatAdd: NftElement[] = [];
    for (const ip of touched) {
      if (famOf(ip) !== fam) continue;
      const was = firstBefore.get(ip);
      const now = firstAfter.get(ip);
      if (was === now) continue;
      if (was !== undefined) snatDel.push(ip);
      if (now !== undefined) snatAdd.push({ key: ip, value: now });
    }
    out.delete(fam, SET.fipSnat, snatDel);
    out.add(fam, SET.fipSnat, snatAdd);
    out.delete(fam, SET.hairpinEips, [...new Set(byFam(ep.removed, (e) => e, fam))]);
    out.add(
      fam,
      SET.hairpinEips,
      [...new Set(byFam(ep.added, (e) => e, fam))].map((key) => ({ key })),
    );

    if (snatsChanged) {
      // Per CIDR, element-level (snatLayout.ts): no rule of another CIDR is rewritten.
      const item = (r: RenderedSnat): SnatItem => ({ rule: r.rule as SnatItem['rule'], text: r.text, nft: () => nftRule(r.rule, fam, r.text) });
      const touched = sn && touchedCidrs(sn, fam);
      if (touched?.size === 0) continue;
      // A command's change renders and compares only the CIDRs it touched: the others hold the
      // same rules in the same order, so their chains and elements stay.
      const subset = (snats: readonly Snat[]) => (touched ? snats.filter((s) => famOf(s.eip) === fam && touched.has(snatCidr(s.cidr).chain)) : snats);
      const before = snatRules(subset(prev.snats), fam).map(item);
      const after = snatRules(subset(next.snats), fam).map(item);
      const lens = touched ? () => [lensIn(prev.snats, fam), lensIn(next.snats, fam)] as const : undefined;
      out.changes += planSnatChange(out.adds, natgwTable(fam), fam, before, after, lens);
    }
  }
  return { tx: NftTransaction.concat(out.deletes, out.adds), changes: out.changes };
}
