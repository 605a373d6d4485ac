import { canonicalIp, isIpv4, isIpv6 } from '../model/net.js';

/** What decides whether this replica offers its EIPs to the peers now. */
export interface GateInput {
  /** The agent's readiness (interfaces present, last sync succeeded, restart hygiene done) and its reasons. */
  readonly ready: boolean;
  readonly readyReasons: readonly string[];
  /** The external interface is up with carrier; undefined before it was first looked at. */
  readonly extUp: boolean | undefined;
  /** A full sync has succeeded since the external interface last came up (it may have lost routes and addresses going down). */
  readonly syncedSinceExtUp: boolean;
  /** In the takeover mode only the active replica attracts traffic. */
  readonly role: 'active' | 'standby';
}

type GateReason = 'not-ready' | 'external-down' | 'standby';

export interface Gate {
  readonly open: boolean;
  /** The first reason it is closed (the withdrawals metric's label). */
  readonly why?: GateReason;
  readonly reasons: readonly string[];
}

/** PURE: whether the data plane is ready to carry the EIPs' traffic, and if not, why. */
export function gateOf(i: GateInput): Gate {
  const reasons: string[] = [];
  let why: GateReason | undefined;
  if (i.extUp !== true) {
    why ??= 'external-down';
    reasons.push(i.extUp === undefined ? 'external interface not checked yet' : 'external interface down (no carrier)');
  } else if (!i.syncedSinceExtUp) {
    why ??= 'external-down';
    reasons.push('external interface came back up: waiting for a full sync to restore its addresses and routes');
  }
  if (!i.ready) {
    why ??= 'not-ready';
    reasons.push(...(i.readyReasons.length > 0 ? i.readyReasons.map((r) => `not ready: ${r}`) : ['not ready']));
  }
  if (i.role !== 'active') {
    why ??= 'standby';
    reasons.push('standby replica (takeover mode): only the active replica announces');
  }
  return { open: why === undefined, why, reasons };
}

/** PURE: the EIPs to announce: every applied EIP while the gate is open, none otherwise; sorted, canonical, once each. */
export function announceOf(gate: Gate, eips: readonly string[]): string[] {
  if (!gate.open) return [];
  const set = new Set(eips.filter((a) => isIpv4(a) || isIpv6(a)).map(canonicalIp));
  return [...set].sort();
}

/** PURE: the host prefix BIRD shows for an EIP (/32 or /128). */
export const prefixOf = (eip: string): string => `${eip}/${isIpv6(eip) ? 128 : 32}`;
