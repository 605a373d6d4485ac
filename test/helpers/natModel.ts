/**
 * A model of natgw's NAT objects for randomised real-kernel runs (the soak script, the load
 * test): each client owns disjoint identities, so the operations it had acknowledged, applied
 * in its own order, predict the final state whatever the interleaving with other clients. Facts
 * are spelled as test/helpers/kernelFacts.ts reads them from the kernel.
 */
import { ADDR } from './netns.js';
import type { ApiResponse } from '../netns/daemon-util.js';

export const EIP = '172.20.0.10';

export type Kind = 'dnat' | 'fip' | 'snat' | 'route';
export interface Op {
  readonly kind: Kind;
  readonly verb: 'add' | 'replace' | 'del';
  readonly slot: number;
  readonly target: number;
  readonly legacy: boolean;
}

/** A random operation; legacy ones have no replace verb. */
export function randomOp(rnd: () => number, legacy: boolean): Op {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)]!;
  return {
    kind: pick(['dnat', 'fip', 'snat', 'route'] as const),
    verb: legacy ? pick(['add', 'add', 'del'] as const) : pick(['add', 'add', 'replace', 'del'] as const),
    slot: Math.floor(rnd() * 3),
    target: Math.floor(rnd() * 2),
    legacy,
  };
}

export const ident = {
  dnatPort: (c: number, k: number) => 10000 + c * 10 + k,
  fipEip: (c: number, k: number) => `172.21.${c}.${k + 1}`,
  snatCidr: (c: number, k: number) => `10.100.${c}.${k * 64}/26`,
  routeCidr: (c: number, k: number) => `10.200.${c * 4 + k}.0/24`,
};
export const targets = {
  ip: (t: number) => [ADDR.vpc1, ADDR.vpc2][t]!,
  port: (t: number) => [80, 8080][t]!,
  nexthop: (t: number) => [ADDR.rtr, '10.0.1.253'][t]!,
};

/** What the acknowledged operations leave behind: facts in kernelFacts' spelling. */
export class Model {
  readonly dnats = new Map<string, number>();
  readonly fips = new Map<string, number>();
  readonly snats = new Map<string, boolean>();
  readonly routes = new Map<string, number>();

  /** Apply an acknowledged operation; a refused one (conflict) changed nothing. */
  apply(c: number, op: Op): void {
    const key =
      op.kind === 'dnat'
        ? String(ident.dnatPort(c, op.slot))
        : op.kind === 'fip'
          ? ident.fipEip(c, op.slot)
          : op.kind === 'snat'
            ? ident.snatCidr(c, op.slot)
            : ident.routeCidr(c, op.slot);
    const map: Map<string, number | boolean> = op.kind === 'dnat' ? this.dnats : op.kind === 'fip' ? this.fips : op.kind === 'snat' ? this.snats : this.routes;
    if (op.verb === 'del') map.delete(key);
    else if (op.kind === 'snat') {
      if (!map.has(key) || op.verb === 'replace') map.set(key, op.target === 1);
    } else map.set(key, op.target);
  }

  conflicts(c: number, op: Op): boolean {
    if (op.verb !== 'add' || (op.kind !== 'dnat' && op.kind !== 'fip')) return false;
    const have = op.kind === 'dnat' ? this.dnats.get(String(ident.dnatPort(c, op.slot))) : this.fips.get(ident.fipEip(c, op.slot));
    return have !== undefined && have !== op.target;
  }

  facts(): string[] {
    return [
      ...[...this.dnats].map(([port, t]) => `dnat ${EIP},${port},tcp -> ${targets.ip(t)}:${targets.port(t)}`),
      ...[...this.fips].map(([eip, t]) => `fip ${eip} -> ${targets.ip(t)}`),
      ...[...this.snats].map(([cidr, rf]) => `snat ${EIP},${cidr}${rf ? ' random-fully' : ''}`),
      ...[...this.routes].map(([cidr, t]) => `route ${cidr} via ${targets.nexthop(t)}`),
    ].sort();
  }
}

/** The script's command line for a legacy operation: [command, rule]. */
export function legacyArgs(c: number, op: Op): [string, string] {
  const t = op.target;
  switch (op.kind) {
    case 'dnat': {
      const id = `${EIP},${ident.dnatPort(c, op.slot)},tcp`;
      return op.verb === 'del' ? ['dnat-del', id] : ['dnat-add', `${id},${targets.ip(t)},${targets.port(t)}`];
    }
    case 'fip':
      return op.verb === 'del' ? ['floating-ip-del', ident.fipEip(c, op.slot)] : ['floating-ip-add', `${ident.fipEip(c, op.slot)},${targets.ip(t)}`];
    case 'snat': {
      const id = `${EIP},${ident.snatCidr(c, op.slot)}`;
      return op.verb === 'del' ? ['snat-del', id] : ['snat-add', t === 1 ? `${id},--random-fully` : id];
    }
    case 'route':
      return op.verb === 'del'
        ? ['subnet-route-del', ident.routeCidr(c, op.slot)]
        : ['subnet-route-add', `${ident.routeCidr(c, op.slot)},${targets.nexthop(t)}`];
  }
}

/** The HTTP request for an operation: a REST call, or POST /v1/legacy for a legacy one. */
export function call(c: number, op: Op): { method: string; path: string; body?: unknown } {
  const t = op.target;
  if (op.legacy) {
    const rule = legacyArgs(c, op);
    return { method: 'POST', path: '/v1/legacy', body: { command: rule[0], rules: [rule[1]] } };
  }
  const q = op.verb === 'replace' ? '?replace=true' : '';
  const enc = encodeURIComponent;
  const [path, body] = (() => {
    switch (op.kind) {
      case 'dnat':
        return [`/v1/dnats/${EIP},${ident.dnatPort(c, op.slot)},tcp`, { internalIp: targets.ip(t), internalPort: targets.port(t) }];
      case 'fip':
        return [`/v1/fips/${ident.fipEip(c, op.slot)}`, { internalIp: targets.ip(t) }];
      case 'snat':
        return [`/v1/snats/${EIP},${enc(ident.snatCidr(c, op.slot))}`, { randomFully: t === 1 }];
      case 'route':
        return [`/v1/routes/${enc(ident.routeCidr(c, op.slot))}`, { nexthop: targets.nexthop(t) }];
    }
  })();
  return op.verb === 'del' ? { method: 'DELETE', path } : { method: 'PUT', path: path + q, body };
}

/** 'ok', 'conflict', or the unexpected answer. */
export function outcome(op: Op, r: ApiResponse): string {
  if (op.legacy) {
    if (r.status !== 200) return `HTTP ${r.status} ${r.text}`;
    const out = r.body as { status: number; stdout: string; stderr: string };
    if (out.status === 0 && out.stderr === '') return 'ok';
    if (out.status === 1 && out.stderr === '' && /already (exists|bindTo rule)/.test(out.stdout)) return 'conflict';
    return JSON.stringify(out);
  }
  if (r.status >= 200 && r.status < 300) return 'ok';
  if (r.status === 409) return 'conflict';
  return `HTTP ${r.status} ${r.text}`;
}
