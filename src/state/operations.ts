import { ConflictError } from '../model/errors.js';
import {
  type Dnat, type Eip, type Fip, type Route, type ShareDnat, type Snat,
  dnatKey, fipKey, prefixOf, routeKey, snatKey,
} from '../model/rules.js';
import { appendLine, CHAINS, dnatSpec, fipDnatSpec } from '../model/ruleText.js';
import type { DesiredState } from './state.js';

/**
 * Pure operations over the desired state, carrying the script's semantics: strict adds by
 * identity (same target: no change; other target: conflict), lenient deletes (absent is
 * success). Side effects the kernel needs besides state (ARP, conntrack) come back as
 * effects for the engine to carry out after the apply succeeded.
 */

export type Effect =
  | { kind: 'garp'; ip: string }
  | { kind: 'conntrack-flush'; dst: string; protocol?: 'tcp' | 'udp'; port?: number };

export interface OpResult {
  readonly state: DesiredState;
  readonly effects: readonly Effect[];
}

const unchanged = (state: DesiredState): OpResult => ({ state, effects: [] });

export function addRoute(s: DesiredState, r: Route): OpResult {
  const i = s.routes.findIndex((x) => routeKey(x) === routeKey(r));
  if (i !== -1 && s.routes[i]?.nexthop === r.nexthop) return unchanged(s);
  // `ip route replace` semantics: a new nexthop replaces the old one.
  const routes = i === -1 ? [...s.routes, r] : s.routes.map((x, j) => (j === i ? r : x));
  return { state: { ...s, routes }, effects: [] };
}

export function delRoute(s: DesiredState, cidr: string): OpResult {
  return { state: { ...s, routes: s.routes.filter((x) => x.cidr !== cidr) }, effects: [] };
}

export function addEip(s: DesiredState, eip: Eip, gateways: { v4?: string; v6?: string }): OpResult {
  // `ip addr replace` semantics: a new prefix length replaces the old one, in place.
  const at = s.eips.findIndex((e) => e.address === eip.address);
  const eips = at === -1 ? [...s.eips, eip] : s.eips.map((e, j) => (j === at ? eip : e));
  const defaultRoutes = {
    ...s.defaultRoutes,
    ...(gateways.v4 ? { v4: gateways.v4 } : {}),
    ...(gateways.v6 ? { v6: gateways.v6 } : {}),
  };
  return { state: { ...s, eips, defaultRoutes }, effects: [{ kind: 'garp', ip: eip.address }] };
}

export function delEip(s: DesiredState, address: string): OpResult {
  return { state: { ...s, eips: s.eips.filter((e) => e.address !== address) }, effects: [] };
}

export function addFip(s: DesiredState, f: Fip): OpResult {
  const existing = s.fips.find((x) => fipKey(x) === fipKey(f));
  if (existing) {
    if (existing.internalIp === f.internalIp) return unchanged(s);
    throw new ConflictError(
      `eip ${f.eip} already bindTo rule: ${appendLine(CHAINS.exclusiveDnat, fipDnatSpec(existing))}, but expected internalIp ${f.internalIp}`,
    );
  }
  return { state: { ...s, fips: [...s.fips, f] }, effects: [] };
}

export function delFip(s: DesiredState, eip: string): OpResult {
  return {
    state: { ...s, fips: s.fips.filter((x) => x.eip !== eip) },
    // Flush even when natgw had no record: a stale entry from before a restart is just as stale.
    effects: [{ kind: 'conntrack-flush', dst: eip }],
  };
}

export function addDnat(s: DesiredState, d: Dnat): OpResult {
  const existing = s.dnats.find((x) => dnatKey(x) === dnatKey(d));
  if (existing) {
    if (existing.internalIp === d.internalIp && existing.internalPort === d.internalPort) return unchanged(s);
    throw new ConflictError(
      `dnat (${d.eip}, ${d.port}, ${d.protocol}) already exists: ${appendLine(CHAINS.sharedDnat, dnatSpec(existing))}, but expected ${d.internalIp}:${d.internalPort}`,
    );
  }
  return { state: { ...s, dnats: [...s.dnats, d] }, effects: [] };
}

export function delDnat(s: DesiredState, id: Pick<Dnat, 'eip' | 'port' | 'protocol'>): OpResult {
  return {
    state: { ...s, dnats: s.dnats.filter((x) => dnatKey(x) !== dnatKey(id)) },
    effects: [{ kind: 'conntrack-flush', dst: id.eip, protocol: id.protocol, port: id.port }],
  };
}

export function addSnat(s: DesiredState, n: Snat): OpResult {
  if (s.snats.some((x) => snatKey(x) === snatKey(n))) return unchanged(s);
  // Longest prefix first; a new rule goes after existing rules of equal length.
  const len = prefixOf(n.cidr);
  const at = s.snats.findIndex((x) => prefixOf(x.cidr) < len);
  const snats = at === -1 ? [...s.snats, n] : [...s.snats.slice(0, at), n, ...s.snats.slice(at)];
  return { state: { ...s, snats }, effects: [] };
}

export function delSnat(s: DesiredState, id: Pick<Snat, 'eip' | 'cidr'>): OpResult {
  return { state: { ...s, snats: s.snats.filter((x) => snatKey(x) !== snatKey(id)) }, effects: [] };
}

export function addShareDnat(s: DesiredState, d: ShareDnat): OpResult {
  const at = s.shareDnats.findIndex((x) => dnatKey(x) === dnatKey(d));
  // Re-adding replaces the backends (and the received protocol text, which names the chain).
  const shareDnats = at === -1 ? [...s.shareDnats, d] : s.shareDnats.map((x, j) => (j === at ? d : x));
  return { state: { ...s, shareDnats }, effects: [] };
}

export function delShareDnat(s: DesiredState, id: Pick<ShareDnat, 'eip' | 'port' | 'protocol'>): OpResult {
  return {
    state: { ...s, shareDnats: s.shareDnats.filter((x) => dnatKey(x) !== dnatKey(id)) },
    effects: [{ kind: 'conntrack-flush', dst: id.eip, protocol: id.protocol, port: id.port }],
  };
}
