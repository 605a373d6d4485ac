import ipaddr from 'ipaddr.js';
import type { DesiredState } from '../state/state.js';
import { eipInterface, hasSecondaryUplinks, MAX_UPLINKS, uplinkNames } from '../model/uplinks.js';
import { familyOf } from '../model/net.js';

/**
 * PURE: the policy routing that lets each secondary uplink carry its own EIPs' traffic
 * (docs/decisions/0008-several-uplinks.md). Forwarded traffic is routed before SNAT and before
 * a DNAT reply is translated back, so a rule on the EIP alone steers only the gateway's own
 * packets. natgw therefore holds, with secondary uplinks only:
 *
 * - per secondary uplink k (1-based) route table 7100+k: `default via <its gateway> dev <it>
 *   onlink` where a gateway is configured, and always an `unreachable default` of the highest
 *   metric, so that its traffic never leaks out of another uplink while it is down;
 * - a connection mark per uplink (the primary's too), set on a connection's first packet in by
 *   that uplink and restored onto the VPC side's packets: replies of DNAT and FIP follow the
 *   connection back out the uplink it came in by (`fwmark … lookup`);
 * - `from <eip>` for the gateway's own packets from a secondary EIP;
 * - `from <source> iif <vpc>` for each SNAT source and FIP internal address whose EIP is on a
 *   secondary uplink, longest prefix first; a more specific source on the primary that such a
 *   rule would catch gets `lookup main` before it.
 *
 * Every selector for a secondary table first looks in main without its default routes
 * (`suppress_prefixlength 0`): the VPC's own subnets and directly connected networks keep
 * their routes. IPv4 only (IPv6 EIPs on a secondary uplink get their address but no routing).
 * natgw owns the rule priorities 7200–7499 and the tables 7101–7116, nothing else.
 */
const UPLINK_TABLE_BASE = 7100;
const UPLINK_PREF_MIN = 7200;
const UPLINK_PREF_MAX = 7499;
const PREF_MARK = 7200;
const PREF_EIP = 7300;
const PREF_SOURCE = 7400;
/** The connection mark bits natgw uses for uplinks: one byte, the uplink's index + 1. */
const UPLINK_MARK_MASK = 0xff0000;
/** An unreachable default below every real one: a down uplink's traffic is dropped, not leaked. */
const UNREACHABLE_METRIC = 4278198272;

const uplinkMark = (index: number): number => (index + 1) << 16;
const uplinkTable = (secondaryIndex: number): number => UPLINK_TABLE_BASE + secondaryIndex;
/** Every table natgw may hold (what a full sync reads back). */
export const UPLINK_TABLES: readonly number[] = Array.from({ length: MAX_UPLINKS }, (_, i) => uplinkTable(i + 1));

export interface UplinkRule {
  readonly pref: number;
  /** A CIDR (a bare address for /32); absent: every source. */
  readonly src?: string;
  readonly iif?: string;
  readonly fwmark?: number;
  /** The mark's mask (UPLINK_MARK_MASK unless read back otherwise). */
  readonly fwmask?: number;
  /** `main` or a table number. */
  readonly table: string;
  readonly suppress?: boolean;
}

export interface UplinkRoute {
  readonly table: number;
  /** A read-back route to anything but the default (not natgw's: removed). */
  readonly dst?: string;
  /** `unicast` via the uplink's gateway, or the fallback `unreachable`. */
  readonly type: 'unicast' | 'unreachable';
  readonly gateway?: string;
  readonly dev?: string;
}

interface UplinkMark {
  readonly dev: string;
  readonly mark: number;
}

export interface UplinkWant {
  readonly vpc: string;
  readonly rules: readonly UplinkRule[];
  readonly routes: readonly UplinkRoute[];
  /** Empty: natgw holds no connection marks. */
  readonly marks: readonly UplinkMark[];
}

const NO_UPLINKS: UplinkWant = { vpc: '', rules: [], routes: [], marks: [] };

/** The rule as `ip rule add|del` takes it (also its identity). */
export function ruleText(r: UplinkRule): string {
  const parts = [`pref ${r.pref}`, `from ${r.src ?? 'all'}`];
  if (r.iif !== undefined) parts.push(`iif ${r.iif}`);
  if (r.fwmark !== undefined) parts.push(`fwmark 0x${r.fwmark.toString(16)}/0x${(r.fwmask ?? UPLINK_MARK_MASK).toString(16)}`);
  parts.push(`lookup ${r.table}`);
  if (r.suppress) parts.push('suppress_prefixlength 0');
  return parts.join(' ');
}

/** The route as `ip route replace|del` takes it (its identity is the same text). */
export function routeText(r: UplinkRoute): string {
  if (r.dst !== undefined) return `${r.dst} table ${r.table}`;
  return r.type === 'unreachable'
    ? `unreachable default metric ${UNREACHABLE_METRIC} table ${r.table}`
    : `default via ${r.gateway} dev ${r.dev} onlink table ${r.table}`;
}

/** PURE: what natgw must hold for `s`; NO_UPLINKS with one external interface or before init. */
export function planUplinks(s: DesiredState): UplinkWant {
  if (!s.initialized || !hasSecondaryUplinks(s.interfaces)) return NO_UPLINKS;
  const names = uplinkNames(s.interfaces);
  const secondary = s.interfaces.secondary ?? [];
  const tableOf = new Map(secondary.map((u, i) => [u.name, uplinkTable(i + 1)]));
  const rules = new Map<string, UplinkRule>();
  const add = (r: UplinkRule): void => void rules.set(ruleText(r), r);
  const steer = (pref: number, sel: Pick<UplinkRule, 'src' | 'iif' | 'fwmark'>, table: number): void => {
    add({ pref, ...sel, table: 'main', suppress: true });
    add({ pref: pref + 1, ...sel, table: String(table) });
  };

  names.forEach((dev, k) => {
    const table = tableOf.get(dev);
    if (table === undefined) add({ pref: PREF_MARK, fwmark: uplinkMark(k), table: 'main' });
    else steer(PREF_MARK + 1, { fwmark: uplinkMark(k) }, table);
  });

  const eipOn = new Map(s.eips.map((e) => [e.address, eipInterface(s.interfaces, e)]));
  for (const e of s.eips) {
    const table = tableOf.get(eipOn.get(e.address) ?? '');
    if (table !== undefined && familyOf(e.address) === 4) steer(PREF_EIP, { src: e.address }, table);
  }

  // Sources leaving by a secondary uplink, and those on the primary that one of them covers.
  const sources = [
    ...s.snats.map((x) => ({ cidr: x.cidr, dev: eipOn.get(x.eip) ?? s.interfaces.ext })),
    ...s.fips.map((f) => ({ cidr: `${f.internalIp}/32`, dev: eipOn.get(f.eip) ?? s.interfaces.ext })),
  ].filter((x) => familyOf(x.cidr.split('/')[0] ?? '') === 4);
  const steered = sources.filter((x) => tableOf.has(x.dev));
  for (const x of sources) {
    const [address = '', len = '32'] = x.cidr.split('/');
    const prefix = Number(len);
    // Three priorities per prefix length, longest first: the primary's `lookup main` wins a tie.
    const pref = PREF_SOURCE + 3 * (32 - prefix);
    const src = prefix === 32 ? address : x.cidr;
    const table = tableOf.get(x.dev);
    if (table !== undefined) steer(pref + 1, { src, iif: s.interfaces.vpc }, table);
    else if (steered.some((o) => covers(o.cidr, x.cidr))) add({ pref, src, iif: s.interfaces.vpc, table: 'main' });
  }

  const routes: UplinkRoute[] = secondary.flatMap((u, i): UplinkRoute[] => [
    ...(u.gateway !== undefined && familyOf(u.gateway) === 4 ? [{ table: uplinkTable(i + 1), type: 'unicast' as const, gateway: u.gateway, dev: u.name }] : []),
    { table: uplinkTable(i + 1), type: 'unreachable' },
  ]);
  return { vpc: s.interfaces.vpc, rules: [...rules.values()], routes, marks: names.map((dev, k) => ({ dev, mark: uplinkMark(k) })) };
}

/** Whether network `outer` holds all of `inner`. */
function covers(outer: string, inner: string): boolean {
  const [oa = '', ol = '32'] = outer.split('/');
  const [ia = '', il = '32'] = inner.split('/');
  if (Number(ol) > Number(il)) return false;
  return ipaddr.IPv4.parse(ia).match(ipaddr.IPv4.parse(oa), Number(ol));
}

interface IpRuleJson {
  priority?: number;
  src?: string;
  srclen?: number;
  iif?: string;
  fwmark?: string;
  fwmask?: string;
  table?: string;
  suppress_prefixlen?: number;
}

/** PURE: natgw's rules (its priorities) from `ip -j rule show`, as ruleText spells them. */
export function ownedRules(json: string): string[] {
  const list = JSON.parse(json || '[]') as IpRuleJson[];
  return list
    .filter((r) => typeof r.priority === 'number' && r.priority >= UPLINK_PREF_MIN && r.priority <= UPLINK_PREF_MAX)
    .map((r) =>
      ruleText({
        pref: r.priority as number,
        ...(r.src && r.src !== 'all' ? { src: r.srclen !== undefined && r.srclen !== 32 ? `${r.src}/${r.srclen}` : r.src } : {}),
        ...(r.iif ? { iif: r.iif } : {}),
        // `ip` prints no mask for a full one.
        ...(r.fwmark ? { fwmark: Number(r.fwmark), fwmask: r.fwmask ? Number(r.fwmask) : 0xffffffff } : {}),
        table: r.table ?? 'main',
        ...(r.suppress_prefixlen === 0 ? { suppress: true } : {}),
      }),
    );
}

interface IpRouteJson {
  type?: string;
  dst?: string;
  gateway?: string;
  dev?: string;
  metric?: number;
}

/** PURE: the routes of natgw's tables from `ip -j -batch` (one `route show table N` per line, UPLINK_TABLES order). */
export function ownedRoutes(lines: readonly string[]): UplinkRoute[] {
  return lines.flatMap((line, i) => {
    const table = UPLINK_TABLES[i];
    if (table === undefined) return [];
    return (JSON.parse(line || '[]') as IpRouteJson[]).map((r): UplinkRoute => {
      if (r.dst === 'default' && r.type === 'unreachable' && r.metric === UNREACHABLE_METRIC) return { table, type: 'unreachable' };
      if (r.dst === 'default' && r.type === undefined && !r.metric && r.gateway && r.dev) return { table, type: 'unicast', gateway: r.gateway, dev: r.dev };
      // Anything else in natgw's tables is not what it renders: named by its destination, removed.
      return {
        table,
        type: 'unicast',
        dst: `${r.type && r.type !== 'unicast' ? `${r.type} ` : ''}${r.dst ?? 'default'}${r.metric ? ` metric ${r.metric}` : ''}`,
      };
    });
  });
}

/** The connection marks as an nft table of natgw's own (replaced whole, atomically). */
export const NFT_UPLINK_TABLE = 'natgw_uplinks';

export function nftMarksScript(want: UplinkWant): string {
  const head = `table ip ${NFT_UPLINK_TABLE} {}\ndelete table ip ${NFT_UPLINK_TABLE}\n`;
  if (want.marks.length === 0) return head;
  const mask = `0x${UPLINK_MARK_MASK.toString(16)}`;
  const keep = `0x${(~UPLINK_MARK_MASK >>> 0).toString(16)}`;
  const lines = [
    // Before natgw's own mark (priority mangle): the VPC side's packets carry no mark yet.
    '\t\ttype filter hook prerouting priority -160; policy accept;',
    ...want.marks.map((m) => `\t\tiifname "${m.dev}" ct state new ct mark set ct mark and ${keep} or 0x${m.mark.toString(16)}`),
    `\t\tiifname "${want.vpc}" ct mark and ${mask} != 0 meta mark set ct mark and ${mask}`,
  ];
  return `${head}table ip ${NFT_UPLINK_TABLE} {\n\tchain prerouting {\n${lines.join('\n')}\n\t}\n}\n`;
}

/** The connection marks as an iptables chain of natgw's own in mangle, jumped to from PREROUTING. */
export const IPT_UPLINK_CHAIN = 'NATGW_UPLINKS';
export const IPT_UPLINK_JUMP = `-A PREROUTING -j ${IPT_UPLINK_CHAIN}`;

export function iptMarksLines(want: UplinkWant): string[] {
  const mask = `0x${UPLINK_MARK_MASK.toString(16)}`;
  return [
    ...want.marks.map((m) => `-A ${IPT_UPLINK_CHAIN} -i ${m.dev} -m conntrack --ctstate NEW -j CONNMARK --set-xmark 0x${m.mark.toString(16)}/${mask}`),
    ...(want.marks.length ? [`-A ${IPT_UPLINK_CHAIN} -i ${want.vpc} -j CONNMARK --restore-mark --nfmask ${mask} --ctmask ${mask}`] : []),
  ];
}

/** The iptables-restore --noflush script taking mangle from `haveJump` to `want`. */
export function iptMarksScript(want: UplinkWant, haveJump: boolean, haveChain: boolean): string {
  const lines = ['*mangle'];
  if (want.marks.length > 0) {
    lines.push(`:${IPT_UPLINK_CHAIN} - [0:0]`, ...iptMarksLines(want));
    if (!haveJump) lines.push(`-I PREROUTING 1 -j ${IPT_UPLINK_CHAIN}`);
  } else {
    if (haveJump) lines.push(`-D PREROUTING -j ${IPT_UPLINK_CHAIN}`);
    if (haveChain) lines.push(`:${IPT_UPLINK_CHAIN} - [0:0]`, `-X ${IPT_UPLINK_CHAIN}`);
  }
  lines.push('COMMIT');
  return `${lines.join('\n')}\n`;
}
