/**
 * PURE: connection timeouts for the flows natgw translates (issue 31; Cloud NAT's TCP
 * established, TCP transitory, TCP TIME_WAIT and UDP idle timeouts), rendered for either
 * netfilter backend. The kernel keeps a timeout policy per connection, chosen when the
 * connection's first packet creates its entry, so the selection looks at that first packet,
 * before any NAT rewrote it:
 *   - to an address and port natgw translates inbound (a DNAT, a share DNAT, a floating IP);
 *   - from the VPC interface, from a source natgw translates outbound (a SNAT CIDR, a floating
 *     IP's internal address), to an address that is not the gateway's own.
 * Everything else (traffic to the gateway itself, flows routed without NAT) keeps the kernel's
 * timeouts.
 *
 * nftables: a table of its own, `inet natgw_ct`, holding the timeout objects, interval sets of
 * the selectors and a prerouting chain after conntrack (priority -190: `ct timeout set` only
 * acts on an entry conntrack has created and not yet confirmed; in the raw priority it does
 * nothing). The objects live apart from the NAT table because deleting one sends every
 * connection that uses it back to the kernel's timeouts: a rebuild of the NAT table must not.
 *
 * iptables: chains CT_TIMEOUT (the selectors) and CT_TIMEOUT_SET (`-j CT --timeout`) in the raw
 * table, jumped to from PREROUTING; the CT target attaches its template before conntrack
 * creates the entry. The policies are nfnetlink_cttimeout objects made with `nfct`.
 *
 * An object's name carries a digest of its values: a changed setting is a new object, and the
 * old one is deleted once no rule names it (nftables cannot change an object in place).
 */
import { createHash } from 'node:crypto';
import ipaddr from 'ipaddr.js';
import { familyOfValid, parseCidr } from '../model/net.js';
import type { DesiredState } from '../state/state.js';

/** Seconds; an absent value keeps the kernel's own for those states. */
export interface CtTimeoutPolicy {
  readonly tcpEstablished?: number;
  readonly tcpTransitory?: number;
  readonly tcpTimeWait?: number;
  readonly udp?: number;
}

/** TCP states other than established and TIME_WAIT: opening and closing (Cloud NAT's "transitory"). */
const TRANSITORY_STATES = ['syn_sent', 'syn_recv', 'fin_wait', 'close_wait', 'last_ack', 'close'] as const;

export const isConfigured = (p: CtTimeoutPolicy | undefined): p is CtTimeoutPolicy =>
  p !== undefined && (p.tcpEstablished !== undefined || p.tcpTransitory !== undefined || p.tcpTimeWait !== undefined || p.udp !== undefined);

export interface TimeoutObject {
  readonly protocol: 'tcp' | 'udp';
  /** [state, seconds], in the kernel's state names (the same in nft and nfct). */
  readonly policy: ReadonlyArray<readonly [string, number]>;
}

/** The objects a policy needs: one per protocol it sets anything for. */
export function timeoutObjects(p: CtTimeoutPolicy): TimeoutObject[] {
  const tcp: Array<[string, number]> = [];
  if (p.tcpTransitory !== undefined) for (const s of TRANSITORY_STATES.slice(0, 2)) tcp.push([s, p.tcpTransitory]);
  if (p.tcpEstablished !== undefined) tcp.push(['established', p.tcpEstablished]);
  if (p.tcpTransitory !== undefined) for (const s of TRANSITORY_STATES.slice(2)) tcp.push([s, p.tcpTransitory]);
  if (p.tcpTimeWait !== undefined) tcp.push(['time_wait', p.tcpTimeWait]);
  const out: TimeoutObject[] = [];
  if (tcp.length > 0) out.push({ protocol: 'tcp', policy: tcp });
  if (p.udp !== undefined) {
    out.push({
      protocol: 'udp',
      policy: [
        ['unreplied', p.udp],
        ['replied', p.udp],
      ],
    });
  }
  return out;
}

/** `<prefix><protocol>_<8 hex of the values>`: within nfct's 31 characters. */
export function objectName(o: TimeoutObject, prefix: string): string {
  const digest = createHash('sha256')
    .update(o.policy.map(([s, v]) => `${s}=${v}`).join(','))
    .digest('hex')
    .slice(0, 8);
  return `${prefix}${o.protocol}_${digest}`;
}

// ---------------------------------------------------------------------------------
// What natgw translates
// ---------------------------------------------------------------------------------

interface DstSelector {
  readonly addr: string;
  /** Absent: every protocol (a floating IP). */
  readonly protocol?: 'tcp' | 'udp';
  readonly ports?: readonly [number, number];
}

export interface Selectors {
  readonly dst: readonly DstSelector[];
  /** CIDRs, none inside another (an interval set refuses overlapping elements). */
  readonly src: readonly string[];
}

const dstKey = (d: DstSelector): string => `${d.addr}|${d.protocol ?? ''}|${d.ports?.join('-') ?? ''}`;

/** The selectors of one address family, sorted, without duplicates. */
export function selectorsOf(s: DesiredState, family: 4 | 6): Selectors {
  if (!s.initialized) return { dst: [], src: [] };
  const of = (a: string) => familyOfValid(a) === family;
  const dst = new Map<string, DstSelector>();
  const add = (d: DstSelector) => dst.set(dstKey(d), d);
  for (const d of s.dnats) if (of(d.eip)) add({ addr: d.eip, protocol: d.protocol, ports: [d.port, d.portEnd ?? d.port] });
  for (const d of s.shareDnats) if (of(d.eip)) add({ addr: d.eip, protocol: d.protocol, ports: [d.port, d.port] });
  for (const f of s.fips) if (of(f.eip)) add({ addr: f.eip });
  const host = family === 4 ? 32 : 128;
  const cidrs = [...s.snats.map((x) => x.cidr), ...s.fips.map((f) => `${f.internalIp}/${host}`)].filter(of);
  const byKey = [...dst.entries()].sort((a, b) => cmp(a[0], b[0]));
  return { dst: byKey.map(([, d]) => d), src: outermost(cidrs) };
}

const cmp = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

/**
 * The network of `len` bits of an address, as a key: for IPv4 one number (the kept bits, and the
 * length), otherwise the kept bytes as text.
 */
function networkKey(bytes: readonly number[], len: number): number | string {
  if (bytes.length === 4) {
    const n = (((bytes[0] as number) << 24) | ((bytes[1] as number) << 16) | ((bytes[2] as number) << 8) | (bytes[3] as number)) >>> 0;
    return (len === 0 ? 0 : Math.floor(n / 2 ** (32 - len))) * 64 + len;
  }
  const out: number[] = [];
  for (let i = 0; i < bytes.length; i++) {
    const keep = Math.max(0, Math.min(8, len - i * 8));
    out.push((bytes[i] as number) & (0xff << (8 - keep)) & 0xff);
  }
  return `${len}/${out.join('.')}`;
}

/**
 * The CIDRs not inside another one of the list, sorted. Shortest prefixes first; a CIDR is inside
 * a kept one when its address masked to that one's length is that one's network: one lookup per
 * prefix length in use, so a thousand SNAT CIDRs cost thousands of steps, not a million.
 */
function outermost(cidrs: readonly string[]): string[] {
  const parsed = [...new Set(cidrs)].flatMap((c) => {
    const p = parseCidr(c, { clearHostBits: true });
    return p ? [{ text: c, prefix: p.prefix, bytes: ipaddr.parse(p.address).toByteArray() }] : [];
  });
  parsed.sort((a, b) => a.prefix - b.prefix || cmp(a.text, b.text));
  const kept: string[] = [];
  const networks = new Set<number | string>();
  const lengths: number[] = [];
  for (const c of parsed) {
    if (lengths.some((len) => len <= c.prefix && networks.has(networkKey(c.bytes, len)))) continue;
    kept.push(c.text);
    networks.add(networkKey(c.bytes, c.prefix));
    if (!lengths.includes(c.prefix)) lengths.push(c.prefix);
  }
  return kept.sort(cmp);
}

// ---------------------------------------------------------------------------------
// nftables
// ---------------------------------------------------------------------------------

export const CT_TABLE = 'natgw_ct';
const T = `inet ${CT_TABLE}`;
const CT_CHAIN = { prerouting: 'prerouting', set: 'set_timeout' } as const;
/** After conntrack (-200), before the NAT chains (-100) and the accounting (-160). */
const CT_PRIORITY = -190;
export const CT_SETS = ['dst4', 'src4', 'dst6', 'src6'] as const;
type CtSetName = (typeof CT_SETS)[number];

interface CtRule {
  /** Its comment: how a read-back recognises it. */
  readonly id: string;
  readonly text: string;
}

/** What `inet natgw_ct` must hold. */
export interface NftCtTable {
  /** name → the object's block body. */
  readonly objects: ReadonlyMap<string, string>;
  readonly sets: Readonly<Record<CtSetName, readonly string[]>>;
  readonly chains: Readonly<Record<'prerouting' | 'set_timeout', readonly CtRule[]>>;
}

/** What a read-back found in `inet natgw_ct`; null: no table. */
export interface NftCtHave {
  readonly objects: ReadonlySet<string>;
  readonly sets: ReadonlyMap<string, ReadonlySet<string>>;
  /** Chain → its rules' comments, in order. */
  readonly chains: ReadonlyMap<string, readonly string[]>;
  /** Whether the chains are declared as natgw declares them (else the table is rebuilt). */
  readonly declaredRight: boolean;
}

const portsText = (p: readonly [number, number]): string => (p[0] === p[1] ? String(p[0]) : `${p[0]}-${p[1]}`);

/** A selector as interval-set elements (`addr . proto . port[-port]`), as nft lists them. */
function dstElements(d: DstSelector): string[] {
  const protos = d.protocol ? [d.protocol] : (['tcp', 'udp'] as const);
  return protos.map((p) => `${d.addr} . ${p} . ${portsText(d.ports ?? [0, 65535])}`);
}

/** A CIDR as nft lists an interval-set element: a host prefix as the bare address. */
function srcElement(cidr: string): string {
  const c = parseCidr(cidr);
  if (!c) throw new Error(`invalid CIDR ${cidr}`);
  return c.prefix === (familyOfValid(c.address) === 4 ? 32 : 128) ? c.address : `${c.address}/${c.prefix}`;
}

export function nftCtTable(s: DesiredState, p: CtTimeoutPolicy): NftCtTable {
  const objects = new Map<string, string>();
  const setRules: CtRule[] = [];
  for (const o of timeoutObjects(p)) {
    const name = objectName(o, '');
    objects.set(name, `protocol ${o.protocol}; l3proto ip; policy = { ${o.policy.map(([k, v]) => `${k}: ${v}`).join(', ')} };`);
    setRules.push({ id: `${o.protocol} ${name}`, text: `meta l4proto ${o.protocol} ct timeout set "${name}"` });
  }
  const v4 = selectorsOf(s, 4);
  const v6 = selectorsOf(s, 6);
  const vpc = s.interfaces.vpc;
  return {
    objects,
    sets: {
      dst4: v4.dst.flatMap(dstElements),
      src4: v4.src.map(srcElement),
      dst6: v6.dst.flatMap(dstElements),
      src6: v6.src.map(srcElement),
    },
    chains: {
      prerouting: [
        { id: 'new', text: 'ct state != new return' },
        { id: 'dst4', text: `ip daddr . meta l4proto . th dport @dst4 goto ${CT_CHAIN.set}` },
        { id: 'dst6', text: `ip6 daddr . meta l4proto . th dport @dst6 goto ${CT_CHAIN.set}` },
        { id: `src4 ${vpc}`, text: `iifname "${vpc}" ip saddr @src4 fib daddr type != local goto ${CT_CHAIN.set}` },
        { id: `src6 ${vpc}`, text: `iifname "${vpc}" ip6 saddr @src6 fib daddr type != local goto ${CT_CHAIN.set}` },
      ],
      set_timeout: setRules,
    },
  };
}

const SET_TYPES: Record<CtSetName, string> = {
  dst4: 'ipv4_addr . inet_proto . inet_service',
  src4: 'ipv4_addr',
  dst6: 'ipv6_addr . inet_proto . inet_service',
  src6: 'ipv6_addr',
};

function createAll(want: NftCtTable): string[] {
  const out = [`add table ${T}`];
  for (const [name, body] of want.objects) out.push(`table ${T} {\n\tct timeout ${name} {\n\t\t${body}\n\t}\n}`);
  for (const set of CT_SETS) {
    out.push(`add set ${T} ${set} { type ${SET_TYPES[set]}; flags interval; }`);
    if (want.sets[set].length > 0) out.push(`add element ${T} ${set} { ${want.sets[set].join(', ')} }`);
  }
  out.push(`add chain ${T} ${CT_CHAIN.prerouting} { type filter hook prerouting priority ${CT_PRIORITY}; policy accept; }`);
  out.push(`add chain ${T} ${CT_CHAIN.set}`);
  for (const name of [CT_CHAIN.set, CT_CHAIN.prerouting] as const) for (const r of want.chains[name]) out.push(ruleLine(name, r));
  return out;
}

const ruleLine = (chain: string, r: CtRule): string => `add rule ${T} ${chain} ${r.text} comment "${r.id}"`;

/**
 * The nft script taking `have` to `want` (null: no table wanted); '' when nothing differs.
 * Objects are added before the rules that name them and deleted after.
 */
export function planNftCt(want: NftCtTable | null, have: NftCtHave | null): string {
  if (want === null) return have === null ? '' : `delete table ${T}\n`;
  if (have === null) return `${createAll(want).join('\n')}\n`;
  if (!have.declaredRight) return `${[`delete table ${T}`, ...createAll(want)].join('\n')}\n`;
  const out: string[] = [];
  for (const [name, body] of want.objects) if (!have.objects.has(name)) out.push(`table ${T} {\n\tct timeout ${name} {\n\t\t${body}\n\t}\n}`);
  for (const set of CT_SETS) {
    const got = have.sets.get(set);
    if (!got) {
      out.push(`add set ${T} ${set} { type ${SET_TYPES[set]}; flags interval; }`);
      if (want.sets[set].length > 0) out.push(`add element ${T} ${set} { ${want.sets[set].join(', ')} }`);
      continue;
    }
    const wanted = new Set(want.sets[set]);
    const stale = [...got].filter((e) => !wanted.has(e));
    const missing = want.sets[set].filter((e) => !got.has(e));
    if (stale.length > 0) out.push(`delete element ${T} ${set} { ${stale.join(', ')} }`);
    if (missing.length > 0) out.push(`add element ${T} ${set} { ${missing.join(', ')} }`);
  }
  // The set chain first: prerouting's rules jump to it.
  for (const name of [CT_CHAIN.set, CT_CHAIN.prerouting] as const) {
    const rules = want.chains[name];
    const got = have.chains.get(name);
    if (got && got.length === rules.length && got.every((id, i) => id === rules[i]?.id)) continue;
    if (!got) {
      out.push(
        name === CT_CHAIN.prerouting
          ? `add chain ${T} ${name} { type filter hook prerouting priority ${CT_PRIORITY}; policy accept; }`
          : `add chain ${T} ${name}`,
      );
    } else out.push(`flush chain ${T} ${name}`);
    for (const r of rules) out.push(ruleLine(name, r));
  }
  for (const name of have.objects) if (!want.objects.has(name)) out.push(`delete ct timeout ${T} ${name}`);
  return out.length > 0 ? `${out.join('\n')}\n` : '';
}

/** An element of `nft -j` as the text planNftCt writes. */
function elementText(e: unknown): string | undefined {
  if (typeof e === 'string' || typeof e === 'number') return String(e);
  if (typeof e !== 'object' || e === null) return undefined;
  const o = e as Record<string, unknown>;
  if (Array.isArray(o.concat)) {
    const parts = o.concat.map(elementText);
    return parts.every((p) => p !== undefined) ? parts.join(' . ') : undefined;
  }
  if (Array.isArray(o.range) && o.range.length === 2) return `${String(o.range[0])}-${String(o.range[1])}`;
  const prefix = o.prefix as { addr?: unknown; len?: unknown } | undefined;
  if (prefix && typeof prefix.addr === 'string' && typeof prefix.len === 'number') return `${prefix.addr}/${prefix.len}`;
  if ('elem' in o) return elementText((o.elem as { val?: unknown }).val);
  return undefined;
}

/** PURE: `nft -j list table inet natgw_ct` → what planNftCt compares. */
export function parseNftCt(json: string): NftCtHave {
  const items = (JSON.parse(json) as { nftables?: unknown[] }).nftables ?? [];
  const objects = new Set<string>();
  const sets = new Map<string, Set<string>>();
  const chains = new Map<string, string[]>();
  let declaredRight = true;
  for (const item of items as Record<string, Record<string, unknown>>[]) {
    const obj = item['ct timeout'];
    if (obj && typeof obj.name === 'string') objects.add(obj.name);
    const set = item.set;
    if (set && typeof set.name === 'string') {
      const elems = Array.isArray(set.elem) ? set.elem.map(elementText) : [];
      // An element natgw cannot read back cannot be diffed: the table is rebuilt.
      if (elems.some((e) => e === undefined) || !(CT_SETS as readonly string[]).includes(set.name)) declaredRight = false;
      sets.set(set.name, new Set(elems.filter((e): e is string => e !== undefined)));
    }
    const chain = item.chain;
    if (chain && typeof chain.name === 'string') {
      if (!chains.has(chain.name)) chains.set(chain.name, []);
      const base = chain.hook !== undefined;
      const right =
        chain.name === CT_CHAIN.prerouting
          ? base && chain.hook === 'prerouting' && chain.prio === CT_PRIORITY && chain.type === 'filter' && chain.policy === 'accept'
          : chain.name === CT_CHAIN.set && !base;
      if (!right) declaredRight = false;
    }
    const rule = item.rule;
    if (rule && typeof rule.chain === 'string') {
      const list = chains.get(rule.chain) ?? [];
      chains.set(rule.chain, list);
      list.push(typeof rule.comment === 'string' ? rule.comment : '');
    }
  }
  return { objects, sets, chains, declaredRight };
}

// ---------------------------------------------------------------------------------
// iptables
// ---------------------------------------------------------------------------------

const IPT_CHAIN = { select: 'CT_TIMEOUT', set: 'CT_TIMEOUT_SET' } as const;
const JUMP = `-A PREROUTING -j ${IPT_CHAIN.select}`;

/** What one family's raw table and the nfct policies must hold. */
export interface IptCtFamily {
  /** nfct policy name → `nfct add timeout` arguments after the name. */
  readonly policies: ReadonlyMap<string, readonly string[]>;
  /** natgw's lines of the raw table in save form, the PREROUTING jump first. */
  readonly lines: readonly string[];
}

/** What a read-back of one family found. */
export interface IptCtHave {
  /** natgw's policies (names starting with `natgw_`) of this family. */
  readonly policies: ReadonlySet<string>;
  /** natgw's lines of the raw table in save form (normalised as compareLine does). */
  readonly lines: readonly string[];
  readonly chains: boolean;
}

/** iptables-save shortens a CT target's --timeout name (1.8.9 prints four characters): compared without it; the rule's comment carries the name. */
export const compareLine = (line: string): string => line.replace(/ --timeout \S+/, ' --timeout');

export function iptCtFamily(s: DesiredState, p: CtTimeoutPolicy, family: 4 | 6): IptCtFamily {
  const sel = selectorsOf(s, family);
  const host = family === 4 ? '/32' : '/128';
  const lines = [JUMP];
  const go = `-g ${IPT_CHAIN.set}`;
  for (const d of sel.dst) {
    const ports = d.ports ? ` --dport ${d.ports[0] === d.ports[1] ? d.ports[0] : `${d.ports[0]}:${d.ports[1]}`}` : '';
    const proto = d.protocol ? ` -p ${d.protocol} -m ${d.protocol}${ports}` : '';
    lines.push(`-A ${IPT_CHAIN.select} -d ${d.addr}${host}${proto} ${go}`);
  }
  for (const c of sel.src) {
    // iptables drops a match of every source from what it saves.
    const src = /\/0$/.test(c) ? '' : ` -s ${c}`;
    lines.push(`-A ${IPT_CHAIN.select}${src} -i ${s.interfaces.vpc} -m addrtype ! --dst-type LOCAL ${go}`);
  }
  const policies = new Map<string, string[]>();
  for (const o of timeoutObjects(p)) {
    const name = objectName(o, `natgw_${family}_`);
    policies.set(name, [family === 4 ? 'inet' : 'inet6', o.protocol, ...o.policy.flatMap(([k, v]) => [k, String(v)])]);
    lines.push(`-A ${IPT_CHAIN.set} -p ${o.protocol} -m comment --comment ${name} -j CT --timeout ${name}`);
  }
  return { policies, lines };
}

/** PURE: natgw's lines of an `iptables-save -t raw`. */
export function parseIptCt(save: string): { lines: string[]; chains: boolean } {
  const lines: string[] = [];
  let chains = false;
  for (const l of save.split('\n')) {
    if (l === `:${IPT_CHAIN.select} - [0:0]` || l.startsWith(`:${IPT_CHAIN.select} `)) chains = true;
    if (l === JUMP || l.startsWith(`-A ${IPT_CHAIN.select} `) || l.startsWith(`-A ${IPT_CHAIN.set} `)) lines.push(compareLine(l));
  }
  return { lines, chains };
}

/** PURE: policy names of `nfct list timeout` that natgw owns, per family (its l3proto: 2 inet, 10 inet6). */
export function parseNfctList(text: string): { 4: Set<string>; 6: Set<string> } {
  const out = { 4: new Set<string>(), 6: new Set<string>() };
  for (const m of text.matchAll(/^\.(natgw_\S+) = \{\s*\.l3proto = (\d+),/gm)) {
    const [, name, l3] = m;
    if (name) (l3 === '10' ? out[6] : out[4]).add(name);
  }
  return out;
}

const SELECT_PREFIX = `-A ${IPT_CHAIN.select} `;

/**
 * Only selector lines differ (a rule added or removed): their order does not matter (each goes
 * to the same chain), so the change is those lines deleted and appended, not the chain rewritten
 * (a command's cost then does not grow with the number of rules). Null when anything else differs.
 */
function selectorEdit(want: IptCtFamily, have: IptCtHave): string[] | null {
  const others = (lines: readonly string[]) => lines.filter((l) => !l.startsWith(SELECT_PREFIX)).map(compareLine);
  const a = others(want.lines);
  const b = others(have.lines);
  if (a.length !== b.length || a.some((l, i) => l !== b[i])) return null;
  const count = new Map<string, number>();
  for (const l of have.lines) if (l.startsWith(SELECT_PREFIX)) count.set(l, (count.get(l) ?? 0) + 1);
  const add: string[] = [];
  for (const l of want.lines) {
    if (!l.startsWith(SELECT_PREFIX)) continue;
    const n = count.get(l) ?? 0;
    if (n > 0) count.set(l, n - 1);
    else add.push(l);
  }
  const del: string[] = [];
  for (const [l, n] of count) for (let i = 0; i < n; i++) del.push(`-D ${l.slice(3)}`);
  if (del.length + add.length === 0) return [];
  // The policy chain is written again with the edit: the kernel hands a CT target's policy name
  // back cut to four bytes (xt_CT reports revision 0's user size for every revision), and
  // iptables-legacy commits the whole table it read, so an edit that kept those rules as read
  // would be refused ("No chain/target/match by that name").
  const set = want.lines.filter((l) => l.startsWith(`-A ${IPT_CHAIN.set} `));
  return [`:${IPT_CHAIN.set} - [0:0]`, ...del, ...add, ...set];
}

/** The raw table's restore script (null: nothing to change). */
export function planIptCt(want: IptCtFamily | null, have: IptCtHave): string | null {
  if (want === null) {
    if (!have.chains && have.lines.length === 0) return null;
    const out = ['*raw'];
    if (have.lines.includes(JUMP)) out.push(`-D PREROUTING -j ${IPT_CHAIN.select}`);
    if (have.chains) out.push(`-F ${IPT_CHAIN.select}`, `-F ${IPT_CHAIN.set}`, `-X ${IPT_CHAIN.select}`, `-X ${IPT_CHAIN.set}`);
    out.push('COMMIT', '');
    return out.join('\n');
  }
  const wanted = want.lines.map(compareLine);
  if (have.chains && wanted.length === have.lines.length && wanted.every((l, i) => l === have.lines[i])) return null;
  const edit = have.chains ? selectorEdit(want, have) : null;
  if (edit !== null) return edit.length === 0 ? null : ['*raw', ...edit, 'COMMIT', ''].join('\n');
  const out = ['*raw', `:${IPT_CHAIN.select} - [0:0]`, `:${IPT_CHAIN.set} - [0:0]`];
  // Declaring a chain flushes it; the PREROUTING jump is natgw's one line in a built-in chain.
  const jumps = have.lines.filter((l) => l === JUMP).length;
  for (let i = 1; i < jumps; i++) out.push(`-D PREROUTING -j ${IPT_CHAIN.select}`);
  if (jumps === 0) out.push(`-I PREROUTING 1 -j ${IPT_CHAIN.select}`);
  for (const l of want.lines) if (l !== JUMP) out.push(l);
  out.push('COMMIT', '');
  return out.join('\n');
}
