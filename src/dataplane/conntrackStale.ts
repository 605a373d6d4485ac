import ipaddr from 'ipaddr.js';
import type { ConntrackEntry } from '../model/conntrackLine.js';
import { familyOf, parseCidr } from '../model/net.js';
import type { DesiredState } from '../state/state.js';

/**
 * Restart hygiene (Kube-OVN #4193), the pure half: which tracked connections the kernel
 * committed while natgw's rules were absent. NAT decides only on a connection's first packet,
 * so such an entry keeps its packets untranslated until it times out, however long natgw has
 * been back. Untranslated means the reply tuple is the original one reversed.
 */

/** PURE: whether NAT rewrote the connection (its reply tuple is not the original reversed). */
export function isTranslated(e: ConntrackEntry): boolean {
  const { original: o, reply: r } = e;
  return r.src !== o.dst || r.dst !== o.src || r.sport !== o.dport || r.dport !== o.sport;
}

/** What natgw translates: destinations (EIPs) and sources (SNAT CIDRs, FIP internal addresses). */
export interface HygieneTargets {
  readonly dsts: ReadonlySet<string>;
  readonly srcCidrs: readonly string[];
  readonly srcs: ReadonlySet<string>;
}

export function targetsOf(s: DesiredState): HygieneTargets {
  const dsts = new Set<string>([
    ...s.eips.map((e) => e.address),
    ...s.dnats.map((d) => d.eip),
    ...s.fips.map((f) => f.eip),
    ...s.snats.map((x) => x.eip),
    ...s.shareDnats.map((d) => d.eip),
  ]);
  return { dsts, srcCidrs: s.snats.map((x) => x.cidr), srcs: new Set(s.fips.map((f) => f.internalIp)) };
}

export function inCidr(ip: string, cidr: string): boolean {
  const c = parseCidr(cidr);
  if (!c || familyOf(ip) !== familyOf(c.address)) return false;
  return ipaddr.parse(ip).match(ipaddr.parse(c.address), c.prefix);
}

/**
 * PURE: the untranslated entries whose original tuple touches what natgw translates: sent to
 * one of its EIPs, or from a SNAT CIDR (to outside that CIDR) or a FIP's internal address.
 */
export function staleEntries(entries: readonly ConntrackEntry[], t: HygieneTargets): ConntrackEntry[] {
  return entries.filter((e) => {
    if (isTranslated(e)) return false;
    const { src, dst } = e.original;
    if (t.dsts.has(dst) || t.srcs.has(src)) return true;
    return t.srcCidrs.some((c) => inCidr(src, c) && !inCidr(dst, c));
  });
}

/** PURE: `conntrack -D` arguments that delete exactly this entry (both tuples given). */
export function deleteEntryArgs(e: ConntrackEntry): string[] {
  const { original: o, reply: r } = e;
  const args = [
    '-D',
    '-f',
    e.family === 4 ? 'ipv4' : 'ipv6',
    '-p',
    e.protocol,
    '--orig-src',
    o.src,
    '--orig-dst',
    o.dst,
    '--reply-src',
    r.src,
    '--reply-dst',
    r.dst,
  ];
  if (o.sport !== undefined && o.dport !== undefined) args.push('--orig-port-src', String(o.sport), '--orig-port-dst', String(o.dport));
  const icmp = e.protocol === 'icmp' ? 'icmp' : e.protocol === 'icmpv6' ? 'icmpv6' : undefined;
  if (icmp && e.icmp) args.push(`--${icmp}-type`, String(e.icmp.type), `--${icmp}-code`, String(e.icmp.code), `--${icmp}-id`, String(e.icmp.id));
  return args;
}
