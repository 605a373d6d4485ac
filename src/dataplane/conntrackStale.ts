import ipaddr from 'ipaddr.js';
import { canonicalIp, familyOf, isIp, parseCidr } from '../model/net.js';
import type { DesiredState } from '../state/state.js';

/**
 * Restart hygiene (Kube-OVN #4193), the pure half: which tracked connections the kernel
 * committed while natgw's rules were absent. NAT decides only on a connection's first packet,
 * so such an entry keeps its packets untranslated until it times out, however long natgw has
 * been back. Untranslated means the reply tuple is the original one reversed.
 */
interface Tuple {
  readonly src: string;
  readonly dst: string;
  readonly sport?: number;
  readonly dport?: number;
  readonly type?: number;
  readonly code?: number;
  readonly id?: number;
}

export interface TrackedEntry {
  readonly family: 4 | 6;
  readonly protocol: string;
  readonly orig: Tuple;
  readonly reply: Tuple;
}

const FIELDS = new Set(['src', 'dst', 'sport', 'dport', 'type', 'code', 'id']);

/** PURE: `conntrack -L -o extended` (or plain `-L`) lines → entries with both tuples. */
export function parseConntrackExtended(text: string): TrackedEntry[] {
  const out: TrackedEntry[] = [];
  for (const line of text.split('\n')) {
    const words = line.trim().split(/\s+/);
    let i = words[0] === 'ipv4' || words[0] === 'ipv6' ? 2 : 0;
    const protocol = words[i];
    if (!protocol || !/^[a-z][a-z0-9-]*$/.test(protocol)) continue;
    i++;
    const tuples: Record<string, string>[] = [];
    for (; i < words.length; i++) {
      const w = words[i] ?? '';
      const eq = w.indexOf('=');
      if (eq < 0) continue;
      const k = w.slice(0, eq);
      if (!FIELDS.has(k)) continue;
      // Each tuple starts with src=; the third src= would be a master tuple (helpers): not needed.
      if (k === 'src') tuples.push({});
      const t = tuples[tuples.length - 1];
      if (t && tuples.length <= 2) t[k] = w.slice(eq + 1);
    }
    const [o, r] = tuples;
    if (!o || !r || !isIp(o.src ?? '') || !isIp(o.dst ?? '') || !isIp(r.src ?? '') || !isIp(r.dst ?? '')) continue;
    const tuple = (t: Record<string, string>): Tuple => ({
      src: canonicalIp(t.src ?? ''),
      dst: canonicalIp(t.dst ?? ''),
      ...(t.sport !== undefined ? { sport: Number(t.sport) } : {}),
      ...(t.dport !== undefined ? { dport: Number(t.dport) } : {}),
      ...(t.type !== undefined ? { type: Number(t.type) } : {}),
      ...(t.code !== undefined ? { code: Number(t.code) } : {}),
      ...(t.id !== undefined ? { id: Number(t.id) } : {}),
    });
    const orig = tuple(o);
    out.push({ family: familyOf(orig.src), protocol, orig, reply: tuple(r) });
  }
  return out;
}

/** PURE: whether NAT rewrote the connection (its reply tuple is not the original reversed). */
export function isTranslated(e: TrackedEntry): boolean {
  const { orig: o, reply: r } = e;
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
export function staleEntries(entries: readonly TrackedEntry[], t: HygieneTargets): TrackedEntry[] {
  return entries.filter((e) => {
    if (isTranslated(e)) return false;
    const { src, dst } = e.orig;
    if (t.dsts.has(dst) || t.srcs.has(src)) return true;
    return t.srcCidrs.some((c) => inCidr(src, c) && !inCidr(dst, c));
  });
}

/** PURE: `conntrack -D` arguments that delete exactly this entry (both tuples given). */
export function deleteEntryArgs(e: TrackedEntry): string[] {
  const { orig: o, reply: r } = e;
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
  if (icmp && o.type !== undefined && o.code !== undefined && o.id !== undefined) {
    args.push(`--${icmp}-type`, String(o.type), `--${icmp}-code`, String(o.code), `--${icmp}-id`, String(o.id));
  }
  return args;
}
