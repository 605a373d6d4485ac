import ipaddr from 'ipaddr.js';

/** Address helpers over ipaddr.js. Everything natgw stores is in canonical text form. */

export type Family = 4 | 6;

/**
 * Strict dotted IPv4 (no octal, hex or short forms that ipaddr.js would also accept): four
 * decimal octets 0-255, no leading zero. A character scan, not a regular expression: this runs
 * on every address of a bulk document (40,000 at 10,000 DNAT + 10,000 FIP).
 */
export function isIpv4(s: string): boolean {
  const n = s.length;
  if (n < 7 || n > 15) return false;
  let octets = 0;
  let i = 0;
  for (;;) {
    const start = i;
    let v = 0;
    while (i < n) {
      const c = s.charCodeAt(i);
      if (c < 48 || c > 57) break;
      v = v * 10 + (c - 48);
      i++;
    }
    const len = i - start;
    if (len === 0 || len > 3 || v > 255 || (len > 1 && s.charCodeAt(start) === 48)) return false;
    octets++;
    if (i === n) return octets === 4;
    if (octets === 4 || s.charCodeAt(i) !== 46) return false;
    i++;
  }
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
  if (opts.clearHostBits) {
    // IPv4 by arithmetic (every SNAT CIDR of a bulk document passes here), IPv6 by ipaddr.js.
    address = fam === 4 ? v4Network(address, prefix) : ipaddr.IPv6.networkAddressFromCIDR(`${address}/${prefix}`).toString();
  }
  return { address, prefix };
}

/** The network address of a valid dotted IPv4 address under a prefix of 0-32; the address itself when no bit is cleared. */
function v4Network(address: string, prefix: number): string {
  if (prefix === 32) return address;
  const o = [0, 0, 0, 0];
  let k = 0;
  for (let i = 0; i < address.length; i++) {
    const c = address.charCodeAt(i);
    if (c === 46) k++;
    else o[k] = (o[k] as number) * 10 + c - 48;
  }
  let same = true;
  for (let i = 0; i < 4; i++) {
    const keep = Math.max(0, Math.min(8, prefix - i * 8));
    const v = (o[i] as number) & ((0xff << (8 - keep)) & 0xff);
    same &&= v === o[i];
    o[i] = v;
  }
  return same ? address : `${o[0]}.${o[1]}.${o[2]}.${o[3]}`;
}

export function formatCidr(c: Cidr): string {
  return `${c.address}/${c.prefix}`;
}

export function isPort(n: number): boolean {
  return Number.isInteger(n) && n >= 1 && n <= 65535;
}

/** A decimal port 1..65535 with no sign, space or leading junk; null otherwise. */
export function parsePort(s: string): number | null {
  if (!/^\d{1,5}$/.test(s)) return null;
  const n = Number(s);
  return isPort(n) ? n : null;
}

/** Linux interface names: 1..15 bytes, no '/', ':', whitespace; not '.' or '..'. */
export function isInterfaceName(s: string): boolean {
  return /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$/.test(s);
}
