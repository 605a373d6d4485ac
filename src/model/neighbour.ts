import { z } from 'zod';
import ipaddr from 'ipaddr.js';
import { ifnameSchema, ipSchema } from './rules.js';

/**
 * A static neighbour entry (the OVN-Kubernetes masquerade pattern): an address on a device
 * with a fixed link-layer address, held PERMANENT so the kernel never sends ARP requests or
 * neighbour solicitations for it.
 */
const macSchema = z
  .string()
  .regex(/^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$/, 'must be a MAC address such as 0a:58:0a:00:01:32')
  .transform((s) => s.toLowerCase());

export const neighbourSchema = z.object({
  address: ipSchema,
  dev: ifnameSchema,
  /** Omitted: natgw derives 0a:58 followed by the address's last four bytes (syntheticMac). */
  mac: macSchema.optional(),
});
export type Neighbour = z.infer<typeof neighbourSchema>;

/** Identity: the kernel keys a neighbour entry by device and address. */
export const neighbourKey = (n: Pick<Neighbour, 'address' | 'dev'>): string => `${n.dev}|${n.address}`;

/**
 * PURE: `0a:58` followed by the IPv4 address's four bytes (for IPv6 its last four bytes), the
 * locally administered MAC that OVN-Kubernetes and Kube-OVN derive for a pod address.
 */
export function syntheticMac(address: string): string {
  const bytes = ipaddr.parse(address).toByteArray().slice(-4);
  return ['0a', '58', ...bytes.map((b) => b.toString(16).padStart(2, '0'))].join(':');
}

/** The link-layer address natgw programs for `n`. */
export const macOf = (n: Neighbour): string => n.mac ?? syntheticMac(n.address);
