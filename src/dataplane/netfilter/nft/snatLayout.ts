/**
 * PURE layout of shared SNAT in natgw's nft tables, built so that every SNAT change is
 * element-level (issue 8: a flat ordered chain cost a flush and rewrite of every rule per delete,
 * since nft deletes a rule only by a handle the command path does not know).
 *
 *   chain shared_snat            ip saddr & 255.255.255.0 vmap @snat_len_24     (one per prefix length
 *                                ip saddr & 255.255.0.0 vmap @snat_len_16        in use, longest first)
 *   map snat_len_24              { type ipv4_addr : verdict }  10.0.1.0 : goto snat_10_0_1_0_24
 *   chain snat_10_0_1_0_24       ip saddr 10.0.1.0/24 snat ip to <eip> [fully-random]   (that CIDR's rules,
 *                                ip saddr 10.0.1.0/24 snat ip to numgen inc mod N map {…}  in insertion order)
 *
 * Why this keeps SPEC's first-match semantics: rules of equal prefix length overlap only when
 * their CIDR is identical, so per length a lookup of the masked source address finds at most one
 * CIDR; lengths are tried longest first (a miss falls through to the next dispatch rule), and the
 * CIDR's own chain keeps its rules in insertion order, where the first SNAT statement ends the
 * search. The masked lookup is an exact-match hash map (no interval set: no overlap checks and no
 * element cache for nft to load). The rules inside a CIDR's chain keep their `saddr` match: the
 * same rule text as the flat layout had, so read-back recognises it unchanged, and a wrong
 * element can never translate a foreign source.
 *
 * A new CIDR is a chain, its rules and one element; the last rule of a CIDR going is one element
 * and one chain deleted; a change within a CIDR rewrites its tiny chain. Only a prefix length
 * appearing or disappearing touches shared_snat (at most 33/129 rules, rewritten in place).
 *
 * Chain names are derived from the canonical network CIDR (validated values only: digits, hex,
 * `.`, `:`, `/` mapped to `_`); an IPv4 name always has five numbers and an IPv6 name ends with
 * `_<len>` after a `:`-only address, so distinct CIDRs never share a name.
 */
import ipaddr from 'ipaddr.js';
import { NatgwError } from '../../../model/errors.js';
import { parseCidr } from '../../../model/net.js';
import type { NftElement, NftRule, NftTableRef, NftTransaction } from './transaction.js';
import type { NatgwRule, NftFamily, NftSetDump, OwnedRule } from './types.js';

export const SNAT_MAP_PREFIX = 'snat_len_';
export const SNAT_CHAIN_PREFIX = 'snat_';
/** The chain that dispatches (render.ts CHAIN.sharedSnat; repeated here to keep this module a leaf). */
const SHARED_SNAT = 'shared_snat';

type SnatRule = Extract<NatgwRule, { kind: 'snat' }>;
type DispatchRule = Extract<NatgwRule, { kind: 'snat-dispatch' }>;

const hostBits = (fam: NftFamily): number => (fam === 'ip' ? 32 : 128);
const addrType = (fam: NftFamily): string => (fam === 'ip' ? 'ipv4_addr' : 'ipv6_addr');

export const snatMapName = (len: number): string => `${SNAT_MAP_PREFIX}${len}`;

/** The map a dispatch rule names, or undefined. */
export function lenOfSnatMap(name: string): number | undefined {
  const m = /^snat_len_(\d{1,3})$/.exec(name);
  return m ? Number(m[1]) : undefined;
}

/** Whether a chain name is one natgw gives a CIDR (chain names of natgw's other chains never match). */
export const isSnatChainName = (name: string): boolean => /^snat_[0-9a-f_]+$/.test(name) && !name.startsWith(SNAT_MAP_PREFIX);

export interface SnatCidr {
  /** The network address: the element's key. */
  readonly key: string;
  readonly len: number;
  /** The CIDR's chain. */
  readonly chain: string;
}

/** A SNAT CIDR natgw cannot lay out (validated input never is one). */
export class SnatLayoutError extends NatgwError {
  override readonly name = 'SnatLayoutError';
  constructor(message: string) {
    super('validation', message, 'stdout');
  }
}

/**
 * Parsed once per CIDR text: a command groups every SNAT rule of the state by CIDR, and parsing
 * a thousand CIDRs per command would cost more than the command's transaction. Bounded by the
 * distinct CIDRs seen; cleared when it grows past any plausible state.
 */
const cidrs = new Map<string, SnatCidr>();
const MAX_CACHED_CIDRS = 1 << 16;

export function snatCidr(cidr: string): SnatCidr {
  const hit = cidrs.get(cidr);
  if (hit) return hit;
  const c = parseCidr(cidr, { clearHostBits: true });
  if (!c) throw new SnatLayoutError(`invalid SNAT CIDR ${cidr}`);
  const out = { key: c.address, len: c.prefix, chain: `${SNAT_CHAIN_PREFIX}${`${c.address}/${c.prefix}`.replace(/[.:/]/g, '_')}` };
  if (cidrs.size >= MAX_CACHED_CIDRS) cidrs.clear();
  cidrs.set(cidr, out);
  return out;
}

function maskText(len: number, fam: NftFamily): string {
  return (fam === 'ip' ? ipaddr.IPv4 : ipaddr.IPv6).subnetMaskFromPrefixLength(len).toString();
}

/** The dispatch rule as written: a full-length mask is no mask (nft drops it when listing). */
export function dispatchText(r: DispatchRule, fam: NftFamily): string {
  const mask = r.len === hostBits(fam) ? '' : ` & ${maskText(r.len, fam)}`;
  return `${fam} saddr${mask} vmap @${snatMapName(r.len)}`;
}

/** The dispatch rule as `nft -j` lists it (nft 1.0.6). */
export function dispatchJson(r: DispatchRule, fam: NftFamily): unknown[] {
  const saddr = { payload: { protocol: fam, field: 'saddr' } };
  const key = r.len === hostBits(fam) ? saddr : { '&': [saddr, maskText(r.len, fam)] };
  return [{ vmap: { key, data: `@${snatMapName(r.len)}` } }];
}

/** A dispatch rule's parameter lifted from listed JSON (then compared in full by the caller). */
export function dispatchCandidate(expr: readonly unknown[], fam: NftFamily): DispatchRule | undefined {
  const vmap = (expr[0] as { vmap?: { data?: unknown } } | undefined)?.vmap;
  const len = typeof vmap?.data === 'string' && vmap.data.startsWith('@') ? lenOfSnatMap(vmap.data.slice(1)) : undefined;
  return len !== undefined && len <= hostBits(fam) && expr.length === 1 ? { kind: 'snat-dispatch', len } : undefined;
}

export const dispatchNft = (len: number, fam: NftFamily): NftRule => {
  const r: DispatchRule = { kind: 'snat-dispatch', len };
  return { text: dispatchText(r, fam), expr: dispatchJson(r, fam) };
};

/** The map declaration of one prefix length (render.ts SetSpec's fields). */
export const snatMapDecl = (len: number, fam: NftFamily) => ({ name: snatMapName(len), kind: 'map' as const, type: addrType(fam), map: 'verdict' });

/** A map natgw declares as one of its length maps: stale ones are deleted rather than rebuilt. */
export function isSnatMap(s: NftSetDump, fam: NftFamily): boolean {
  return lenOfSnatMap(s.name) !== undefined && s.kind === 'map' && s.type === addrType(fam) && s.map === 'verdict' && s.flags.length === 0;
}

export const gotoText = (chain: string): string => `goto ${chain}`;

/** One family's SNAT rules (deduplicated, in canonical order) grouped by CIDR, in first-seen order. */
export interface SnatGroup<T> extends SnatCidr {
  readonly items: T[];
}

export function groupSnats<T>(items: readonly T[], cidrOf: (t: T) => string): Map<string, SnatGroup<T>> {
  const groups = new Map<string, SnatGroup<T>>();
  for (const it of items) {
    const c = snatCidr(cidrOf(it));
    const g = groups.get(c.chain);
    if (g) g.items.push(it);
    else groups.set(c.chain, { ...c, items: [it] });
  }
  return groups;
}

/** The prefix lengths in use, longest first: the order of shared_snat's dispatch rules. */
export const lensOf = (groups: Iterable<SnatCidr>): number[] => [...new Set([...groups].map((g) => g.len))].sort((a, b) => b - a);

/** What the layout holds for one family's SNAT rules: dispatch rules, maps, CIDR chains. */
export interface SnatLayout {
  readonly dispatch: readonly NatgwRule[];
  readonly maps: ReadonlyArray<ReturnType<typeof snatMapDecl> & { readonly elements: ReadonlyMap<string, string> }>;
  readonly chains: ReadonlyArray<{ readonly name: string; readonly rules: readonly NatgwRule[] }>;
}

export function snatLayout(rules: readonly SnatRule[], fam: NftFamily): SnatLayout {
  const groups = groupSnats(rules, (r) => r.cidr);
  const lens = lensOf(groups.values());
  const elements = new Map<number, Map<string, string>>(lens.map((l) => [l, new Map()]));
  for (const g of groups.values()) elements.get(g.len)?.set(g.key, gotoText(g.chain));
  return {
    dispatch: lens.map((len): NatgwRule => ({ kind: 'snat-dispatch', len })),
    maps: lens.map((len) => ({ ...snatMapDecl(len, fam), elements: elements.get(len) ?? new Map<string, string>() })),
    chains: [...groups.values()].map((g) => ({ name: g.chain, rules: g.items })),
  };
}

/**
 * The SNAT rules a table holds, for adoption: in the order packets meet them (dispatch rules in
 * chain order, each map's CIDR chains), plus any left in shared_snat itself by the flat layout
 * of older versions (a gateway upgraded in place, before its first full sync).
 */
export function snatRulesOf(owned: ReadonlyMap<string, readonly OwnedRule[]>, sets: ReadonlyMap<string, NftSetDump>): SnatRule[] {
  const out: SnatRule[] = [];
  const snatsIn = (chain: string): void => {
    for (const r of owned.get(chain) ?? []) if (r.rule?.kind === 'snat') out.push(r.rule);
  };
  snatsIn(SHARED_SNAT);
  for (const r of owned.get(SHARED_SNAT) ?? []) {
    if (r.rule?.kind !== 'snat-dispatch') continue;
    for (const e of sets.get(snatMapName(r.rule.len))?.elements ?? []) {
      const target = /^goto (\S+)$/.exec(e.value ?? '')?.[1];
      if (target !== undefined && isSnatChainName(target)) snatsIn(target);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------
// Partial (command path): the change between two SNAT lists without reading back
// ---------------------------------------------------------------------------------

/** A SNAT rule as the partial path renders it: the rule, its text, its transaction form. */
export interface SnatItem {
  readonly rule: SnatRule;
  readonly text: string;
  nft(): NftRule;
}

const sameTexts = (a: readonly SnatItem[], b: readonly SnatItem[]): boolean => a.length === b.length && a.every((x, i) => x.text === b[i]?.text);

/**
 * Append to `tx` the operations that take one family's SNAT objects from `before` to `after`
 * (both deduplicated, in canonical order); returns the number of objects changed.
 */
export function planSnatChange(tx: NftTransaction, t: NftTableRef, fam: NftFamily, before: readonly SnatItem[], after: readonly SnatItem[]): number {
  // Only the CIDRs a rule was added to or removed from are grouped: a command at a thousand SNAT
  // rules must not regroup them all (the walk below compares texts, nothing more).
  const textsBefore = new Set(before.map((x) => x.text));
  const textsAfter = new Set(after.map((x) => x.text));
  const touched = new Set<string>();
  for (const x of before) if (!textsAfter.has(x.text)) touched.add(snatCidr(x.rule.cidr).chain);
  for (const x of after) if (!textsBefore.has(x.text)) touched.add(snatCidr(x.rule.cidr).chain);
  if (touched.size === 0) {
    if (before.length === after.length && before.every((x, i) => x.text === after[i]?.text)) return 0;
    // The same rules in another order: every CIDR's chain is compared.
    for (const x of after) touched.add(snatCidr(x.rule.cidr).chain);
  }
  const inTouched = (x: SnatItem): boolean => touched.has(snatCidr(x.rule.cidr).chain);
  const g0 = groupSnats(before.filter(inTouched), (i) => i.rule.cidr);
  const g1 = groupSnats(after.filter(inTouched), (i) => i.rule.cidr);
  // A prefix length appears or goes only with a CIDR: the full walk for lengths is needed then only.
  const cidrsChange = [...touched].some((c) => g0.has(c) !== g1.has(c));
  const lensOfAll = (items: readonly SnatItem[]): number[] => (cidrsChange ? lensOf(items.map((x) => snatCidr(x.rule.cidr))) : []);
  const lens0 = lensOfAll(before);
  const lens1 = lensOfAll(after);
  const newLens = lens1.filter((l) => !lens0.includes(l));
  const goneLens = new Set(lens0.filter((l) => !lens1.includes(l)));
  let changes = 0;

  for (const len of newLens) tx.addMap(t, snatMapDecl(len, fam));
  const elements = new Map<number, NftElement[]>();
  for (const [name, g] of g1) {
    const was = g0.get(name);
    if (was && sameTexts(was.items, g.items)) continue;
    if (!was) {
      tx.addChain(t, { name });
      const list = elements.get(g.len) ?? [];
      list.push({ key: g.key, value: gotoText(name) });
      elements.set(g.len, list);
      changes += 2;
    } else if (was.items.length < g.items.length && sameTexts(was.items, g.items.slice(0, was.items.length))) {
      // Rules of a CIDR that only gained rules at its end (a second EIP): appended, nothing rewritten.
      for (const it of g.items.slice(was.items.length)) tx.addRule(t, name, it.nft());
      changes += g.items.length - was.items.length;
      continue;
    } else {
      tx.flushChain(t, name);
      changes += was.items.length;
    }
    for (const it of g.items) tx.addRule(t, name, it.nft());
    changes += g.items.length;
  }
  for (const [len, list] of elements) tx.addElements(t, snatMapName(len), list);

  if (goneLens.size > 0) {
    // A rule goes only by handle, which the command path does not know: shared_snat holds one
    // rule per prefix length, so it is rewritten (atomically, in this transaction).
    tx.flushChain(t, SHARED_SNAT);
    for (const len of lens1) tx.addRule(t, SHARED_SNAT, dispatchNft(len, fam));
    changes += lens0.length + lens1.length;
  } else {
    let placed = 0;
    lens1.forEach((len, i) => {
      if (!newLens.includes(len)) return;
      // The chain holds lens0 plus the new lengths placed so far, in their final order.
      if (i < lens0.length + placed) tx.insertRuleAt(t, SHARED_SNAT, dispatchNft(len, fam), i);
      else tx.addRule(t, SHARED_SNAT, dispatchNft(len, fam));
      placed += 1;
    });
  }

  const gone = [...g0.values()].filter((g) => !g1.has(g.chain));
  const goneKeys = new Map<number, string[]>();
  for (const g of gone) {
    if (goneLens.has(g.len)) continue;
    const list = goneKeys.get(g.len) ?? [];
    list.push(g.key);
    goneKeys.set(g.len, list);
  }
  for (const [len, keys] of goneKeys) tx.deleteElements(t, snatMapName(len), keys);
  for (const len of goneLens) tx.deleteSet(t, 'map', snatMapName(len));
  for (const g of gone) {
    tx.flushChain(t, g.chain);
    tx.deleteChain(t, g.chain);
    changes += 2 + g.items.length;
  }
  changes += newLens.length + goneLens.size;
  return changes;
}
