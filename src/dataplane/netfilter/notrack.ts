/**
 * natgw's own loopback traffic, kept out of conntrack (README "The shim's loopback connections
 * are not tracked"). Every shim call is a TCP connection from bash to the daemon's loopback
 * listener, in the gateway's namespace where natgw's NAT rules make the kernel track every
 * flow: each one would sit ~2 minutes in TIME_WAIT in the conntrack table, which then outgrows
 * the table read that lets a DNAT or floating-IP delete skip `conntrack -D` (conntrack.ts).
 *
 * The listener binds an address of 127.0.0.0/8 that only natgw uses (Linux answers on every
 * address of that block on `lo` with no configuration), and each backend carries a static rule
 * in natgw's own objects that exempts packets to or from it, in the output hook at raw
 * priority: both directions of a loopback connection are locally generated, and a packet
 * marked untracked there keeps that mark when lo hands it to prerouting. No NAT ever applies to
 * these packets. Other processes' loopback traffic is tracked as before.
 *
 * This module imports nothing: the shim listener and both backends name the same address.
 */

/** The shim listener's address ("NGW" in ASCII): natgw's alone, exempt from conntrack. */
export const SHIM_ADDRESS = '127.78.71.87';

/** The iptables raw-table chain natgw owns, jumped to from raw OUTPUT (IPv4 only). */
export const NOTRACK_CHAIN = 'NATGW_NOTRACK';

/** The chain's rules in iptables-save form: both directions of the listener's connections. */
export const NOTRACK_SPECS: readonly string[] = [`-d ${SHIM_ADDRESS}/32 -j CT --notrack`, `-s ${SHIM_ADDRESS}/32 -j CT --notrack`];

/** The nftables base chain in `table ip natgw` (filter, hook output, priority raw). */
export const NFT_NOTRACK_CHAIN = 'shim_notrack';
