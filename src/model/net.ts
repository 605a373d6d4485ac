import ipaddr from 'ipaddr.js';

/** Address helpers over ipaddr.js. Everything natgw stores is in canonical text form. */

export type Family = 4 | 6;

const IPV4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;

/** Strict dotted IPv4: four decimal octets 0-255 without leading zeros (no octal, hex or short forms that ipaddr.js would also accept). */
export function isIpv4(s: string): boolean {
  return IPV4.test(s);
}

export function isIpv6(s: string): boolean {
  return !s.includes('%') && ipaddr.IPv6.isValid(s);
}

export function isIp(s: string): boolean {
  return isIpv4(s) || isIpv6(s);
}

export function familyOf(ip: string): Family {
  return isIpv4(ip) ? 4 : 6;
}

/**
 * The family of an address (or CIDR) already validated — the stored state, the rules rendered
 * from it: IPv6 is the one with a colon. No pattern, for the paths that see every object.
 */
export const familyOfValid = (addr: string): Family => (addr.includes(':') ? 6 : 4);

/** Canonical text of an address (IPv6 compressed, lower case). */
export function canonicalIp(s: string): string {
  return isIpv4(s) ? s : ipaddr.IPv6.parse(s).toString();
}

export interface Cidr {
  readonly address: string;
  readonly prefix: number;
}

/**
 * Parse `a.b.c.d/n` or a bare address (meaning a host route). Returns null if malformed.
 * With `clearHostBits` the address becomes the network address (SNAT canonicalisation).
 */
export function parseCidr(s: string, opts: { clearHostBits?: boolean; family?: Family } = {}): Cidr | null {
  const slash = s.indexOf('/');
  const addr = slash === -1 ? s : s.slice(0, slash);
  const lenText = slash === -1 ? undefined : s.slice(slash + 1);
  const fam: Family | undefined = isIpv4(addr) ? 4 : isIpv6(addr) ? 6 : undefined;
  if (fam === undefined || (opts.family !== undefined && fam !== opts.family)) return null;
  const max = fam === 4 ? 32 : 128;
  let prefix = max;
  if (lenText !== undefined) {
    if (!/^\d{1,3}$/.test(lenText)) return null;
    prefix = Number(lenText);
    if (prefix > max) return null;
  }
  let address = fam === 4 ? addr : canonicalIp(addr);
  if (opts.clearHostBits) address = (fam === 4 ? ipaddr.IPv4 : ipaddr.IPv6).networkAddressFromCIDR(`${address}/${prefix}`).toString();
  return { address, prefix };
}

export function formatCidr(c: Cidr): string {
  return `${c.address}/${c.prefix}`;
}

/** A decimal port 1..65535 with no sign, space or leading junk; null otherwise. */
export function parsePort(s: string): number | null {
  if (!/^\d{1,5}$/.test(s)) return null;
  const n = Number(s);
  return n >= 1 && n <= 65535 ? n : null;
}

/** Linux interface names: 1..15 bytes, no '/', ':', whitespace; not '.' or '..'. */
export function isInterfaceName(s: string): boolean {
  return /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$/.test(s);
}
