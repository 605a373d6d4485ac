/**
 * PURE renderer of natgw's nftables tables: NatTables + what the kernel holds now (readback.ts)
 * → one nft script (text for `nft -f -`, one transaction) that makes the kernel match.
 *
 * Layout, per family (`table ip natgw`; `table ip6 natgw` only while IPv6 objects exist):
 *
 *   map fip_dnat     { type ipv4_addr : ipv4_addr }                                   eip → internal
 *   map fip_snat     { type ipv4_addr : ipv4_addr }                                   internal → first eip
 *   map port_dnat    { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service }
 *   set hairpin_eips { type ipv4_addr }
 *   chain vpc_mark    (filter prerouting, priority mangle)  iifname "<vpc>" meta mark set meta mark | 0x1
 *   chain prerouting  (nat prerouting, priority dstnat)     dnat ip to ip daddr map @fip_dnat
 *                                                           meta l4proto { tcp, udp } dnat ip addr . port to … map @port_dnat
 *   chain postrouting (nat postrouting, priority srcnat)    snat ip to ip saddr map @fip_snat
 *                                                           oifname "<ext>" jump shared_snat
 *                                                           oifname "<vpc>" meta mark & 0x1 == 0x1 ct status dnat
 *                                                             ct original ip daddr @hairpin_eips snat ip to ct original ip daddr fully-random
 *                                                           ip daddr <eip> tcp dport a-b dnat ip to <ip>:a-b  (one per port range)
 *   chain shared_snat, its maps and CIDR chains (regular)   shared SNAT, laid out in snatLayout.ts
 *
 * The order inside prerouting/postrouting is the script's: FIP DNAT before port DNAT
 * (EXCLUSIVE_DNAT before SHARED_DNAT), FIP SNAT before shared SNAT before hairpin. FIP, DNAT and
 * hairpin dispatch through maps and sets, so their per-packet cost does not grow with their number.
 *
 * The `oifname "<ext>"` match is hoisted into the jump to shared_snat: identical semantics, a rename
 * of the external interface touches one rule, and the external interface stays readable from the
 * kernel even while no SNAT exists (adoption).
 *
 * Diff rules: a missing table or skeleton object is created; a chain's rules are compared with the
 * rules natgw would render (tables/diff.ts, the differ of both backends) and repaired by deleting
 * by handle and inserting before a kept neighbour's handle (the longest run of rules already in
 * the right order stays, so a renamed interface rewrites only the rules naming it; a chain most
 * of whose many rules go is flushed and written whole); map and set elements are added and
 * deleted one by one (a changed value is delete + add in the same transaction). A partial sync
 * diffs the same way against what natgw applied last, without handles (planTrusted). Only a structural surprise (an object natgw never
 * creates, or one declared differently) rebuilds the whole table, still in the one transaction.
 *
 * Port ranges are rules of their own after the port_dnat map rule, not map elements: ranges are
 * few (an overlap is refused, so order among them does not matter). A SNAT pool spreads by `numgen inc` rather
 * than `snat to a-b`: the kernel picks an address of a range by a hash of source and destination,
 * so one VPC host talking to one server would only ever get the first EIP of the range.
 *
 * Every value placed in a script comes from NatTables, validated by the zod schemas in src/model;
 * interface names are quoted. Handles come from nft's own JSON (numbers).
 */
import { NatgwError } from '../../../model/errors.js';
import { familyOfValid, parseCidr, type Family } from '../../../model/net.js';
import { activeSnat, dnatKey, snatKey, type Dnat, type Fip, type Snat } from '../../../model/rules.js';
import { canonicalOrder, handOffInterfaces, hasFamily, ofFamily, type NatTables } from '../backend.js';
import {
  addrType,
  dispatchJson,
  dispatchText,
  hostBits,
  isSnatChainName,
  isSnatMap,
  L4_TCP_UDP,
  l4TcpUdpJson,
  snatLayout,
  snatLens,
  withPortSlice,
} from './snatLayout.js';
import { isPlainElement, NftTransaction, type NftChainSpec, type NftElement, type NftPriority, type NftRule, type NftTableRef } from './transaction.js';
import { diffTable, type ChainEdit, type TableEdit } from '../tables/diff.js';
import type { BaseHook, TableModel } from '../tables/model.js';
import type { NatgwKernel, NatgwRule, NftChainDump, NftFamily, NftSetDump, OwnedTable, SnatRule } from './types.js';

export const NFT_FAMILIES: readonly NftFamily[] = ['ip', 'ip6'];

export const NATGW_TABLE = 'natgw';

export const CHAIN = {
  vpcMark: 'vpc_mark',
  prerouting: 'prerouting',
  postrouting: 'postrouting',
  sharedSnat: 'shared_snat',
  /** Only with dropInvalid (an active-active replica). */
  forward: 'forward',
  input: 'input',
} as const;

export const SET = {
  fipDnat: 'fip_dnat',
  fipSnat: 'fip_snat',
  portDnat: 'port_dnat',
  hairpinEips: 'hairpin_eips',
} as const;

/** The mark VPC_MARK sets on packets from the VPC side (the script's 0x1/0x1). */
const VPC_MARK = 1;

/** A state natgw cannot express in nftables (e.g. a v4 EIP bound to a v6 address). */
export class NftRenderError extends NatgwError {
  override readonly name = 'NftRenderError';
  constructor(message: string) {
    super('validation', message, 'stdout');
  }
}

// ---------------------------------------------------------------------------------
// natgw's rules: text to write, JSON that nft lists back
// ---------------------------------------------------------------------------------

/** `a.b.c.d` for a host prefix (nft lists it so), `a.b.c.0/24` otherwise. */
function cidrText(cidr: string, fam: NftFamily): string {
  const c = parseCidr(cidr);
  if (!c) throw new NftRenderError(`invalid CIDR ${cidr}`);
  return c.prefix === hostBits(fam) ? c.address : `${c.address}/${c.prefix}`;
}

/** The rule as written in an nft script. */
export function ruleText(r: NatgwRule, fam: NftFamily): string {
  switch (r.kind) {
    case 'vpc-mark':
      return `iifname "${r.vpcIf}" meta mark set meta mark | 0x${VPC_MARK.toString(16)}`;
    case 'fip-dnat':
      return `dnat ${fam} to ${fam} daddr map @${SET.fipDnat}`;
    case 'port-dnat':
      return `meta l4proto { tcp, udp } dnat ${fam} addr . port to ${fam} daddr . meta l4proto . th dport map @${SET.portDnat}`;
    case 'fip-snat':
      return `snat ${fam} to ${fam} saddr map @${SET.fipSnat}`;
    case 'snat-jump':
      return `oifname "${r.extIf}" jump ${CHAIN.sharedSnat}`;
    case 'hairpin':
      return (
        `oifname "${r.vpcIf}" meta mark & 0x${VPC_MARK.toString(16)} == 0x${VPC_MARK.toString(16)} ct status dnat ` +
        `ct original ${fam} daddr @${SET.hairpinEips} ${r.ports ? `${L4_TCP_UDP} ` : ''}snat ${fam} to ct original ${fam} daddr` +
        `${r.ports ? ` :${r.ports.lo}-${r.ports.hi}` : ''} fully-random`
      );
    case 'snat': {
      const to = r.pool
        ? `numgen inc mod ${r.pool.length} map { ${r.pool.map((e, i) => `${i} : ${e}`).join(', ')} }${r.ports ? ' ' : ''}`
        : r.ports && fam === 'ip6'
          ? `[${r.eip}]`
          : r.eip;
      const ports = r.ports ? `:${r.ports.lo}-${r.ports.hi}` : '';
      return `${fam} saddr ${cidrText(r.cidr, fam)} ${r.ports ? `${L4_TCP_UDP} ` : ''}snat ${fam} to ${to}${ports}${r.randomFully ? ' fully-random' : ''}`;
    }
    case 'drop-invalid':
      return 'ct state invalid drop';
    case 'hand-off':
      return `iifname { ${r.ifs.map((i) => `"${i}"`).join(', ')} } ${r.packets === 'invalid' ? 'ct state invalid' : NEW_UDP} limit rate ${r.rate}/second burst ${r.rate} packets dup to ${r.peer}`;
    case 'new-udp-own-socket':
      return `${NEW_UDP} socket wildcard { 0, 1 } accept`;
    case 'drop-new-udp':
      return `${NEW_UDP} drop`;
    case 'invalid-own-socket':
      return 'ct state invalid socket wildcard 0 accept';
    case 'snat-dispatch':
      return dispatchText(r, fam);
    case 'range-dnat': {
      const to = fam === 'ip' ? r.internalIp : `[${r.internalIp}]`;
      return `${fam} daddr ${r.eip} ${r.protocol} dport ${r.port}-${r.portEnd} dnat ${fam} to ${to}:${r.port}-${r.portEnd}`;
    }
  }
}

const meta = (key: string): unknown => ({ meta: { key } });
const NEW_UDP = 'meta l4proto udp ct state new';
const ctState = (state: string): unknown => match('in', { ct: { key: 'state' } }, state);
const newUdpJson = (): unknown[] => [match('==', meta('l4proto'), 'udp'), ctState('new')];
const payload = (protocol: string, field: string): unknown => ({ payload: { protocol, field } });
const match = (op: string, left: unknown, right: unknown): unknown => ({ match: { op, left, right } });
const ctOrig = (fam: NftFamily): unknown => ({ ct: { key: `${fam} daddr`, dir: 'original' } });

/**
 * The rule for a transaction: its text, and the JSON the kernel lists it as, built when first
 * read (read-back comparison and the fakes read it; the script does not: a bulk render of 1,000
 * SNAT rules built their JSON trees before the tool started, for nothing).
 */
function nftRule(r: NatgwRule, fam: NftFamily): NftRule {
  let expr: unknown[] | undefined;
  return {
    text: ruleText(r, fam),
    get expr() {
      expr ??= ruleJson(r, fam);
      return expr;
    },
  };
}

/** The rule's expressions as `nft -j` lists them (nft 1.0.6), for recognising it on read-back. */
export function ruleJson(r: NatgwRule, fam: NftFamily): unknown[] {
  switch (r.kind) {
    case 'vpc-mark':
      return [match('==', meta('iifname'), r.vpcIf), { mangle: { key: meta('mark'), value: { '|': [meta('mark'), VPC_MARK] } } }];
    case 'fip-dnat':
      return [{ dnat: { addr: { map: { key: payload(fam, 'daddr'), data: `@${SET.fipDnat}` } } } }];
    case 'port-dnat':
      return [
        match('==', meta('l4proto'), { set: ['tcp', 'udp'] }),
        {
          dnat: {
            family: fam,
            addr: {
              map: { key: { concat: [payload(fam, 'daddr'), meta('l4proto'), payload('th', 'dport')] }, data: `@${SET.portDnat}` },
            },
          },
        },
      ];
    case 'fip-snat':
      return [{ snat: { addr: { map: { key: payload(fam, 'saddr'), data: `@${SET.fipSnat}` } } } }];
    case 'snat-jump':
      return [match('==', meta('oifname'), r.extIf), { jump: { target: CHAIN.sharedSnat } }];
    case 'hairpin':
      return [
        match('==', meta('oifname'), r.vpcIf),
        match('==', { '&': [meta('mark'), VPC_MARK] }, VPC_MARK),
        match('in', { ct: { key: 'status' } }, 'dnat'),
        match('==', ctOrig(fam), `@${SET.hairpinEips}`),
        ...(r.ports ? [l4TcpUdpJson()] : []),
        { snat: { addr: ctOrig(fam), ...(r.ports ? { port: { range: [r.ports.lo, r.ports.hi] } } : {}), flags: 'fully-random' } },
      ];
    case 'snat': {
      const c = parseCidr(r.cidr);
      if (!c) throw new NftRenderError(`invalid CIDR ${r.cidr}`);
      const right = c.prefix === hostBits(fam) ? c.address : { prefix: { addr: c.address, len: c.prefix } };
      const addr = r.pool ? { map: { key: { numgen: { mode: 'inc', mod: r.pool.length, offset: 0 } }, data: { set: r.pool.map((e, i) => [i, e]) } } } : r.eip;
      const snat = {
        snat: { addr, ...(r.ports ? { port: { range: [r.ports.lo, r.ports.hi] } } : {}), ...(r.randomFully ? { flags: 'fully-random' } : {}) },
      };
      return r.ports ? [match('==', payload(fam, 'saddr'), right), l4TcpUdpJson(), snat] : [match('==', payload(fam, 'saddr'), right), snat];
    }
    case 'drop-invalid':
      return [ctState('invalid'), { drop: null }];
    case 'hand-off':
      return [
        match('==', meta('iifname'), { set: [...r.ifs] }),
        ...(r.packets === 'invalid' ? [ctState('invalid')] : newUdpJson()),
        { limit: { rate: r.rate, burst: r.rate, per: 'second' } },
        { dup: { addr: r.peer } },
      ];
    case 'new-udp-own-socket':
      return [...newUdpJson(), match('==', { socket: { key: 'wildcard' } }, { set: [0, 1] }), { accept: null }];
    case 'drop-new-udp':
      return [...newUdpJson(), { drop: null }];
    case 'invalid-own-socket':
      return [ctState('invalid'), match('==', { socket: { key: 'wildcard' } }, 0), { accept: null }];
    case 'snat-dispatch':
      return dispatchJson(r, fam);
    case 'range-dnat': {
      const range = { range: [r.port, r.portEnd] };
      return [match('==', payload(fam, 'daddr'), r.eip), match('==', payload(r.protocol, 'dport'), range), { dnat: { addr: r.internalIp, port: range } }];
    }
  }
}

/** A SNAT as a rule: what its CIDR's chain holds, or, alone on its CIDR, what becomes a data-map element (snatLayout.ts). */
export function snatRule(given: Snat): SnatRule {
  const s = activeSnat(given);
  return { kind: 'snat', cidr: s.cidr, eip: s.eip, randomFully: s.randomFully, ...(s.eips ? { pool: s.eips } : {}) };
}

// ---------------------------------------------------------------------------------
// The desired tables
// ---------------------------------------------------------------------------------

/** A base chain's hook; its priority written by name, listed by number. */
interface BaseHookSpec extends BaseHook {
  readonly type: 'filter' | 'nat';
  readonly hook: 'prerouting' | 'postrouting' | 'forward' | 'input';
  readonly prioName: NftPriority;
  readonly policy: 'accept';
}

export interface ChainSpec {
  readonly name: string;
  readonly base?: BaseHookSpec;
  readonly rules: readonly NftRule[];
}

export interface SetSpec {
  readonly name: string;
  readonly kind: 'set' | 'map';
  readonly type: string;
  readonly map?: string;
  /** key text → value text (undefined for a plain set), in insertion order. */
  readonly elements: ReadonlyMap<string, string | undefined>;
  /** The same elements in the same order, as a new set's transaction writes them. */
  readonly list: readonly NftElement[];
}

/**
 * A set whose key index is built only when a diff against the kernel asks for it: a set
 * created whole (a fresh namespace, a rebuild) writes its list, and ten thousand keys need
 * not be hashed for that.
 */
export function setOf(decl: Omit<SetSpec, 'elements' | 'list'>, list: readonly NftElement[]): SetSpec {
  let byKey: Map<string, string | undefined> | undefined;
  return {
    ...decl,
    list,
    get elements() {
      byKey ??= new Map(list.map((e) => [e.key, e.value] as const));
      return byKey;
    },
  };
}

/** What one table must hold (natgw's of one family, or share DNAT's part of `table ip kube-ovn`). */
export interface TableSpec {
  readonly table: NftTableRef;
  readonly sets: readonly SetSpec[];
  readonly chains: readonly ChainSpec[];
}

// Addresses here are validated, and this runs per object.
const famOf = (ip: string): NftFamily => (familyOfValid(ip) === 6 ? 'ip6' : 'ip');

function checkSameFamily(what: string, a: string, b: string): void {
  if (famOf(a) !== famOf(b)) throw new NftRenderError(`${what}: ${a} and ${b} are not of the same IP family`);
}

/** First occurrence per identity wins (iptables would match the first rule). */
function firstBy<T>(items: readonly T[], key: (t: T) => string): T[] {
  const seen = new Set<string>();
  return items.filter((t) => {
    const k = key(t);
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
}

const FAMILY: Readonly<Record<NftFamily, Family>> = { ip: 4, ip6: 6 };

export function needsFamily(want: NatTables, fam: NftFamily): boolean {
  // The v4 table is the skeleton init creates (the guard's evidence).
  return fam === 'ip' || hasFamily(want, FAMILY[fam]);
}

/*
 * One pass per collection, no string per object beyond the element texts themselves: this runs
 * over every object at each full sync (ten thousand DNATs and floating IPs at start).
 */

/** One family's floating IPs' maps: EIP → internal IP, and internal IP → EIP (SNAT: the first EIP in order). */
function fipElements(fips: readonly Fip[], fam: NftFamily): { fipDnat: NftElement[]; fipSnat: NftElement[] } {
  const fipDnat: NftElement[] = [];
  const fipSnat: NftElement[] = [];
  // canonicalOrder sorts by EIP: a repeated EIP is the neighbour of its first (no set of them).
  let lastEip: string | undefined;
  // Several EIPs may bind one internal IP: SNAT uses the first in the given order.
  const snatted = new Set<string>();
  for (let i = 0; i < fips.length; i++) {
    const f = fips[i] as Fip;
    if (f.eip === lastEip) continue;
    if (famOf(f.internalIp) !== fam) checkSameFamily(`floating ip ${f.eip}`, f.eip, f.internalIp);
    lastEip = f.eip;
    fipDnat.push({ key: f.eip, value: f.internalIp });
    if (snatted.has(f.internalIp)) continue;
    snatted.add(f.internalIp);
    fipSnat.push({ key: f.internalIp, value: f.eip });
  }
  return { fipDnat, fipSnat };
}

/** One family's DNATs: single ports as elements of the port map, ranges as rules of their own. */
function dnatElements(sorted: readonly Dnat[], fam: NftFamily): { portDnat: NftElement[]; rangeDnats: NatgwRule[] } {
  const portDnat: NftElement[] = [];
  const rangeDnats: NatgwRule[] = [];
  const dnats = firstBy(sorted, dnatKey);
  for (let i = 0; i < dnats.length; i++) {
    const d = dnats[i] as Dnat;
    if (famOf(d.internalIp) !== fam) checkSameFamily(`dnat ${d.eip}:${d.port}/${d.protocol}`, d.eip, d.internalIp);
    // Joined, not templates: flat texts, not ropes of every piece kept until the script is written.
    if (d.portEnd === undefined) portDnat.push({ key: [d.eip, d.protocol, d.port].join(' . '), value: [d.internalIp, d.internalPort].join(' . ') });
    else rangeDnats.push({ kind: 'range-dnat', eip: d.eip, protocol: d.protocol, port: d.port, portEnd: d.portEnd, internalIp: d.internalIp });
  }
  return { portDnat, rangeDnats };
}

/** What one family's table must hold for `want`; null when the family needs no table. */
export function desiredFamily(given: NatTables, fam: NftFamily): TableSpec | null {
  return needsFamily(given, fam) ? familySpec(given, fam) : null;
}

/**
 * One family's table for `given`. `lensOf`, when given, are the SNAT rules whose prefix lengths
 * shared_snat dispatches to: every rule of the family, where `given` holds only some (a partial sync).
 */
function familySpec(given: NatTables, fam: NftFamily, lensOf?: readonly Snat[]): TableSpec {
  const want = canonicalOrder(ofFamily(given, FAMILY[fam]));
  const addr = addrType(fam);
  const { fipDnat, fipSnat } = fipElements(want.fips, fam);
  const { portDnat, rangeDnats } = dnatElements(want.dnats, fam);
  const snats: Snat[] = firstBy(want.snats, snatKey);
  snats.forEach((s) => checkSameFamily(`snat ${s.eip}`, s.eip, s.cidr.split('/')[0] ?? ''));
  snats.forEach((s) => s.eips?.forEach((e) => checkSameFamily(`snat pool ${s.eip}`, s.eip, e)));
  const eips = firstBy(want.eips, (e) => e);
  const lens = lensOf && snatLens(lensOf.filter((s) => famOf(s.eip) === fam).map((s) => s.cidr));

  const snatObjects = snatLayout(snats.map(snatRule), fam, lens);

  const rules = (rs: readonly NatgwRule[]): NftRule[] => rs.map((r) => nftRule(r, fam));
  return {
    table: natgwTable(fam),
    sets: [
      setOf({ name: SET.fipDnat, kind: 'map', type: addr, map: addr }, fipDnat),
      setOf({ name: SET.fipSnat, kind: 'map', type: addr, map: addr }, fipSnat),
      setOf({ name: SET.portDnat, kind: 'map', type: `${addr} . inet_proto . inet_service`, map: `${addr} . inet_service` }, portDnat),
      setOf(
        { name: SET.hairpinEips, kind: 'set', type: addr },
        eips.map((key) => ({ key })),
      ),
      ...snatObjects.maps.map(({ elements, ...decl }) =>
        setOf(
          decl,
          Array.from(elements, ([key, value]) => ({ key, value })),
        ),
      ),
    ],
    chains: [
      {
        name: CHAIN.vpcMark,
        base: { type: 'filter', hook: 'prerouting', prioName: 'mangle', priority: -150, policy: 'accept' },
        rules: rules([{ kind: 'vpc-mark', vpcIf: want.vpcIf }]),
      },
      {
        name: CHAIN.prerouting,
        base: { type: 'nat', hook: 'prerouting', prioName: 'dstnat', priority: -100, policy: 'accept' },
        rules: rules([{ kind: 'fip-dnat' }, { kind: 'port-dnat' }, ...rangeDnats]),
      },
      {
        name: CHAIN.postrouting,
        base: { type: 'nat', hook: 'postrouting', prioName: 'srcnat', priority: 100, policy: 'accept' },
        rules: rules(
          withPortSlice(
            [
              { kind: 'fip-snat' },
              ...[want.extIf, ...(want.uplinks ?? [])].map((extIf): NatgwRule => ({ kind: 'snat-jump', extIf })),
              { kind: 'hairpin', vpcIf: want.vpcIf },
            ],
            want.snatPorts,
          ),
        ),
      },
      {
        name: CHAIN.sharedSnat,
        rules: rules(withPortSlice(snatObjects.dispatch, want.snatPorts)),
      },
      ...snatObjects.chains.map((c) => ({ name: c.name, rules: rules(withPortSlice(c.rules, want.snatPorts)) })),
      ...(want.dropInvalid ? dropInvalidChains(want, fam) : []),
    ],
  };
}

/**
 * An active-active replica's base chains `forward` and `input`. An invalid packet toward the
 * EIPs would draw a reset from this replica's own stack for a flow whose state has not arrived
 * yet. One that belongs to a socket of the replica's own (BGP, the API, the peer's calls)
 * passes: with loose pick-up off, a connection whose entry went (seen while replicas joined: a
 * peer's copy, sent back in a resend, replaced it; now conntrackd ignores the replica's own
 * addresses) would otherwise have every later packet dropped. Before the drop, a copy goes to
 * each peer (NatTables.handOff says why). UDP has no invalid first packet: an early reply to
 * an EIP is a new flow to conntrack, which the replica's stack would answer with "port
 * unreachable" (and its entry would block the peer's state). On input, a new UDP packet that
 * no socket of the replica's own takes is handed off and dropped the same way.
 */
function dropInvalidChains(want: NatTables, fam: NftFamily): ChainSpec[] {
  const ifs = handOffInterfaces(want);
  const h = want.handOff;
  const handOff = (packets: 'invalid' | 'new-udp'): NatgwRule[] => (h ? h.peers.map((peer) => ({ kind: 'hand-off', packets, ifs, peer, rate: h.rate })) : []);
  const invalid: NatgwRule[] = [...handOff('invalid'), { kind: 'drop-invalid' }];
  const chain = (name: 'forward' | 'input', rules: NatgwRule[]): ChainSpec => ({
    name,
    base: { type: 'filter', hook: name, prioName: 'filter', priority: 0, policy: 'accept' },
    rules: rules.map((r) => nftRule(r, fam)),
  });
  return [
    chain(CHAIN.forward, invalid),
    chain(CHAIN.input, [{ kind: 'invalid-own-socket' }, ...invalid, { kind: 'new-udp-own-socket' }, ...handOff('new-udp'), { kind: 'drop-new-udp' }]),
  ];
}

// ---------------------------------------------------------------------------------
// The script
// ---------------------------------------------------------------------------------

export interface NftPlan {
  /** The nft script; '' when nothing differs. */
  readonly script: string;
  /** Objects (tables, chains, sets, rules, elements) added or removed. */
  readonly changes: number;
}

/** A plan as the transaction a client runs (its text is NftPlan's script). */
export interface NftTxPlan {
  readonly tx: NftTransaction;
  readonly changes: number;
}

export const textPlan = (p: NftTxPlan): NftPlan => ({ script: p.tx.text(), changes: p.changes });

/** Commands of one transaction, grouped so that dependencies come first whatever was diffed. */
export class Script {
  readonly create = new NftTransaction();
  readonly deleteRules = new NftTransaction();
  readonly deleteElements = new NftTransaction();
  readonly addElements = new NftTransaction();
  readonly addRules = new NftTransaction();
  /** Objects no longer referenced once the groups above ran (a SNAT CIDR's chain, a length's map). */
  readonly drop = new NftTransaction();
  changes = 0;

  tx(): NftTransaction {
    return NftTransaction.concat(this.create, this.deleteRules, this.deleteElements, this.addElements, this.addRules, this.drop);
  }
}

const natgwTable = (fam: NftFamily): NftTableRef => ({ family: fam, name: NATGW_TABLE });

function chainOf(c: ChainSpec): NftChainSpec {
  return c.base ? { name: c.name, base: { type: c.base.type, hook: c.base.hook, priority: c.base.prioName, policy: c.base.policy } } : { name: c.name };
}

function addSet(tx: NftTransaction, t: NftTableRef, s: SetSpec): void {
  if (s.kind === 'map') tx.addMap(t, { name: s.name, type: s.type, map: s.map ?? '' });
  else tx.addSet(t, { name: s.name, type: s.type });
}

/** Elements of `set` by key: all of them (a new set) straight from its list. */
function addElements(sc: Script, t: NftTableRef, set: SetSpec, keys?: readonly string[]): void {
  const elements =
    keys?.map((key): NftElement => {
      const value = set.elements.get(key);
      return value === undefined ? { key } : { key, value };
    }) ?? set.list;
  sc.addElements.addElements(t, set.name, elements);
  sc.changes += elements.length;
}

const EMPTY_TABLE: TableModel = { chains: new Map(), sets: new Map() };

/** Everything for one family from scratch (a missing table, or a rebuild): the edit from an empty table. */
function renderFresh(sc: Script, spec: TableSpec, want = wantedModel(spec)): void {
  sc.create.addTable(spec.table);
  sc.changes += 1;
  renderEdit(sc, spec, want, EMPTY_TABLE, undefined);
}

function sameSetDecl(spec: SetSpec, have: NftSetDump): boolean {
  return have.kind === spec.kind && have.type === spec.type && (have.map ?? '') === (spec.map ?? '') && have.flags.length === 0;
}

/** A table natgw cannot repair object by object: something it never creates, or declared otherwise. */
function needsRebuild(spec: TableSpec, have: OwnedTable, edit: TableEdit): boolean {
  const sets = new Map(spec.sets.map((s) => [s.name, s]));
  if (edit.rehooked.length > 0 || edit.staleChains.some((n) => !isStaleSnatChain(n, have.chains.get(n) as NftChainDump))) return true;
  for (const [name, s] of have.sets) {
    const want = sets.get(name);
    if (!want && isSnatMap(s, have.family as NftFamily)) continue;
    if (!want || !sameSetDecl(want, s)) return true;
    // A stale element is deleted by writing its text back into the script: only typed data as
    // nft prints it may be written there (anything else cannot occur in a map natgw declared).
    if (s.elements.some((e) => !isPlainElement(e.key) || (e.value !== undefined && !isPlainElement(e.value)))) return true;
  }
  return false;
}

/** A SNAT CIDR's chain no longer wanted: deleted in the repair, not a reason to rebuild. */
const isStaleSnatChain = (name: string, c: NftChainDump): boolean => c.base === undefined && isSnatChainName(name);

/**
 * The table model (tables/model.ts) of a desired family or of what the kernel holds: rules keyed
 * by their script text, unrecognised kernel rules null. A desired set's elements are indexed only
 * when the differ asks for them (setOf).
 */
export function wantedModel(spec: TableSpec): TableModel {
  return {
    chains: new Map(
      spec.chains.map((c) => [
        c.name,
        {
          ...(c.base ? { base: c.base } : {}),
          rules: c.rules.map((r) => r.text),
        },
      ]),
    ),
    sets: new Map(spec.sets.map((s) => [s.name, s])),
  };
}

function kernelModel(have: OwnedTable, fam: NftFamily): TableModel {
  return {
    chains: new Map(
      [...have.chains].map(([n, c]) => [
        n,
        {
          ...(c.base ? { base: c.base } : {}),
          rules: (have.owned.get(n) ?? []).map((r) => (r.rule ? ruleText(r.rule, fam) : null)),
        },
      ]),
    ),
    sets: new Map([...have.sets].map(([n, s]) => [n, { elements: new Map(s.elements.map((e) => [e.key, e.value] as const)) }])),
  };
}

/**
 * A chain's operations in nft terms: delete by handle, insert before the kept neighbour's handle,
 * or append. Without handles (a partial sync reads nothing back) a rule goes in by its index, and
 * a chain that loses a rule is flushed and written whole.
 */
function renderChain(sc: Script, t: NftTableRef, chain: ChainSpec, held: number, handles: readonly Handled[] | undefined, edit: ChainEdit): void {
  const rule = (d: number): NftRule => chain.rules[d] as NftRule;
  const desired = chain.rules;
  let appendFrom = 0;
  if (edit.kind === 'rewrite' || (!handles && edit.deletes.length > 0)) {
    sc.deleteRules.flushChain(t, chain.name);
    sc.changes += held;
  } else {
    // Deletes here come with handles.
    for (const a of edit.deletes) sc.deleteRules.deleteRule(t, chain.name, ((handles ?? [])[a] as Handled).handle);
    edit.inserts.forEach(({ rule: d, before }, k) => {
      if (handles) sc.addRules.insertRule(t, chain.name, rule(d), (handles[before] as Handled).handle);
      // Nothing deleted: the kept rule has the k rules inserted so far before it.
      else sc.addRules.insertRuleAt(t, chain.name, rule(d), before + k);
    });
    sc.changes += edit.deletes.length + edit.inserts.length;
    appendFrom = edit.appendFrom;
  }
  for (let d = appendFrom; d < desired.length; d++) sc.addRules.addRule(t, chain.name, rule(d));
  sc.changes += desired.length - appendFrom;
}

/** Kernel rules' handles, chain by chain, in the order of the held model's rules. */
export type Handles = ReadonlyMap<string, readonly Handled[]>;
interface Handled {
  readonly handle: number;
}

/**
 * The operations that take a table from `held` to `spec` (`want` its model). What is stale
 * (needsRebuild lets nothing but SNAT length maps and CIDR chains be) goes last, after the rules
 * and elements naming it. With `staleChains: 'flush'` a stale chain is only emptied (share DNAT
 * deletes it in a transaction of its own); the stale chains are returned.
 */
export function renderEdit(
  sc: Script,
  spec: TableSpec,
  want: TableModel,
  held: TableModel,
  handles: Handles | undefined,
  staleChains: 'delete' | 'flush' = 'delete',
): readonly string[] {
  const t = spec.table;
  const edit = diffTable(held, want);
  edit.sets.forEach(({ edit: e }, i) => {
    const s = spec.sets[i] as SetSpec;
    if (e) {
      sc.deleteElements.deleteElements(t, s.name, e.deletes);
      sc.changes += e.deletes.length;
      addElements(sc, t, s, e.adds);
    } else {
      addSet(sc.create, t, s);
      sc.changes += 1;
      addElements(sc, t, s);
    }
  });
  edit.chains.forEach((c, i) => {
    const chain = spec.chains[i] as ChainSpec;
    if (c.create) {
      sc.create.addChain(t, chainOf(chain));
      sc.changes += 1;
    }
    renderChain(sc, t, chain, held.chains.get(c.name)?.rules.length ?? 0, handles?.get(c.name), c.edit);
  });
  for (const name of edit.staleSets) sc.drop.deleteSet(t, 'map', name);
  for (const name of edit.staleChains) {
    if (staleChains === 'delete') sc.drop.flushChain(t, name).deleteChain(t, name);
    else if (held.chains.get(name)?.rules.length) sc.drop.flushChain(t, name);
  }
  sc.changes += edit.staleSets.length + edit.staleChains.length;
  return edit.staleChains;
}

function renderFamily(sc: Script, spec: TableSpec | null, have: OwnedTable | null, fam: NftFamily): void {
  if (spec === null) {
    if (have !== null) {
      sc.create.deleteTable(natgwTable(fam));
      sc.changes += 1;
    }
    return;
  }
  if (have === null) {
    renderFresh(sc, spec);
    return;
  }
  const want = wantedModel(spec);
  const held = kernelModel(have, fam);
  if (needsRebuild(spec, have, diffTable(held, want))) {
    // Atomic in the same transaction: the table is never seen half-built.
    sc.create.deleteTable(natgwTable(fam));
    sc.changes += 1;
    renderFresh(sc, spec, want);
    return;
  }
  renderEdit(sc, spec, want, held, have.owned);
}

/** The one transaction that makes natgw's tables hold `want`; empty when they already do. */
export function planNatgw(want: NatTables, have: NatgwKernel): NftTxPlan {
  const sc = new Script();
  for (const fam of NFT_FAMILIES) renderFamily(sc, desiredFamily(want, fam), have[fam], fam);
  return { tx: sc.tx(), changes: sc.changes };
}

/**
 * The transaction that takes the tables of `families` from `before` to `after` without reading
 * back (a partial sync, partial.ts): both hold only what a change touched, and `snats` are every
 * SNAT rule before and after, whose prefix lengths shared_snat dispatches to.
 */
export function planTrusted(before: NatTables, after: NatTables, families: Iterable<NftFamily>, snats: readonly [readonly Snat[], readonly Snat[]]): NftTxPlan {
  const sc = new Script();
  for (const fam of families) {
    const spec = familySpec(after, fam, snats[1]);
    renderEdit(sc, spec, wantedModel(spec), wantedModel(familySpec(before, fam, snats[0])), undefined);
  }
  return { tx: sc.tx(), changes: sc.changes };
}

/** Remove natgw's tables, only those (never `flush ruleset`). */
export function removeAllTx(have: NatgwKernel): NftTransaction {
  const tx = new NftTransaction();
  for (const f of NFT_FAMILIES) if (have[f] !== null) tx.deleteTable(natgwTable(f));
  return tx;
}
