/**
 * PURE read-back of nftables state: `nft -j list table <family> <name>` JSON → a small typed
 * dump (chains with their rules, sets and maps with their elements), then → what natgw owns
 * (rules recognised as natgw's, see render.ts) and → NatTables for adoption.
 *
 * Rules are recognised by exact structure: the parameters of a candidate rule (an interface
 * name, a CIDR, an EIP) are lifted from the JSON, the JSON natgw would have produced for those
 * parameters is built (render.ts ruleJson) and the two must be equal after normalisation.
 * Anything else in natgw's chains is foreign and the renderer deletes it by handle.
 */
import { canonicalIp, familyOf, formatCidr, isInterfaceName, isIp, isIpv6, parseCidr } from '../../../model/net.js';
import type { Dnat, Fip, Snat } from '../../../model/rules.js';
import { joinFamilies, type NatTables } from '../backend.js';
import type { BaseHook } from '../tables/model.js';
import { CHAIN, SET, ruleJson } from './render.js';
import { dispatchCandidate, isSliceable, l4TcpUdpJson, snatRulesOf } from './snatLayout.js';
import type { NatgwKernel, NatgwRule, NftChainDump, NftElementDump, NftFamily, NftRuleDump, NftSetDump, NftTableDump, OwnedTable } from './types.js';

// ---------------------------------------------------------------------------------
// Generic dump of one table
// ---------------------------------------------------------------------------------

/** The JSON did not have the shape `nft -j` produces: a tool change, never user input. */
class NftParseError extends Error {
  override readonly name = 'NftParseError';
}

type Json = unknown;
type Obj = Record<string, Json>;

const isObj = (v: Json): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Walk a path of object keys and array indexes; undefined as soon as the shape differs. */
export function dig(v: Json, ...path: ReadonlyArray<string | number>): Json {
  let cur: Json = v;
  for (const p of path) {
    if (typeof p === 'number') {
      if (!Array.isArray(cur)) return undefined;
      cur = cur[p];
    } else {
      if (!isObj(cur)) return undefined;
      cur = cur[p];
    }
  }
  return cur;
}

/** The text natgw would write for an element key or value (IPv6 in canonical form). */
function elementText(v: Json): string {
  if (typeof v === 'number') return String(v);
  if (typeof v === 'string') return isIpv6(v) ? canonicalIp(v) : v;
  if (Array.isArray(v)) return JSON.stringify(v);
  if (isObj(v)) {
    const concat = v['concat'];
    if (Array.isArray(concat)) return concat.map(elementText).join(' . ');
    const prefix = v['prefix'];
    if (isObj(prefix)) return `${elementText(prefix['addr'])}/${elementText(prefix['len'])}`;
    const range = v['range'];
    if (Array.isArray(range)) return range.map(elementText).join('-');
    // An element carrying attributes (timeout, counter, comment) is wrapped.
    const elem = v['elem'];
    if (isObj(elem) && 'val' in elem) return elementText(elem['val']);
    for (const verdict of ['goto', 'jump'] as const) {
      const target = dig(v, verdict, 'target');
      if (typeof target === 'string') return `${verdict} ${target}`;
    }
    for (const verdict of ['accept', 'drop', 'continue', 'return']) {
      if (verdict in v) return verdict;
    }
  }
  // Unknown: a text no desired element can equal, so the renderer replaces it.
  return JSON.stringify(v);
}

function typeText(t: Json): string {
  if (typeof t === 'string') return t;
  if (Array.isArray(t)) return t.map(String).join(' . ');
  return JSON.stringify(t);
}

/** An element of a set with counters is listed wrapped: `{ elem: { val, counter: { packets, bytes } } }`. */
function counterOf(e: Json): NftElementDump['counter'] {
  const c = dig(e, 'elem', 'counter');
  if (!isObj(c)) return undefined;
  const n = (v: Json): number => (typeof v === 'number' ? v : 0);
  return { packets: n(c['packets']), bytes: n(c['bytes']) };
}

function parseSet(o: Obj, kind: 'set' | 'map'): NftSetDump {
  const name = o['name'];
  if (typeof name !== 'string') throw new NftParseError(`${kind} without a name`);
  const elems = Array.isArray(o['elem']) ? o['elem'] : [];
  const elements: NftElementDump[] = elems.map((e: Json) => {
    if (kind === 'map') {
      // A map element is [key, value]; an element with attributes wraps the key.
      if (!Array.isArray(e) || e.length !== 2) return { key: elementText(e), value: '' };
      return { key: elementText(e[0]), value: elementText(e[1]) };
    }
    const counter = counterOf(e);
    return { key: elementText(e), ...(counter ? { counter } : {}) };
  });
  const flags = o['flags'];
  const stmt = o['stmt'];
  const counted = Array.isArray(stmt) && stmt.some((s) => isObj(s) && 'counter' in s);
  return {
    name,
    handle: typeof o['handle'] === 'number' ? o['handle'] : 0,
    kind,
    type: typeText(o['type']),
    ...(kind === 'map' ? { map: typeText(o['map']) } : {}),
    flags: Array.isArray(flags) ? flags.map(String) : typeof flags === 'string' ? [flags] : [],
    ...(counted ? { counter: true } : {}),
    elements,
  };
}

/**
 * Parse the output of `nft -j list table <family> <name>`. Objects of other tables (there
 * should be none) are ignored. Throws NftParseError when the text is not nft's JSON.
 */
export function parseTableListing(jsonText: string, family: string, name: string): NftTableDump {
  let doc: Json;
  try {
    doc = JSON.parse(jsonText);
  } catch (err) {
    throw new NftParseError(`nft -j output is not JSON: ${(err as Error).message}`);
  }
  const items = dig(doc, 'nftables');
  if (!Array.isArray(items)) throw new NftParseError('nft -j output has no "nftables" array');

  const chains = new Map<string, NftChainDump>();
  const sets = new Map<string, NftSetDump>();
  const ours = (o: Obj): boolean => o['family'] === family && o['table'] === name;
  const pendingRules: Array<{ chain: string; rule: NftRuleDump }> = [];
  let handle: number | undefined;

  for (const item of items) {
    if (!isObj(item)) continue;
    const chain = item['chain'];
    const set = item['set'];
    const map = item['map'];
    const rule = item['rule'];
    const table = item['table'];
    if (isObj(table) && table['family'] === family && table['name'] === name && typeof table['handle'] === 'number') {
      handle = table['handle'];
    } else if (isObj(chain) && ours(chain)) {
      const cname = chain['name'];
      if (typeof cname !== 'string') throw new NftParseError('chain without a name');
      const hook = chain['hook'];
      const base: BaseHook | undefined =
        typeof hook === 'string'
          ? {
              type: String(chain['type']),
              hook,
              priority: typeof chain['prio'] === 'number' ? chain['prio'] : Number.NaN,
              policy: typeof chain['policy'] === 'string' ? chain['policy'] : 'accept',
            }
          : undefined;
      chains.set(cname, {
        name: cname,
        handle: typeof chain['handle'] === 'number' ? chain['handle'] : 0,
        ...(base ? { base } : {}),
        rules: [],
      });
    } else if (isObj(set) && ours(set)) {
      const s = parseSet(set, 'set');
      sets.set(s.name, s);
    } else if (isObj(map) && ours(map)) {
      const s = parseSet(map, 'map');
      sets.set(s.name, s);
    } else if (isObj(rule) && ours(rule)) {
      const handle = rule['handle'];
      const cname = rule['chain'];
      if (typeof handle !== 'number' || typeof cname !== 'string') throw new NftParseError('rule without chain or handle');
      pendingRules.push({ chain: cname, rule: { handle, expr: Array.isArray(rule['expr']) ? rule['expr'] : [] } });
    }
  }
  for (const { chain, rule } of pendingRules) chains.get(chain)?.rules.push(rule);
  return { family, name, ...(handle !== undefined ? { handle } : {}), chains, sets };
}

// ---------------------------------------------------------------------------------
// Structural comparison of rule JSON
// ---------------------------------------------------------------------------------

/**
 * Normalise the few spots where equivalent rules print differently across nft versions:
 * the `family` of a nat statement appears only sometimes, and `flags` is a string or a list.
 */
function normalise(v: Json): Json {
  if (Array.isArray(v)) return v.map(normalise);
  if (!isObj(v)) return v;
  const out: Obj = {};
  for (const k of Object.keys(v).sort()) {
    const val = v[k];
    if ((k === 'snat' || k === 'dnat') && isObj(val)) {
      const copy: Obj = { ...val };
      delete copy['family'];
      if (typeof copy['flags'] === 'string') copy['flags'] = [copy['flags']];
      out[k] = normalise(copy);
    } else {
      out[k] = normalise(val);
    }
  }
  return out;
}

/** Equality of two rule expression lists, up to key order and the normalisations above. */
export function sameExpr(a: Json, b: Json): boolean {
  return JSON.stringify(normalise(a)) === JSON.stringify(normalise(b));
}

// ---------------------------------------------------------------------------------
// natgw's own rules
// ---------------------------------------------------------------------------------

const stringAt = (v: Json, ...path: ReadonlyArray<string | number>): string | undefined => {
  const s = dig(v, ...path);
  return typeof s === 'string' ? s : undefined;
};

function ifnameAt(expr: readonly unknown[]): string | undefined {
  const name = stringAt(expr, 0, 'match', 'right');
  return name !== undefined && isInterfaceName(name) ? name : undefined;
}

/** Lift a SNAT rule's parameters (`<fam> saddr <cidr> snat to <eip> [fully-random]`). */
function snatCandidate(expr: readonly unknown[], fam: NftFamily): NatgwRule | undefined {
  const right = dig(expr, 0, 'match', 'right');
  const cidrText =
    typeof right === 'string'
      ? right
      : isObj(right) && isObj(right['prefix'])
        ? `${String(right['prefix']['addr'])}/${String(right['prefix']['len'])}`
        : undefined;
  // A pool lists its EIPs as the data of an anonymous map keyed by numgen: [[0, eip], [1, eip], …].
  const poolData = dig(expr, 1, 'snat', 'addr', 'map', 'data', 'set');
  const pool = Array.isArray(poolData)
    ? poolData.map((e) => (Array.isArray(e) && typeof e[1] === 'string' && isIp(e[1]) ? canonicalIp(e[1]) : '')).filter((e) => e !== '')
    : undefined;
  const eip = pool ? pool[0] : stringAt(expr, 1, 'snat', 'addr');
  if (cidrText === undefined || eip === undefined || !isIp(eip)) return undefined;
  if (pool && (pool.length < 2 || pool.length !== (poolData as unknown[]).length)) return undefined;
  const c = parseCidr(cidrText, { clearHostBits: true, family: fam === 'ip' ? 4 : 6 });
  if (!c || familyOf(eip) !== (fam === 'ip' ? 4 : 6)) return undefined;
  const flags = dig(expr, 1, 'snat', 'flags');
  const randomFully = flags === 'fully-random' || (Array.isArray(flags) && flags.includes('fully-random'));
  return { kind: 'snat', cidr: formatCidr(c), eip: canonicalIp(eip), randomFully, ...(pool ? { pool } : {}) };
}

/** Lift a port-range DNAT's parameters (`<fam> daddr <eip> <proto> dport a-b dnat to <ip>:a-b`). */
function rangeDnatCandidate(expr: readonly unknown[]): NatgwRule | undefined {
  const eip = stringAt(expr, 0, 'match', 'right');
  const protocol = stringAt(expr, 1, 'match', 'left', 'payload', 'protocol');
  const range = dig(expr, 1, 'match', 'right', 'range');
  const internalIp = stringAt(expr, 2, 'dnat', 'addr');
  if (eip === undefined || !isIp(eip) || internalIp === undefined || !isIp(internalIp)) return undefined;
  if ((protocol !== 'tcp' && protocol !== 'udp') || !Array.isArray(range)) return undefined;
  const [port, portEnd] = range;
  if (typeof port !== 'number' || typeof portEnd !== 'number') return undefined;
  return { kind: 'range-dnat', eip: canonicalIp(eip), protocol, port, portEnd, internalIp: canonicalIp(internalIp) };
}

/**
 * A SNAT rule restricted to a port slice (`… meta l4proto { tcp, udp } snat … : lo-hi`): the
 * rule without the protocol match and the ports, recognised as any other, then checked whole.
 */
function slicedCandidate(expr: readonly unknown[], fam: NftFamily): NatgwRule | undefined {
  const n = expr.length;
  const range = dig(expr, n - 1, 'snat', 'port', 'range');
  if (n < 2 || !Array.isArray(range) || !sameExpr(expr[n - 2], l4TcpUdpJson())) return undefined;
  const [lo, hi] = range;
  if (typeof lo !== 'number' || typeof hi !== 'number') return undefined;
  const { port: _port, ...snat } = (expr[n - 1] as { snat: Record<string, unknown> }).snat;
  const inner = recogniseRule([...expr.slice(0, n - 2), { snat }], fam);
  return inner && isSliceable(inner) ? { ...inner, ports: { lo, hi } } : undefined;
}

/** Lift a hand-off rule's interfaces, rate and peer (`iifname { … } <packets> limit rate … dup to <peer>`). */
function handOffCandidate(expr: readonly unknown[]): Omit<Extract<NatgwRule, { kind: 'hand-off' }>, 'packets'> | undefined {
  const ifs = dig(expr, 0, 'match', 'right', 'set');
  const peer = dig(expr, expr.length - 1, 'dup', 'addr');
  const rate = dig(expr, expr.length - 2, 'limit', 'rate');
  if (!Array.isArray(ifs) || !ifs.every((i) => typeof i === 'string' && isInterfaceName(i)) || typeof peer !== 'string' || !isIp(peer)) return undefined;
  if (typeof rate !== 'number') return undefined;
  return { kind: 'hand-off', ifs: ifs as string[], peer: canonicalIp(peer), rate };
}

/** Which natgw rule this is, or null when it is not exactly one natgw renders. */
export function recogniseRule(expr: readonly unknown[], fam: NftFamily): NatgwRule | null {
  const candidates: NatgwRule[] = [
    { kind: 'fip-dnat' },
    { kind: 'port-dnat' },
    { kind: 'fip-snat' },
    { kind: 'drop-invalid' },
    { kind: 'invalid-own-socket' },
    { kind: 'new-udp-own-socket' },
    { kind: 'drop-new-udp' },
  ];
  const sliced = slicedCandidate(expr, fam);
  if (sliced) candidates.push(sliced);
  const ifname = ifnameAt(expr);
  if (ifname !== undefined) {
    candidates.push({ kind: 'vpc-mark', vpcIf: ifname }, { kind: 'snat-jump', extIf: ifname }, { kind: 'hairpin', vpcIf: ifname });
  }
  const snat = snatCandidate(expr, fam);
  if (snat) candidates.push(snat);
  const range = rangeDnatCandidate(expr);
  if (range) candidates.push(range);
  const dispatch = dispatchCandidate(expr, fam);
  if (dispatch) candidates.push(dispatch);
  const handOff = handOffCandidate(expr);
  if (handOff) candidates.push({ ...handOff, packets: 'invalid' }, { ...handOff, packets: 'new-udp' });
  return candidates.find((c) => sameExpr(ruleJson(c, fam), expr)) ?? null;
}

function ownTable(dump: NftTableDump, fam: NftFamily): OwnedTable {
  const owned = new Map([...dump.chains.values()].map((c) => [c.name, c.rules.map((r) => ({ handle: r.handle, rule: recogniseRule(r.expr, fam) }))] as const));
  return { ...dump, owned };
}

export function natgwKernel(ip: NftTableDump | null, ip6: NftTableDump | null): NatgwKernel {
  return { ip: ip && ownTable(ip, 'ip'), ip6: ip6 && ownTable(ip6, 'ip6') };
}

/** The init guard's evidence: table ip natgw with its three base chains, hooked as rendered. */
export function hasSkeleton(dump: NftTableDump | null): boolean {
  if (!dump) return false;
  const hooked = (name: string, hook: string, prio: number): boolean => {
    const b = dump.chains.get(name)?.base;
    return b !== undefined && b.hook === hook && b.priority === prio;
  };
  return hooked(CHAIN.vpcMark, 'prerouting', -150) && hooked(CHAIN.prerouting, 'prerouting', -100) && hooked(CHAIN.postrouting, 'postrouting', 100);
}

// ---------------------------------------------------------------------------------
// Adoption: the kernel → NatTables
// ---------------------------------------------------------------------------------

function splitElement(text: string): string[] {
  return text.split(' . ');
}

/** One family's table as NatTables; an interface no rule names is '' (joinFamilies). */
function familyTables(dump: OwnedTable): NatTables {
  const rulesOf = (chain: string): NatgwRule[] => (dump.owned.get(chain) ?? []).flatMap((r) => (r.rule ? [r.rule] : []));
  const mark = rulesOf(CHAIN.vpcMark).find((r) => r.kind === 'vpc-mark');
  const post = rulesOf(CHAIN.postrouting);
  const hairpin = post.find((r) => r.kind === 'hairpin');
  const jump = post.find((r) => r.kind === 'snat-jump');
  const vpcIf = mark?.kind === 'vpc-mark' ? mark.vpcIf : hairpin?.kind === 'hairpin' ? hairpin.vpcIf : '';
  const extIf = jump?.kind === 'snat-jump' ? jump.extIf : '';

  const elements = (set: string): readonly NftElementDump[] => dump.sets.get(set)?.elements ?? [];
  const eips = elements(SET.hairpinEips)
    .map((e) => e.key)
    .filter(isIp);
  const snats: Snat[] = snatRulesOf(dump.owned, dump.sets, dump.family as NftFamily).flatMap((r) =>
    r.kind === 'snat' ? [{ eip: r.eip, cidr: r.cidr, randomFully: r.randomFully, ...(r.pool ? { eips: [...r.pool] } : {}) }] : [],
  );
  // Several EIPs may bind one internal IP; the SNAT map names the one that came first, so
  // that one is put first again (the renderer takes the first binding in the given order).
  const snatWinner = new Map(elements(SET.fipSnat).map((e) => [e.key, e.value]));
  const fips: Fip[] = elements(SET.fipDnat)
    .flatMap((e) => (isIp(e.key) && e.value !== undefined && isIp(e.value) ? [{ eip: e.key, internalIp: e.value }] : []))
    .map((f, i) => ({ f, i, first: snatWinner.get(f.internalIp) === f.eip ? 0 : 1 }))
    .sort((a, b) => a.first - b.first || a.i - b.i)
    .map((x) => x.f);
  const dnats: Dnat[] = elements(SET.portDnat).flatMap((e) => {
    const [eip = '', proto = '', port = ''] = splitElement(e.key);
    const [ip = '', iport = ''] = splitElement(e.value ?? '');
    const p = Number(port);
    const ip2 = Number(iport);
    if (!isIp(eip) || !isIp(ip) || (proto !== 'tcp' && proto !== 'udp')) return [];
    if (!Number.isInteger(p) || p < 1 || p > 65535 || !Number.isInteger(ip2) || ip2 < 1 || ip2 > 65535) return [];
    return [{ eip, port: p, protocol: proto, internalIp: ip, internalPort: ip2 }];
  });
  for (const r of rulesOf(CHAIN.prerouting)) {
    if (r.kind !== 'range-dnat' || !(r.port >= 1 && r.port < r.portEnd && r.portEnd <= 65535)) continue;
    dnats.push({ eip: r.eip, port: r.port, portEnd: r.portEnd, protocol: r.protocol, internalIp: r.internalIp, internalPort: r.port });
  }
  return { vpcIf, extIf, eips, snats, dnats, fips };
}

/**
 * What natgw's tables hold, for adoption after a lost state file; null when natgw owns no
 * table. vpcIf comes from the mark rule (else the hairpin rule), extIf from the jump to
 * shared_snat, eips from the hairpin set; the families joined by joinFamilies (backend.ts).
 */
export function natTablesFromKernel(k: NatgwKernel): NatTables | null {
  return joinFamilies(k.ip && familyTables(k.ip), k.ip6 && familyTables(k.ip6));
}
