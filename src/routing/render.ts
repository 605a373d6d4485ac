import type { BgpConfig } from '../config/config.js';
import { isInterfaceName, isIpv4, isIpv6 } from '../model/net.js';

/** One BGP session as BIRD runs it: the peer, and this replica's own address toward it (the next hop it announces). */
export interface Session {
  /** BIRD's protocol name: natgw_peer<n>, n the peer's place in NATGW_BGP_PEERS (stable while the list is). */
  readonly name: string;
  readonly peer: string;
  readonly local: string;
}

/** A configured peer that gets no session, and why (told in the status). */
export interface Skipped {
  readonly peer: string;
  readonly reason: string;
}

export interface BirdInput {
  readonly routerId: string;
  readonly asn: number;
  readonly peerAsn: number;
  readonly extInterface: string;
  readonly bfd: BgpConfig['bfd'];
  readonly sessions: readonly Session[];
  /** The EIPs to announce now: every applied EIP while the data plane is ready, none otherwise. */
  readonly announce: readonly string[];
}

const STATIC_V4 = 'natgw_eips4';
const STATIC_V6 = 'natgw_eips6';

/** PURE: BIRD's protocol name for the peer at `index` in NATGW_BGP_PEERS. */
const sessionName = (index: number): string => `natgw_peer${index + 1}`;

/**
 * PURE: the sessions to run. A session's source address is also the next hop the peer
 * installs, so it must be this replica's own address: never an EIP, which every replica holds
 * (an EIP as next hop would send every replica's share to whichever answers ARP for it).
 * `own` lists the external interface's addresses that are not EIPs, in the kernel's order.
 */
export function sessionsOf(peers: readonly string[], own: readonly string[]): { sessions: Session[]; skipped: Skipped[] } {
  const v4 = own.find(isIpv4);
  const v6 = own.find(isIpv6);
  const sessions: Session[] = [];
  const skipped: Skipped[] = [];
  peers.forEach((peer, i) => {
    const local = isIpv6(peer) ? v6 : v4;
    if (local === undefined)
      skipped.push({
        peer,
        reason: `no ${isIpv6(peer) ? 'IPv6' : 'IPv4'} address of this replica's own on the external interface (EIPs do not count): add one, or remove ${peer} from NATGW_BGP_PEERS`,
      });
    else sessions.push({ name: sessionName(i), peer, local });
  });
  return { sessions, skipped };
}

/** PURE: the router ID: the configured one, else this replica's own IPv4 address on the external interface. */
export function routerIdOf(configured: string | undefined, own: readonly string[]): string | undefined {
  return configured ?? own.find(isIpv4);
}

/** BIRD takes times in whole milliseconds with the unit `ms`. */
const ms = (n: number): string => `${Math.round(n)} ms`;

/**
 * PURE: bird.conf from validated, typed values (nothing user-written reaches it as text:
 * addresses are checked as addresses, the interface as an interface name, numbers as numbers).
 * BIRD learns nothing and installs nothing in this namespace (no kernel protocol, imports
 * refused): it only tells the peers which EIPs live here. Each EIP is a blackhole static route
 * inside BIRD, exported to the peers of its family with this replica as next hop.
 */
export function renderBirdConf(i: BirdInput): string {
  if (!isInterfaceName(i.extInterface)) throw new Error(`not an interface name: ${i.extInterface}`);
  if (!isIpv4(i.routerId)) throw new Error(`BGP router ID must be an IPv4 address: ${i.routerId}`);
  for (const n of [i.asn, i.peerAsn]) if (!Number.isInteger(n) || n < 1 || n > 4_294_967_295) throw new Error(`not an AS number: ${n}`);
  for (const a of [...i.announce, ...i.sessions.flatMap((s) => [s.peer, s.local])]) if (!isIpv4(a) && !isIpv6(a)) throw new Error(`not an IP address: ${a}`);
  const dev = `"${i.extInterface}"`;
  const routes = (v6: boolean) =>
    i.announce
      .filter((a) => isIpv6(a) === v6)
      .map((a) => `  route ${a}/${v6 ? 128 : 32} blackhole;\n`)
      .join('');
  const lines = [
    '# Rendered by natgw from its configuration and rewritten at every change: edits here are lost.',
    'log stderr { info, remote, warning, error, auth, fatal, bug };',
    'timeformat protocol iso long;',
    `router id ${i.routerId};`,
    '',
    'protocol device {}',
    '',
  ];
  if (i.bfd) {
    lines.push(`protocol bfd natgw_bfd {`, `  interface ${dev} { interval ${ms(i.bfd.intervalMs)}; multiplier ${i.bfd.multiplier}; };`, '}', '');
  }
  lines.push(`protocol static ${STATIC_V4} {\n  ipv4;\n${routes(false)}}`, '');
  lines.push(`protocol static ${STATIC_V6} {\n  ipv6;\n${routes(true)}}`, '');
  // No graceful restart: a peer must drop a dead replica's routes at once, not keep them stale.
  // Short connect and error waits: a replica back from a failure is announced in seconds, not minutes.
  lines.push(
    'template bgp natgw_peer {',
    `  local as ${i.asn};`,
    '  direct;',
    `  bfd ${i.bfd ? 'on' : 'off'};`,
    '  graceful restart off;',
    '  long lived graceful restart off;',
    '  connect delay time 1;',
    '  connect retry time 5;',
    '  error wait time 1, 10;',
    '}',
    '',
  );
  for (const s of i.sessions) {
    const v6 = isIpv6(s.peer);
    lines.push(
      `protocol bgp ${s.name} from natgw_peer {`,
      `  local ${s.local} as ${i.asn};`,
      `  neighbor ${s.peer} as ${i.peerAsn};`,
      `  interface ${dev};`,
      `  ${v6 ? 'ipv6' : 'ipv4'} { import none; export where proto = "${v6 ? STATIC_V6 : STATIC_V4}"; next hop self; };`,
      '}',
      '',
    );
  }
  return lines.join('\n');
}
