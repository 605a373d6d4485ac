import type { DnatAdd, DnatDel, EipAdd, Protocol } from './parse.js';

/**
 * What the LoadBalancer-service commands change, computed from what the kernel holds: pure.
 *
 * Objects and their identities (each exists once, whatever the order or repetition):
 * - a DNAT by (eip, protocol, port), to one internal ip:port (a re-add with another target
 *   replaces it: a Service's target port changed);
 * - a MASQUERADE by the internal address it sends to;
 * - a host route to the internal address in table 100, by that address;
 * - an `ip rule` from an interface to table 100, by the interface.
 * A MASQUERADE and a route serve every DNAT to their internal address: they go when the last
 * such DNAT goes (the script leaves them behind).
 */

export const ROUTE_TABLE = 100;

export interface Dnat {
  readonly eip: string;
  readonly port: number;
  readonly protocol: Protocol;
  readonly internalIp: string;
  readonly internalPort: number;
}

/** natgw's NAT objects as read from the kernel (duplicates kept: the script could leave some). */
export interface NatView {
  readonly dnats: readonly Dnat[];
  readonly masquerades: readonly string[];
}

/** Host routes in table 100: destination → gateway. */
export type RouteView = ReadonlyMap<string, string>;

export interface NatChange {
  readonly delDnat: readonly Dnat[];
  readonly addDnat: readonly Dnat[];
  readonly delMasq: readonly string[];
  readonly addMasq: readonly string[];
}

export interface Route {
  readonly dest: string;
  readonly via: string;
}

export interface DnatPlan {
  readonly nat: NatChange;
  /** `ip route replace` (added before the NAT, so the first translated packet has its path). */
  readonly routes: readonly Route[];
  /** `ip route del` (after the NAT is gone). */
  readonly delRoutes: readonly string[];
}

const dnatKey = (d: Pick<Dnat, 'eip' | 'protocol' | 'port'>): string => `${d.eip} ${d.protocol} ${d.port}`;
const sameTarget = (a: Dnat, b: Dnat): boolean => a.internalIp === b.internalIp && a.internalPort === b.internalPort;
const sameDnat = (a: Dnat, b: Dnat): boolean => dnatKey(a) === dnatKey(b) && sameTarget(a, b);

export const emptyChange = (c: NatChange): boolean => c.delDnat.length + c.addDnat.length + c.delMasq.length + c.addMasq.length === 0;

export function planDnatAdd(nat: NatView, routes: RouteView, rules: readonly DnatAdd[]): DnatPlan {
  // The last rule for an identity wins, as a later command would.
  const wanted = new Map<string, DnatAdd>();
  for (const r of rules) wanted.set(dnatKey(r), r);
  const delDnat: Dnat[] = [];
  const addDnat: Dnat[] = [];
  const kept: Dnat[] = [];
  const seen = new Set<string>();
  for (const d of nat.dnats) {
    const w = wanted.get(dnatKey(d));
    if (w === undefined) kept.push(d);
    // One copy of the wanted DNAT stays; other copies and other targets go.
    else if (sameTarget(d, w) && !seen.has(dnatKey(d))) {
      seen.add(dnatKey(d));
      kept.push(d);
    } else delDnat.push(d);
  }
  for (const [key, w] of wanted) {
    if (seen.has(key)) continue;
    const d = toDnat(w);
    addDnat.push(d);
    kept.push(d);
  }
  const wantedIps = new Set([...wanted.values()].map((w) => w.internalIp));
  // One route per internal address: the last rule naming it says which gateway.
  const via = new Map<string, string>();
  for (const w of wanted.values()) via.set(w.internalIp, w.defaultGateway);
  const routeList: Route[] = [...via].filter(([dest, gw]) => routes.get(dest) !== gw).map(([dest, gw]) => ({ dest, via: gw }));
  const addMasq = [...wantedIps].filter((ip) => !nat.masquerades.includes(ip));
  // Targets replaced here may have lost their last DNAT.
  const released = new Set(delDnat.map((d) => d.internalIp).filter((ip) => !wantedIps.has(ip)));
  const gc = collect(nat, routes, kept, released);
  return { nat: { delDnat, addDnat, delMasq: [...gc.delMasq, ...extraMasq(nat, wantedIps)], addMasq }, routes: routeList, delRoutes: gc.delRoutes };
}

export function planDnatDel(nat: NatView, routes: RouteView, rules: readonly DnatDel[]): DnatPlan {
  const gone = rules.map(toDnat);
  const delDnat = nat.dnats.filter((d) => gone.some((g) => sameDnat(d, g)));
  const kept = nat.dnats.filter((d) => !delDnat.includes(d));
  // Every internal address the rules name, deleted now or by an earlier try of this command.
  const gc = collect(nat, routes, kept, new Set(gone.map((g) => g.internalIp)));
  return { nat: { delDnat, addDnat: [], delMasq: gc.delMasq, addMasq: [] }, routes: [], delRoutes: gc.delRoutes };
}

/** The MASQUERADEs and routes of `candidates` that no DNAT in `kept` still needs. */
function collect(nat: NatView, routes: RouteView, kept: readonly Dnat[], candidates: ReadonlySet<string>): { delMasq: string[]; delRoutes: string[] } {
  const needed = new Set(kept.map((d) => d.internalIp));
  const free = [...candidates].filter((ip) => !needed.has(ip));
  return { delMasq: nat.masquerades.filter((ip) => free.includes(ip)), delRoutes: free.filter((ip) => routes.has(ip)) };
}

/** Second and later copies of a wanted MASQUERADE. */
function extraMasq(nat: NatView, ips: ReadonlySet<string>): string[] {
  return nat.masquerades.filter((ip, i) => ips.has(ip) && nat.masquerades.indexOf(ip) !== i);
}

function toDnat(r: DnatDel): Dnat {
  return { eip: r.eip, port: r.port, protocol: r.protocol, internalIp: r.internalIp, internalPort: r.internalPort };
}

/** `ip -batch` lines of eip-add: the address, its network and the default route in table 100, ARP on. */
export function eipAddBatch(ext: string, rules: readonly EipAdd[]): string[] {
  const lines: string[] = [];
  for (const r of rules) {
    lines.push(
      `address replace ${r.eip.address}/${r.eip.prefix} dev ${ext}`,
      `route replace ${r.eip.network}/${r.eip.prefix} dev ${ext} table ${ROUTE_TABLE}`,
      `route replace default via ${r.gateway} dev ${ext} table ${ROUTE_TABLE}`,
    );
  }
  if (rules.length > 0) lines.push(`link set dev ${ext} arp on`);
  return lines;
}

export interface LinkView {
  readonly up: boolean;
  readonly arp: boolean;
  readonly hasIpv4: boolean;
}

/**
 * `ip -batch` lines of init: EXT up; ARP off until an EIP is there (an init re-sent after
 * eip-add leaves the EIP answering); an `ip rule` from EXT and from VPC to table 100 once each.
 */
export function initBatch(ext: string, vpc: string, link: LinkView, rulesFrom: ReadonlySet<string>): string[] {
  const lines: string[] = [];
  if (!link.up) lines.push(`link set dev ${ext} up`);
  if (link.arp && !link.hasIpv4) lines.push(`link set dev ${ext} arp off`);
  for (const dev of [ext, vpc]) if (!rulesFrom.has(dev)) lines.push(`rule add iif ${dev} table ${ROUTE_TABLE}`);
  return lines;
}

export const routeBatch = (routes: readonly Route[]): string[] => routes.map((r) => `route replace ${r.dest}/32 via ${r.via} table ${ROUTE_TABLE}`);
export const delRouteBatch = (dests: readonly string[]): string[] => dests.map((d) => `route del ${d}/32 table ${ROUTE_TABLE}`);

/** `ip -batch` lines that put table 100's routes for `planned` back as `before` had them (a refused NAT transaction). */
export function undoRouteBatch(before: RouteView, planned: readonly Route[]): string[] {
  return planned.map((r) => {
    const via = before.get(r.dest);
    return via === undefined ? `route del ${r.dest}/32 table ${ROUTE_TABLE}` : `route replace ${r.dest}/32 via ${via} table ${ROUTE_TABLE}`;
  });
}
