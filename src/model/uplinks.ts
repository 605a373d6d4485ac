import ipaddr from 'ipaddr.js';
import { ValidationError } from './errors.js';
import { familyOf, parseCidr } from './net.js';

/**
 * Several external interfaces (uplinks, Kube-OVN #7134 / PR #7238). The first external
 * interface is the primary: its default route stays the main one and every EIP without an
 * interface of its own lives there, exactly as with a single external interface. The others
 * are secondary uplinks, each with an optional gateway of its own for policy routing.
 */
interface SecondaryUplink {
  readonly name: string;
  readonly gateway?: string | undefined;
}

export interface Interfaces {
  readonly vpc: string;
  readonly ext: string;
  readonly secondary?: readonly SecondaryUplink[] | undefined;
}

/** The most external interfaces a gateway takes (the connection mark keeps one byte per uplink). */
export const MAX_UPLINKS = 16;

/** Each uplink's IPv4 next hop where known: the primary's is GATEWAY_V4. */
export function uplinkGateways(ifs: Interfaces, primaryGateway: string | undefined): { dev: string; gateway?: string | undefined }[] {
  return [{ dev: ifs.ext, gateway: primaryGateway }, ...(ifs.secondary ?? []).map((u) => ({ dev: u.name, gateway: u.gateway }))];
}

/** Every external interface, the primary first. */
export function uplinkNames(ifs: Interfaces): string[] {
  return [ifs.ext, ...(ifs.secondary ?? []).map((u) => u.name)];
}

export const hasSecondaryUplinks = (ifs: Interfaces | undefined): boolean => (ifs?.secondary?.length ?? 0) > 0;

/**
 * The interface an EIP lives on: its own where it names one of the uplinks, else the primary
 * (an interface no longer among the uplinks after a re-init falls back to the primary).
 */
export function eipInterface(ifs: Interfaces, eip: { readonly interface?: string | undefined } | undefined): string {
  const own = eip?.interface;
  return own !== undefined && (own === ifs.ext || (ifs.secondary ?? []).some((u) => u.name === own)) ? own : ifs.ext;
}

/**
 * The uplink of each EIP address of a state, as a lookup (an address that is no EIP: the
 * primary). With one external interface, always the primary, without building anything.
 */
export function eipUplinkOf(s: {
  readonly interfaces: Interfaces;
  readonly eips: readonly { readonly address: string; readonly interface?: string | undefined }[];
}): (ip: string) => string {
  const ifs = s.interfaces;
  if (!hasSecondaryUplinks(ifs)) return () => ifs.ext;
  const on = new Map(s.eips.map((e) => [e.address, eipInterface(ifs, e)]));
  return (ip) => on.get(ip) ?? ifs.ext;
}

/** One network an uplink is connected to (its addresses' networks, what `ip route get` consults). */
export interface UplinkNetwork {
  readonly dev: string;
  readonly cidr: string;
}

/**
 * PURE: the uplink whose connected network holds `address`, as `ip route get <eip>` would
 * answer among the uplinks (PR #7238's rule): the longest matching prefix, the earlier uplink
 * on a tie. Undefined when none holds it.
 */
export function uplinkFor(address: string, uplinks: readonly string[], networks: readonly UplinkNetwork[]): string | undefined {
  let best: { dev: string; prefix: number; rank: number } | undefined;
  for (const n of networks) {
    const rank = uplinks.indexOf(n.dev);
    if (rank < 0) continue;
    const c = parseCidr(n.cidr);
    if (!c || familyOf(c.address) !== familyOf(address) || !ipaddr.parse(address).match(ipaddr.parse(c.address), c.prefix)) continue;
    if (!best || c.prefix > best.prefix || (c.prefix === best.prefix && rank < best.rank)) best = { dev: n.dev, prefix: c.prefix, rank };
  }
  return best?.dev;
}

/**
 * PURE: the EIP with its interface decided, for a gateway with several uplinks (with one, the
 * EIP is returned as given: it lives on the only external interface). An interface given
 * explicitly must be an uplink; else the one the EIP already lives on (a re-add keeps it); else
 * the uplink whose connected network holds it (an EIP already there counts: its network is
 * connected); else the uplink whose gateway lies in the EIP's own network (GATEWAY_V4 for the
 * primary, NATGW_UPLINK_GATEWAYS for the others), for uplinks without an address of their own.
 */
export function resolveEipInterface<E extends { readonly address: string; readonly prefixLength: number; readonly interface?: string | undefined }>(
  ifs: Interfaces,
  eip: E,
  held: { readonly interface?: string | undefined } | undefined,
  networks: readonly UplinkNetwork[],
  gateways: readonly { readonly dev: string; readonly gateway?: string | undefined }[] = [],
): E {
  if (!hasSecondaryUplinks(ifs)) return eip;
  const names = uplinkNames(ifs);
  if (eip.interface !== undefined) {
    if (!names.includes(eip.interface)) {
      throw new ValidationError(`Error: interface '${eip.interface}' of EIP ${eip.address} is not an external interface (${names.join(', ')})`, 'interface');
    }
    return eip;
  }
  if (held?.interface !== undefined && names.includes(held.interface)) return { ...eip, interface: held.interface };
  const own = `${eip.address}/${eip.prefixLength}`;
  const dev =
    uplinkFor(eip.address, names, networks) ??
    gateways.find((g) => g.gateway !== undefined && names.includes(g.dev) && uplinkFor(g.gateway, [g.dev], [{ dev: g.dev, cidr: own }]) !== undefined)?.dev;
  if (dev === undefined) {
    throw new ValidationError(
      `Error: EIP ${own} is in no network of the external interfaces (${names.join(', ')}) and holds none of their gateways; ` +
        'give the external interface an address or a gateway (NATGW_UPLINK_GATEWAYS) in its subnet, or name it in the EIP (API field "interface")',
      'interface',
    );
  }
  return { ...eip, interface: dev };
}
