/**
 * Which translation natgw's shared SNAT gives a source address, read off a table dump (the
 * fake's or a real `nft -j` listing) the way the kernel evaluates shared_snat: its rules in order;
 * a dispatch rule looks the masked source up in its map, a miss goes on to the next rule, a
 * verdict map's hit goes to that CIDR's chain (whose first matching SNAT rule decides, and whose
 * end returns past shared_snat), a data map's hit translates to the EIP it holds. A rule natgw
 * does not recognise throws: the layouts under test never hold one.
 */
import ipaddr from 'ipaddr.js';
import { canonicalIp } from '../../src/model/net.js';
import { recogniseRule } from '../../src/dataplane/netfilter/nft/readback.js';
import { snatMapName } from '../../src/dataplane/netfilter/nft/snatLayout.js';
import type { NatgwRule, NftFamily, NftTableDump } from '../../src/dataplane/netfilter/nft/types.js';

/** A SNAT translation: the EIPs (one, or a pool's in turn) and whether ports are fully random. */
export interface SnatTo {
  readonly eips: readonly string[];
  readonly randomFully: boolean;
}

const inCidr = (src: string, cidr: string): boolean => ipaddr.parse(src).match(ipaddr.parseCIDR(cidr));

function network(src: string, len: number): string {
  const a = ipaddr.parse(src);
  const net = a.kind() === 'ipv4' ? ipaddr.IPv4.networkAddressFromCIDR(`${src}/${len}`) : ipaddr.IPv6.networkAddressFromCIDR(`${src}/${len}`);
  return canonicalIp(net.toString());
}

type SnatRule = Extract<NatgwRule, { kind: 'snat' }>;
const toOf = (r: SnatRule): SnatTo => ({ eips: r.pool ?? [r.eip], randomFully: r.randomFully });

function chainRules(dump: NftTableDump, chain: string): NatgwRule[] {
  const c = dump.chains.get(chain);
  if (!c) throw new Error(`no chain ${chain}`);
  return c.rules.map((r) => {
    const rule = recogniseRule(r.expr, dump.family as NftFamily);
    if (!rule) throw new Error(`${chain}: a rule natgw does not recognise: ${JSON.stringify(r.expr)}`);
    return rule;
  });
}

/** The translation shared_snat gives `src`; undefined when none of its rules translates it. */
export function sharedSnatOf(dump: NftTableDump, src: string): SnatTo | undefined {
  for (const rule of chainRules(dump, 'shared_snat')) {
    // The flat layout of older versions: SNAT rules in shared_snat itself.
    if (rule.kind === 'snat') {
      if (inCidr(src, rule.cidr)) return toOf(rule);
      continue;
    }
    if (rule.kind !== 'snat-dispatch') throw new Error(`shared_snat: ${JSON.stringify(rule)}`);
    const key = network(src, rule.len);
    const hit = dump.sets.get(snatMapName(rule.len, rule.via))?.elements.find((e) => e.key === key);
    if (!hit) continue;
    if (rule.via !== 'chain') return { eips: [hit.value ?? ''], randomFully: rule.via === 'eip-fr' };
    const target = /^goto (\S+)$/.exec(hit.value ?? '')?.[1];
    if (target === undefined) throw new Error(`snat_len_${rule.len}: ${hit.value}`);
    for (const r of chainRules(dump, target)) if (r.kind === 'snat' && inCidr(src, r.cidr)) return toOf(r);
    return undefined;
  }
  return undefined;
}
