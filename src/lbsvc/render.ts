import type { Dnat, NatChange } from './plan.js';

/**
 * The NAT change as one transaction per backend: pure text from validated values.
 *
 * iptables: the script's layout in the nat table's own chains (`iptables-save` reads as the
 * script's), one `iptables-restore --noflush` script, so the change applies whole or not at all.
 *
 * nftables: natgw's own table, kube-proxy style: one DNAT rule dispatching through a map keyed
 * by (eip, protocol, port) and one MASQUERADE rule matching a set of internal addresses; a
 * command changes elements only. Every transaction (re)declares the skeleton (`add` is a no-op
 * for what exists; the chains are flushed and refilled in the same transaction, so no packet
 * sees them empty): any command repairs a damaged table.
 */

export const NFT_TABLE = 'natgw_lbsvc';
export const NFT_DNAT_MAP = 'lb_dnat';
export const NFT_MASQ_SET = 'lb_masq';

/** A DNAT rule exactly as `iptables-save` prints the script's `iptables -t nat -A PREROUTING -p P -d EIP --dport N -j DNAT --to-destination IP:PORT`. */
const iptablesDnatSpec = (d: Dnat): string =>
  `PREROUTING -d ${d.eip}/32 -p ${d.protocol} -m ${d.protocol} --dport ${d.port} -j DNAT --to-destination ${d.internalIp}:${d.internalPort}`;

const iptablesMasqSpec = (ip: string): string => `POSTROUTING -d ${ip}/32 -j MASQUERADE`;

/** Adds after removals, so a replaced DNAT's identity never holds two rules; MASQUERADE first in POSTROUTING, as the script's `-I`. */
export function renderIptables(c: NatChange): string {
  const lines = [
    '*nat',
    ...c.delDnat.map((d) => `-D ${iptablesDnatSpec(d)}`),
    ...c.delMasq.map((ip) => `-D ${iptablesMasqSpec(ip)}`),
    ...c.addMasq.map((ip) => `-I ${iptablesMasqSpec(ip)}`),
    ...c.addDnat.map((d) => `-A ${iptablesDnatSpec(d)}`),
    'COMMIT',
  ];
  return `${lines.join('\n')}\n`;
}

const T = `ip ${NFT_TABLE}`;

function renderNftSkeleton(): string[] {
  return [
    `add table ${T}`,
    `add map ${T} ${NFT_DNAT_MAP} { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service ; }`,
    `add set ${T} ${NFT_MASQ_SET} { type ipv4_addr ; }`,
    `add chain ${T} prerouting { type nat hook prerouting priority dstnat ; policy accept ; }`,
    `add chain ${T} postrouting { type nat hook postrouting priority srcnat ; policy accept ; }`,
    `flush chain ${T} prerouting`,
    `flush chain ${T} postrouting`,
    `add rule ${T} prerouting meta l4proto { tcp, udp, sctp } dnat ip addr . port to ip daddr . meta l4proto . th dport map @${NFT_DNAT_MAP}`,
    `add rule ${T} postrouting ip daddr @${NFT_MASQ_SET} masquerade`,
  ];
}

const dnatKeyElem = (d: Dnat): string => `${d.eip} . ${d.protocol} . ${d.port}`;

export function renderNft(c: NatChange): string {
  const lines = renderNftSkeleton();
  // A map holds one element per key: deletes first, so a replaced target is re-added in the same transaction.
  if (c.delDnat.length > 0) lines.push(`delete element ${T} ${NFT_DNAT_MAP} { ${unique(c.delDnat.map(dnatKeyElem)).join(', ')} }`);
  if (c.delMasq.length > 0) lines.push(`delete element ${T} ${NFT_MASQ_SET} { ${unique(c.delMasq).join(', ')} }`);
  if (c.addMasq.length > 0) lines.push(`add element ${T} ${NFT_MASQ_SET} { ${unique(c.addMasq).join(', ')} }`);
  if (c.addDnat.length > 0) {
    lines.push(`add element ${T} ${NFT_DNAT_MAP} { ${c.addDnat.map((d) => `${dnatKeyElem(d)} : ${d.internalIp} . ${d.internalPort}`).join(', ')} }`);
  }
  return `${lines.join('\n')}\n`;
}

const unique = (xs: readonly string[]): string[] => [...new Set(xs)];
