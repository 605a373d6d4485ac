import type { Route } from './rules.js';
import type { Interfaces } from './uplinks.js';

/**
 * Who owns a family's default route. The kernel holds one per family in the main table: the
 * external default (eip-add installs it via GATEWAY_V4/GATEWAY_V6 on EXT) and a subnet route to
 * `0.0.0.0/0` or `::/0` (on VPC) replace each other. The external default owns it while it is
 * set: a subnet route to the default is then refused, and one the state already holds (added
 * before the gateway was known, or by an older natgw) is kept but not installed. Every spelling
 * of the default (`0.0.0.0/00`, `1.2.3.4/0`, `0::0/0`) reaches here as one of the two canonical
 * CIDRs below (legacy.ts cidr4, rules.ts networkCidrSchema clear the host bits).
 */

export type DefaultFamily = 'v4' | 'v6';

const DEFAULT_CIDR: Record<DefaultFamily, string> = { v4: '0.0.0.0/0', v6: '::/0' };
/** The two halves that route everything through a next hop without taking the default's place. */
const HALVES: Record<DefaultFamily, string> = { v4: '0.0.0.0/1 and 128.0.0.0/1', v6: '::/1 and 8000::/1' };
const ENV: Record<DefaultFamily, string> = { v4: 'GATEWAY_V4', v6: 'GATEWAY_V6' };

interface RoutesOfState {
  readonly routes: readonly Route[];
  readonly defaultRoutes: { readonly v4?: string | undefined; readonly v6?: string | undefined };
}

/** The external gateway that owns the default route `r` would take, if any. */
export function defaultOwnerOf(s: RoutesOfState, r: Pick<Route, 'cidr'>): { family: DefaultFamily; gateway: string } | undefined {
  const family = r.cidr === DEFAULT_CIDR.v4 ? 'v4' : r.cidr === DEFAULT_CIDR.v6 ? 'v6' : undefined;
  const gateway = family ? s.defaultRoutes[family] : undefined;
  return family && gateway ? { family, gateway } : undefined;
}

export interface HeldDefaultRoute {
  readonly route: Route;
  readonly family: DefaultFamily;
  /** The external gateway that owns the family's default. */
  readonly gateway: string;
}

/** The subnet routes of `s` to a default that the external default owns: held, never installed. */
export function heldDefaultRoutes(s: RoutesOfState): HeldDefaultRoute[] {
  if (s.defaultRoutes.v4 === undefined && s.defaultRoutes.v6 === undefined) return [];
  const held: HeldDefaultRoute[] = [];
  for (const route of s.routes) {
    const owner = defaultOwnerOf(s, route);
    if (owner) held.push({ route, ...owner });
  }
  return held;
}

/** The refusal of a subnet route to the default while the external default owns it (stdout, 409). */
export function defaultRouteConflictText(r: Route, owner: { family: DefaultFamily; gateway: string }, ifs: Interfaces): string {
  const { family, gateway } = owner;
  return (
    `subnet route ${r.cidr} via ${r.nexthop} conflicts with the default route via ${gateway} dev ${ifs.ext} that eip-add installs from ${ENV[family]}, ` +
    `which owns the default: route ${HALVES[family]} via ${r.nexthop} on ${ifs.vpc} instead, ` +
    `or remove defaultRoutes.${family} from the state (PUT /v1/state) and unset ${ENV[family]} to hand the default to ${ifs.vpc}`
  );
}

/** Why a held subnet route is not in the kernel, and what resolves it (log, status, command output). */
export function heldDefaultRouteText(h: HeldDefaultRoute, ifs: Interfaces): string {
  const { route, family, gateway } = h;
  return (
    `subnet route ${route.cidr} via ${route.nexthop} is held but not installed: the default route via ${gateway} dev ${ifs.ext} (${ENV[family]}) owns it; ` +
    `subnet-route-del ${route.cidr} drops it, or route ${HALVES[family]} via ${route.nexthop} instead`
  );
}
