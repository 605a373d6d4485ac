import { memoText } from './memo.js';
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
});
export type Eip = z.infer<typeof eipSchema>;

export const snatSchema = z.object({
  eip: ipSchema,
  cidr: networkCidrSchema,
  randomFully: z.boolean().default(false),
});
export type Snat = z.infer<typeof snatSchema>;

export const dnatSchema = z.object({
  eip: ipSchema,
  port: portSchema,
  protocol: protocolSchema,
  internalIp: ipSchema,
  internalPort: portSchema,
});
export type Dnat = z.infer<typeof dnatSchema>;

export const fipSchema = z.object({
  eip: ipSchema,
  internalIp: ipSchema,
});
export type Fip = z.infer<typeof fipSchema>;

export const backendSchema = z.object({ ip: ipv4Schema, port: portSchema });
export type ShareBackend = z.infer<typeof backendSchema>;

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
const snatKeys = new WeakMap<Pick<Snat, 'eip' | 'cidr'>, string>();
const dnatKeys = new WeakMap<Pick<Dnat, 'eip' | 'port' | 'protocol'>, string>();
export const snatKey = (s: Pick<Snat, 'eip' | 'cidr'>): string => memoText(snatKeys, s, (x) => `${x.eip}|${x.cidr}`);
export const dnatKey = (d: Pick<Dnat, 'eip' | 'port' | 'protocol'>): string => memoText(dnatKeys, d, (x) => `${x.eip}|${x.port}|${x.protocol}`);
export const fipKey = (f: Pick<Fip, 'eip'>): string => f.eip;
export const shareDnatKey = dnatKey;
export const routeKey = (r: Pick<Route, 'cidr'>): string => r.cidr;
export const eipKey = (e: Pick<Eip, 'address'>): string => e.address;

/** An allocation-free identity test, for scans that need no key index. */
export const sameDnat = (a: Pick<Dnat, 'eip' | 'port' | 'protocol'>, b: Pick<Dnat, 'eip' | 'port' | 'protocol'>): boolean =>
  a.eip === b.eip && a.port === b.port && a.protocol === b.protocol;

export function prefixOf(cidr: string): number {
  return Number(cidr.slice(cidr.indexOf('/') + 1));
}
