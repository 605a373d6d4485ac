import { familyOf } from '../model/net.js';
import { heldDefaultRoutes } from '../model/defaultRoute.js';
import type { DesiredState } from '../state/state.js';
import { eipInterface } from '../model/uplinks.js';

/**
 * What the kernel should hold on natgw's interfaces (addresses, routes, default routes), the
 * pure half of link.ts: what `ip` lists, parsed, and the `ip -batch` lines that take it to the
 * desired state. Sync is additive for what is desired and removes only what natgw itself had
 * programmed (the previous state, the ownership record), so addresses and routes of other
 * owners are never touched.
 */
export interface LinkAddress {
  readonly address: string;
  readonly prefixLength: number;
  readonly family: 4 | 6;
  readonly scope: string;
  /** The secondary uplink it is on (model/uplinks.ts); absent: the primary external interface. */
  readonly dev?: string;
}

export interface LinkRoute {
  readonly dst: string;
  readonly gateway?: string;
  /** `ip -j route`'s protocol (absent for `boot`, what `ip route replace` makes). */
  readonly protocol?: string;
}

export interface LinkView {
  /** The primary's addresses, then each secondary uplink's (`dev` set). */
  readonly extAddresses: readonly LinkAddress[];
  /** The secondary uplinks the kernel has (read only with secondary uplinks). */
  readonly devices?: ReadonlySet<string>;
  readonly vpcRoutes: readonly LinkRoute[];
  readonly extDefaults: readonly LinkRoute[];
}

/**
 * What natgw may remove besides what the previous state lists: addresses (any prefix) on EXT
 * and route destinations on VPC that it owns by its durable record (an add that failed half-way
 * or a crash mid-apply left them) or that a delete command named (SPEC §5: a delete removes the
 * object it names whether or not the state lists it).
 */
export interface LinkOwned {
  readonly addresses: ReadonlySet<string>;
  readonly routes: ReadonlySet<string>;
}

/**
 * PURE: the `ip -batch` lines that take `have` to `want`, given what natgw programmed before
 * and owns: addresses, then routes, then default routes.
 */
export function planLink(have: LinkView, want: DesiredState, previous: DesiredState | undefined, owned?: LinkOwned): string[] {
  const { ext, vpc } = want.interfaces;
  const lines: string[] = [];
  const addrLine = (verb: 'replace' | 'del', dev: string | undefined, address: string, len: number): string =>
    // IPv6 EIPs skip DAD: IPAM allocated them, and a tentative address would drop traffic for seconds.
    `addr ${verb} ${address}/${len} dev ${dev ?? ext}${verb === 'replace' && familyOf(address) === 6 ? ' nodad' : ''}`;
  // The kernel keys an IPv4 address by address AND prefix: `addr replace` with a new prefix
  // adds a second address, so every other prefix of an EIP's address is removed explicitly.
  // With several uplinks an address is keyed by its device too (addressKey).
  const prefixes = new Map<string, { dev: string | undefined; len: number }[]>();
  for (const a of have.extAddresses) prefixes.set(a.address, [...(prefixes.get(a.address) ?? []), { dev: a.dev, len: a.prefixLength }]);
  const heldAt = (address: string) => prefixes.get(address) ?? [];
  const deletes = new Map<string, string>();
  const del = (dev: string | undefined, address: string, prefixLength: number): void => {
    deletes.set(addressKey({ dev, address, prefixLength }), addrLine('del', dev, address, prefixLength));
  };
  for (const e of want.eips) {
    const on = eipInterface(want.interfaces, e);
    const dev = on === ext ? undefined : on;
    // A secondary uplink that is gone: its EIPs wait for it (the link event's resync adds them).
    if (dev !== undefined && !have.devices?.has(dev)) continue;
    for (const x of heldAt(e.address)) if (x.dev !== dev) del(x.dev, e.address, x.len);
    const present = heldAt(e.address)
      .filter((x) => x.dev === dev)
      .map((x) => x.len);
    const stale = present.filter((len) => len !== e.prefixLength);
    if (present.includes(e.prefixLength)) {
      for (const len of stale) del(dev, e.address, len);
      continue;
    }
    // IPv6 keys an address without its prefix: a replace would keep the old prefix and the
    // delete after it would take the address, so the old prefix goes first.
    if (familyOf(e.address) === 6) for (const len of stale) lines.push(addrLine('del', dev, e.address, len));
    else for (const len of stale) del(dev, e.address, len);
    lines.push(addrLine('replace', dev, e.address, e.prefixLength));
  }
  const wantedEips = new Set(want.eips.map((e) => e.address));
  const removable = new Set([...(previous?.eips ?? []).map((e) => e.address), ...(owned?.addresses ?? [])]);
  for (const address of removable) {
    if (wantedEips.has(address)) continue;
    for (const x of heldAt(address)) del(x.dev, address, x.len);
  }
  // Deleted in the reverse of the listed order: secondaries before their primary, so that
  // without promote_secondaries removing a primary cannot take the other EIPs of its subnet.
  const position = new Map(have.extAddresses.map((a, i) => [addressKey(a), i]));
  const at = (key: string): number => position.get(key) ?? -1;
  lines.push(...[...deletes].sort(([a], [b]) => at(b) - at(a)).map(([, line]) => line));

  const routeHave = new Map(have.vpcRoutes.map((r) => [normaliseDst(r.dst, r.gateway), r.gateway]));
  // A subnet route to a default the external default owns is held, not installed: installing
  // both would have each replace the other at every sync. Nor is it deleted where the kernel
  // still has it on VPC: the external default's `replace` below takes its place without a gap.
  const held = new Set(heldDefaultRoutes(want).map((h) => h.route.cidr));
  for (const r of want.routes) {
    if (held.has(r.cidr)) continue;
    if (routeHave.get(r.cidr) !== r.nexthop) lines.push(`route replace ${r.cidr} via ${r.nexthop} dev ${vpc}`);
  }
  const wantedRoutes = new Set(want.routes.map((r) => r.cidr));
  for (const cidr of new Set([...(previous?.routes ?? []).map((r) => r.cidr), ...(owned?.routes ?? [])])) {
    if (!wantedRoutes.has(cidr) && routeHave.has(cidr)) lines.push(`route del ${cidr} dev ${vpc}`);
  }

  for (const gw of [want.defaultRoutes.v4, want.defaultRoutes.v6]) {
    if (gw === undefined) continue;
    if (!have.extDefaults.some((d) => d.gateway === gw)) lines.push(`route replace default via ${gw} dev ${ext} onlink`);
  }
  return lines;
}

/** An address's identity on natgw's uplinks: device (absent: the primary), address and prefix. */
const addressKey = (a: { readonly dev?: string | undefined; readonly address: string; readonly prefixLength: number }): string =>
  `${a.dev ?? ''}|${a.address}/${a.prefixLength}`;

/**
 * `ip -j route` prints host routes without a prefix length and a default route as `default`
 * (the gateway tells its family), while the state spells them as CIDRs.
 */
function normaliseDst(dst: string, gateway?: string): string {
  if (dst === 'default') return gateway === undefined ? dst : familyOf(gateway) === 4 ? '0.0.0.0/0' : '::/0';
  if (dst.includes('/')) return dst;
  return `${dst}/${familyOf(dst) === 4 ? 32 : 128}`;
}

export interface IpAddrJson {
  ifname?: string;
  addr_info?: { family?: string; local?: string; prefixlen?: number; scope?: string }[];
}

export function addressesOf(links: IpAddrJson[]): LinkAddress[] {
  return links.flatMap((l) =>
    (l.addr_info ?? [])
      .filter((a) => (a.family === 'inet' || a.family === 'inet6') && a.local)
      .map((a) => ({
        address: a.local ?? '',
        prefixLength: a.prefixlen ?? 32,
        family: a.family === 'inet' ? (4 as const) : (6 as const),
        scope: a.scope ?? 'global',
      })),
  );
}

/** PURE: the interface names /proc/net/dev lists (two header lines, then `name: counters…`). */
export function netDevNames(text: string): Set<string> {
  const names = new Set<string>();
  for (const line of text.split('\n').slice(2)) {
    const colon = line.indexOf(':');
    if (colon > 0) names.add(line.slice(0, colon).trim());
  }
  return names;
}
