/**
 * PURE layout of shared SNAT in natgw's nft tables, built so that every SNAT change is
 * element-level (nft deletes a rule only by a handle the command path does not know), and so
 * that the common CIDR, translated by one EIP, is an element rather than a chain of its own.
 *
 *   chain shared_snat      ip saddr & 255.255.255.0 vmap @snat_len_24                            (per prefix length
 *                          snat ip to ip saddr & 255.255.255.0 map @snat_to_len_24                 in use, longest
 *                          snat ip to ip saddr & 255.255.255.0 map @snat_to_fr_len_24 fully-random  first, these three)
 *                          ip saddr & 255.255.0.0 vmap @snat_len_16 …
 *   map snat_to_len_24     { type ipv4_addr : ipv4_addr }  10.0.2.0 : <eip>          a CIDR with one single-EIP rule
 *   map snat_to_fr_len_24  { type ipv4_addr : ipv4_addr }  10.0.3.0 : <eip>          the same, --random-fully
 *   map snat_len_24        { type ipv4_addr : verdict }    10.0.1.0 : goto snat_10_0_1_0_24   any other CIDR:
 *   chain snat_10_0_1_0_24 ip saddr 10.0.1.0/24 snat ip to <eip> [fully-random]                 its own chain, its
 *                          ip saddr 10.0.1.0/24 snat ip to numgen inc mod N map {…}              rules in insertion order
 *
 * Why this keeps SPEC's first-match semantics: rules of equal prefix length overlap only when
 * their CIDR is identical, so per length a lookup of the masked source address finds at most one
 * CIDR, and each CIDR sits in exactly one of its length's three maps; lengths are tried longest
 * first. A miss falls through to the next rule: a vmap miss continues, and a map miss in a snat
 * statement breaks the rule (NFT_BREAK), so the next rule is evaluated. A CIDR's chain keeps its
 * rules in insertion order, where the first SNAT statement ends the search (several EIPs: the
 * first counts). The masked lookups are exact-match hash maps (no interval set: no overlap checks
 * and no element cache for nft to load). The rules inside a CIDR's chain keep their `saddr`
 * match: the flat layout's rule text, so read-back recognises it unchanged, and a wrong element
 * can never translate a foreign source.
 *
 * Why elements: every regular chain in the table makes every nft transaction into it dearer, a
 * bare element add into another map included. A CIDR with one single-EIP rule (no pool) is the
 * common case, and it needs no rule of its own: the EIP is the map's value. At the benchmark's
 * ten thousand objects (1,000 SNAT CIDRs) that is 5 chains instead of 1,005, and every API
 * command ×0.73–0.89 of the time it took with a chain per CIDR (paired A/B, bench/abCommands.ts).
 *
 * All three maps and rules exist for every prefix length in use, empty or not: a CIDR moving
 * between forms (a second EIP, one of two removed, --random-fully changed) is then a change of
 * elements and at most one chain, never of shared_snat or a declaration. An empty map's miss costs a hash lookup on a
 * connection's first packet only. Only a prefix length appearing or disappearing touches
 * shared_snat (at most 3 × 33/129 rules, rewritten in place).
 *
 * Chain names are derived from the canonical network CIDR (validated values only: digits, hex,
 * `.`, `:`, `/` mapped to `_`); an IPv4 name always has five numbers and an IPv6 name ends with
 * `_<len>` after a `:`-only address, so distinct CIDRs never share a name.
 */
import ipaddr from 'ipaddr.js';
import { NatgwError } from '../../../model/errors.js';
import { canonicalIp, familyOf, formatCidr, isIp, parseCidr } from '../../../model/net.js';
import type { NatgwRule, NftFamily, NftSetDump, OwnedRule, SnatPorts, SnatRule } from './types.js';

const SNAT_CHAIN_PREFIX = 'snat_';
/** The chain that dispatches (render.ts CHAIN.sharedSnat; repeated here to keep this module a leaf). */
const SHARED_SNAT = 'shared_snat';

type DispatchRule = Extract<NatgwRule, { kind: 'snat-dispatch' }>;

/** How one of a length's maps translates: to a CIDR's chain, or to the EIP it holds (plain or fully-random). */
export type SnatVia = DispatchRule['via'];
/** A length's maps and dispatch rules, in shared_snat's order. */
const SNAT_VIAS: readonly SnatVia[] = ['chain', 'eip', 'eip-fr'];

export const hostBits = (fam: NftFamily): number => (fam === 'ip' ? 32 : 128);
export const addrType = (fam: NftFamily): string => (fam === 'ip' ? 'ipv4_addr' : 'ipv6_addr');

const MAP_PREFIX: Readonly<Record<SnatVia, string>> = { chain: 'snat_len_', eip: 'snat_to_len_', 'eip-fr': 'snat_to_fr_len_' };

export const snatMapName = (len: number, via: SnatVia = 'chain'): string => `${MAP_PREFIX[via]}${len}`;

/** The length and role of a map a dispatch rule names, or undefined. */
function snatMapOf(name: string): { readonly len: number; readonly via: SnatVia } | undefined {
  const m = /^snat_(to_(fr_)?)?len_(\d{1,3})$/.exec(name);
  if (!m) return undefined;
  return { len: Number(m[3]), via: m[2] ? 'eip-fr' : m[1] ? 'eip' : 'chain' };
}

/** Whether a chain name is one natgw gives a CIDR (chain names of natgw's other chains never match). */
export const isSnatChainName = (name: string): boolean => /^snat_[0-9a-f_]+$/.test(name) && snatMapOf(name) === undefined;

export interface SnatCidr {
  /** The network address: the element's key. */
  readonly key: string;
  readonly len: number;
  /** The CIDR's chain, when it has one; its identity in any case. */
  readonly chain: string;
}

/** A SNAT CIDR natgw cannot lay out (validated input never is one). */
class SnatLayoutError extends NatgwError {
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

/** The masked source address, as written: a full-length mask is no mask (nft drops it when listing). */
const keyText = (len: number, fam: NftFamily): string => `${fam} saddr${len === hostBits(fam) ? '' : ` & ${maskText(len, fam)}`}`;

/** A dispatch rule as written. */
export function dispatchText(r: DispatchRule, fam: NftFamily): string {
  const map = `@${snatMapName(r.len, r.via)}`;
  if (r.via === 'chain') return `${keyText(r.len, fam)} vmap ${map}`;
  const ports = r.ports ? ` : ${r.ports.lo}-${r.ports.hi}` : '';
  return `${r.ports ? `${L4_TCP_UDP} ` : ''}snat ${fam} to ${keyText(r.len, fam)} map ${map}${ports}${r.via === 'eip-fr' ? ' fully-random' : ''}`;
}

/** The match a port range in a nat statement needs (nft refuses one without a transport protocol). */
export const L4_TCP_UDP = 'meta l4proto { tcp, udp }';
export const l4TcpUdpJson = (): unknown => ({ match: { op: '==', left: { meta: { key: 'l4proto' } }, right: { set: ['tcp', 'udp'] } } });

/** A dispatch rule as `nft -j` lists it (nft 1.0.6). */
export function dispatchJson(r: DispatchRule, fam: NftFamily): unknown[] {
  const saddr = { payload: { protocol: fam, field: 'saddr' } };
  const key = r.len === hostBits(fam) ? saddr : { '&': [saddr, maskText(r.len, fam)] };
  const data = `@${snatMapName(r.len, r.via)}`;
  if (r.via === 'chain') return [{ vmap: { key, data } }];
  const snat = {
    snat: {
      addr: { map: { key, data } },
      ...(r.ports ? { port: { range: [r.ports.lo, r.ports.hi] } } : {}),
      ...(r.via === 'eip-fr' ? { flags: 'fully-random' } : {}),
    },
  };
  return r.ports ? [l4TcpUdpJson(), snat] : [snat];
}

/**
 * With a port slice, every SNAT statement of the layout (and the hairpin's) comes twice: first for TCP and UDP
 * into the slice, then as it is for the other protocols (nft takes a port range only after a
 * transport protocol match). A CIDR chain's rules keep their order, each sliced one first.
 */
export function withPortSlice(rules: readonly NatgwRule[], ports: SnatPorts | undefined): NatgwRule[] {
  if (!ports) return [...rules];
  return rules.flatMap((r): NatgwRule[] => (isSliceable(r) ? [{ ...r, ports }, r] : [r]));
}

type Sliceable = Extract<NatgwRule, { kind: 'snat' | 'snat-dispatch' | 'hairpin' }>;

/** The rules whose SNAT a port slice restricts: shared SNAT (rules and data-map dispatch) and hairpin SNAT, all to an EIP. */
export function isSliceable(r: NatgwRule): r is Sliceable {
  return r.kind === 'snat' || r.kind === 'hairpin' || (r.kind === 'snat-dispatch' && r.via !== 'chain');
}

/** A dispatch rule's parameters lifted from listed JSON (then compared in full by the caller). */
export function dispatchCandidate(expr: readonly unknown[], fam: NftFamily): DispatchRule | undefined {
  if (expr.length !== 1) return undefined;
  const e = expr[0] as { vmap?: { data?: unknown }; snat?: { addr?: { map?: { data?: unknown } } } } | undefined;
  const data = e?.vmap?.data ?? e?.snat?.addr?.map?.data;
  const m = typeof data === 'string' && data.startsWith('@') ? snatMapOf(data.slice(1)) : undefined;
  return m !== undefined && m.len <= hostBits(fam) ? { kind: 'snat-dispatch', len: m.len, via: m.via } : undefined;
}

/** A length's dispatch rules, in shared_snat's order. */
const dispatchOf = (len: number): DispatchRule[] => SNAT_VIAS.map((via) => ({ kind: 'snat-dispatch', len, via }));

/** The declaration of one of a length's maps (render.ts SetSpec's fields). */
const snatMapDecl = (len: number, via: SnatVia, fam: NftFamily) => ({
  name: snatMapName(len, via),
  kind: 'map' as const,
  type: addrType(fam),
  map: via === 'chain' ? 'verdict' : addrType(fam),
});

/** A map natgw declares as one of its length maps: stale ones are deleted rather than rebuilt. */
export function isSnatMap(s: NftSetDump, fam: NftFamily): boolean {
  const m = snatMapOf(s.name);
  return m !== undefined && s.kind === 'map' && s.type === addrType(fam) && s.map === snatMapDecl(m.len, m.via, fam).map && s.flags.length === 0;
}

/**
 * The element a CIDR is when its rules are exactly one single-EIP rule: which map, which EIP.
 * Undefined when it needs its own chain (several rules, where the first counts, or a pool).
 */
function snatElementOf(rules: readonly SnatRule[]): { readonly via: SnatVia; readonly eip: string } | undefined {
  const r = rules[0];
  if (rules.length !== 1 || r === undefined || r.pool) return undefined;
  return { via: r.randomFully ? 'eip-fr' : 'eip', eip: r.eip };
}

/** The prefix lengths of these CIDRs, longest first: the order of shared_snat's dispatch rules. */
export function snatLens(cidrs: Iterable<string>): number[] {
  const lens = new Set<number>();
  for (const c of cidrs) lens.add(snatCidr(c).len);
  return [...lens].sort((a, b) => b - a);
}

/** What the layout holds for one family's SNAT rules: dispatch rules, maps, CIDR chains. */
export interface SnatLayout {
  readonly dispatch: readonly NatgwRule[];
  readonly maps: ReadonlyArray<ReturnType<typeof snatMapDecl> & { readonly elements: ReadonlyMap<string, string> }>;
  readonly chains: ReadonlyArray<{ readonly name: string; readonly rules: readonly NatgwRule[] }>;
}

/**
 * One family's SNAT rules (deduplicated, in canonical order) laid out, each CIDR's rules in their
 * order. `lens` are the prefix lengths in use: those of `rules` unless more rules than these hold them.
 */
export function snatLayout(rules: readonly SnatRule[], fam: NftFamily, lens = snatLens(rules.map((r) => r.cidr))): SnatLayout {
  const groups = new Map<string, SnatCidr & { readonly items: SnatRule[] }>();
  for (const r of rules) {
    const c = snatCidr(r.cidr);
    const g = groups.get(c.chain);
    if (g) g.items.push(r);
    else groups.set(c.chain, { ...c, items: [r] });
  }
  const elements = new Map<string, Map<string, string>>();
  for (const len of lens) for (const via of SNAT_VIAS) elements.set(snatMapName(len, via), new Map());
  const chains: Array<{ name: string; rules: readonly NatgwRule[] }> = [];
  for (const g of groups.values()) {
    const el = snatElementOf(g.items);
    if (el) elements.get(snatMapName(g.len, el.via))?.set(g.key, el.eip);
    else {
      elements.get(snatMapName(g.len))?.set(g.key, `goto ${g.chain}`);
      chains.push({ name: g.chain, rules: g.items });
    }
  }
  return {
    dispatch: lens.flatMap(dispatchOf),
    maps: lens.flatMap((len) =>
      SNAT_VIAS.map((via) => ({ ...snatMapDecl(len, via, fam), elements: elements.get(snatMapName(len, via)) ?? new Map<string, string>() })),
    ),
    chains,
  };
}

/**
 * The SNAT rules a table holds, for adoption: in the order packets meet them (dispatch rules in
 * chain order; a verdict map's CIDR chains, a data map's elements). A data map's key with host
 * bits set can never match its masked lookup: it translates nothing, so it is not adopted (the
 * next full sync deletes it).
 */
export function snatRulesOf(owned: ReadonlyMap<string, readonly OwnedRule[]>, sets: ReadonlyMap<string, NftSetDump>, fam: NftFamily): SnatRule[] {
  const out: SnatRule[] = [];
  const snatsIn = (chain: string): void => {
    // A sliced rule is the TCP/UDP twin of the rule after it (withPortSlice), not a SNAT of its own.
    for (const r of owned.get(chain) ?? []) if (r.rule?.kind === 'snat' && !r.rule.ports) out.push(r.rule);
  };
  const ipFamily = fam === 'ip' ? 4 : 6;
  for (const r of owned.get(SHARED_SNAT) ?? []) {
    if (r.rule?.kind !== 'snat-dispatch' || r.rule.ports) continue;
    const { len, via } = r.rule;
    for (const e of sets.get(snatMapName(len, via))?.elements ?? []) {
      if (via === 'chain') {
        const target = /^goto (\S+)$/.exec(e.value ?? '')?.[1];
        if (target !== undefined && isSnatChainName(target)) snatsIn(target);
        continue;
      }
      const eip = e.value ?? '';
      if (!isIp(eip) || familyOf(eip) !== ipFamily || !isIp(e.key)) continue;
      const c = parseCidr(`${e.key}/${len}`, { family: ipFamily });
      const net = parseCidr(`${e.key}/${len}`, { family: ipFamily, clearHostBits: true });
      if (!c || !net || canonicalIp(net.address) !== canonicalIp(c.address)) continue;
      out.push({ kind: 'snat', cidr: formatCidr(net), eip: canonicalIp(eip), randomFully: via === 'eip-fr' });
    }
  }
  return out;
}
