import { z } from 'zod';
import { isIp, isIpv4, isInterfaceName, parseCidr, canonicalIp, formatCidr } from './net.js';

/**
 * The domain objects natgw programs, as zod schemas: one schema serves the persisted
 * state, the HTTP API body and (through the legacy parsers) the script's rule strings.
 */

export const ipSchema = z.string().refine(isIp, 'must be an IPv4 or IPv6 address').transform(canonicalIp);
export const ipv4Schema = z.string().refine(isIpv4, 'must be a dotted IPv4 address');
export const portSchema = z.number().int().min(1).max(65535);
export const protocolSchema = z
  .string()
  .transform((s) => s.toLowerCase())
  .pipe(z.enum(['tcp', 'udp']));
export type Protocol = z.infer<typeof protocolSchema>;
export const ifnameSchema = z.string().refine(isInterfaceName, 'must be a Linux interface name (1-15 of A-Z a-z 0-9 _ . -)');

/** A CIDR canonicalised with host bits cleared; a bare address is a host prefix. */
export const networkCidrSchema = z.string().transform((s, ctx) => {
  const c = parseCidr(s, { clearHostBits: true });
  if (!c) {
    ctx.addIssue({ code: 'custom', message: 'must be a CIDR such as 10.0.1.0/24' });
    return z.NEVER;
  }
  return formatCidr(c);
});

export const eipSchema = z.object({
  address: ipSchema,
  prefixLength: z.number().int().min(0).max(128),
  /**
   * The external interface the EIP lives on, with several external interfaces (absent: the
   * first one). eip-add finds it as `ip route get` would (model/uplinks.ts); the API may name it.
   */
  interface: ifnameSchema.optional().describe('The external interface the EIP lives on (several external interfaces; default: the one whose network holds it)'),
});
export type Eip = z.infer<typeof eipSchema>;

/** The most EIPs one SNAT pool spreads over (each is one element of the rule's own map). */
const MAX_SNAT_POOL = 16;

/**
 * A rule translating between families cannot be rendered (NAT stays within one family): refused
 * with the other rules' validation, before anything reaches the kernel.
 */
function sameFamily(ctx: z.RefinementCtx, eip: string, other: string, path: string): void {
  if (eip.includes(':') !== other.includes(':')) ctx.addIssue({ code: 'custom', path: [path], message: `must be of the same IP family as eip ${eip}` });
}

export const snatSchema = z
  .object({
    /** The identity's EIP; for a pool, its first address. */
    eip: ipSchema,
    cidr: networkCidrSchema,
    randomFully: z.boolean().default(false),
    /**
     * A pool: new connections take these EIPs in turn (the first is `eip`), so a busy subnet is
     * not limited to one EIP's source ports. Absent for a single-EIP SNAT.
     */
    eips: z.array(ipSchema).min(2).max(MAX_SNAT_POOL).optional().describe('A pool of EIPs starting with eip: new connections take them in turn'),
    /**
     * EIPs of the pool being drained: they take no new connections, while the connections
     * conntrack already translated to them carry on until they end. Absent when none drains.
     */
    draining: z
      .array(ipSchema)
      .min(1)
      .max(MAX_SNAT_POOL - 1)
      .optional()
      .describe('EIPs of the pool that take no new connections; their established connections carry on until they end'),
  })
  .superRefine((s, ctx) => {
    sameFamily(ctx, s.eip, s.cidr, 'cidr');
    if (!s.eips) return;
    if (s.eips[0] !== s.eip) ctx.addIssue({ code: 'custom', path: ['eips'], message: `must start with the SNAT's eip ${s.eip}` });
    if (new Set(s.eips).size !== s.eips.length) ctx.addIssue({ code: 'custom', path: ['eips'], message: 'must not repeat an address' });
    if (s.eips.some((e) => e.includes(':') !== s.eip.includes(':'))) {
      ctx.addIssue({ code: 'custom', path: ['eips'], message: "must all be of the eip's IP family" });
    }
  })
  .superRefine((s, ctx) => {
    if (!s.draining) return;
    const pool = s.eips ?? [s.eip];
    const stray = s.draining.find((e) => !pool.includes(e));
    if (stray !== undefined) ctx.addIssue({ code: 'custom', path: ['draining'], message: `${stray} is not an EIP of this SNAT's pool (${pool.join(', ')})` });
    else if (new Set(s.draining).size !== s.draining.length) ctx.addIssue({ code: 'custom', path: ['draining'], message: 'must not repeat an address' });
    else if (pool.every((e) => s.draining?.includes(e))) {
      ctx.addIssue({
        code: 'custom',
        path: ['draining'],
        message: 'must leave at least one EIP of the pool taking new connections (delete the SNAT to stop translating)',
      });
    }
  });
export type Snat = z.infer<typeof snatSchema>;

export const dnatSchema = z
  .object({
    eip: ipSchema,
    /** The external port; for a range, its first port. */
    port: portSchema,
    /**
     * The last port of an external range `port`-`portEnd`; absent for a single port. A range
     * maps each port onto the same port of internalIp (internalPort must equal port): the
     * kernel's nftables NAT cannot shift a port range by an offset.
     */
    portEnd: portSchema.optional().describe('Last port of an external range port-portEnd, each port forwarded to the same internal port'),
    protocol: protocolSchema,
    internalIp: ipSchema,
    internalPort: portSchema,
  })
  .superRefine((d, ctx) => {
    sameFamily(ctx, d.eip, d.internalIp, 'internalIp');
    if (d.portEnd === undefined) return;
    if (d.portEnd <= d.port) ctx.addIssue({ code: 'custom', path: ['portEnd'], message: `must be above port ${d.port}` });
    if (d.internalPort !== d.port) {
      ctx.addIssue({
        code: 'custom',
        path: ['internalPort'],
        message: `must equal port ${d.port}: a port range maps onto the same internal ports (nftables NAT cannot shift a range)`,
      });
    }
  });
export type Dnat = z.infer<typeof dnatSchema>;

export const fipSchema = z
  .object({
    eip: ipSchema,
    internalIp: ipSchema,
  })
  .superRefine((f, ctx) => sameFamily(ctx, f.eip, f.internalIp, 'internalIp'));
export type Fip = z.infer<typeof fipSchema>;

const backendSchema = z.object({ ip: ipv4Schema, port: portSchema });

export const shareDnatSchema = z.object({
  eip: ipv4Schema,
  port: portSchema,
  protocol: protocolSchema,
  /** The protocol text as received: it names the chain (md5 of eip:port:protocol). */
  protocolText: z.string().regex(/^(tcp|udp|TCP|UDP)$/),
  backends: z.array(backendSchema).min(1),
});
export type ShareDnat = z.infer<typeof shareDnatSchema>;

export const routeSchema = z.object({
  cidr: networkCidrSchema,
  nexthop: ipSchema,
});
export type Route = z.infer<typeof routeSchema>;

// ---- identities: the keys under which an add is strict and a delete is lenient ----
/** A DNAT's identity: (eip, port or port range, protocol). */
export type DnatId = Pick<Dnat, 'eip' | 'port' | 'protocol'> & { readonly portEnd?: number | undefined };
/** `8080`, or `8000-8100` for a range: the port field of the legacy rule and of the API path. */
export const portText = (d: { readonly port: number; readonly portEnd?: number | undefined }): string =>
  d.portEnd === undefined ? String(d.port) : `${d.port}-${d.portEnd}`;
/** The pool of a SNAT: its EIPs in order (one for a plain SNAT). */
export const snatEips = (s: Pick<Snat, 'eip' | 'eips'>): readonly string[] => s.eips ?? [s.eip];
/**
 * The SNAT as the kernel translates new connections: its draining EIPs left out of the pool (a
 * pool of one left is a plain SNAT). Established connections keep the address conntrack gave
 * them whatever the rule says now, so a drained EIP's connections carry on.
 */
export function activeSnat(s: Snat): Snat {
  const draining = s.draining;
  if (!draining) return s;
  const active = snatEips(s).filter((e) => !draining.includes(e));
  const [first] = active;
  if (first === undefined) return s;
  return active.length > 1 ? { eip: first, cidr: s.cidr, randomFully: s.randomFully, eips: active } : { eip: first, cidr: s.cidr, randomFully: s.randomFully };
}
export const snatKey = (s: Pick<Snat, 'eip' | 'cidr'>): string => `${s.eip}|${s.cidr}`;
export const dnatKey = (d: DnatId): string => `${d.eip}|${portText(d)}|${d.protocol}`;
export const fipKey = (f: Pick<Fip, 'eip'>): string => f.eip;
export const routeKey = (r: Pick<Route, 'cidr'>): string => r.cidr;
export const eipKey = (e: Pick<Eip, 'address'>): string => e.address;

/** An allocation-free identity test, for scans that need no key index. */
export const sameDnat = (a: DnatId, b: DnatId): boolean => a.eip === b.eip && a.port === b.port && a.protocol === b.protocol && a.portEnd === b.portEnd;

export function prefixOf(cidr: string): number {
  return Number(cidr.slice(cidr.indexOf('/') + 1));
}
