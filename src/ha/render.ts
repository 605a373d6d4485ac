import { isIpv6 } from '../model/net.js';

/** Where conntrackd's files live: inside natgw's state directory, so two replicas in two network namespaces on one machine never share a socket or a lock. */
export interface ConntrackdPaths {
  readonly dir: string;
  readonly config: string;
  readonly socket: string;
  readonly lock: string;
  readonly pid: string;
}

export function conntrackdPaths(stateDir: string): ConntrackdPaths {
  const dir = `${stateDir.replace(/\/+$/, '')}/conntrackd`;
  return { dir, config: `${dir}/conntrackd.conf`, socket: `${dir}/conntrackd.ctl`, lock: `${dir}/conntrackd.lock`, pid: `${dir}/conntrackd.pid` };
}

export interface ConntrackdSettings {
  /** This replica's address on the sync network. */
  readonly localAddress: string;
  /** The peer replica's address on the sync network (same family). */
  readonly peerAddress: string;
  /** Every other replica, peerAddress among them; with more than one, `multicastGroup` carries the sync. */
  readonly peerAddresses?: readonly string[];
  /** The multicast group (active-active with more than two replicas; needs syncInterface). */
  readonly multicastGroup?: string;
  /** The sync interface (needed for IPv6 link-local addresses; binds the channel otherwise). */
  readonly syncInterface?: string;
  readonly port: number;
  readonly paths: ConntrackdPaths;
  /**
   * This replica's own addresses (every interface's, as at conntrackd's start): its own
   * connections (BGP, the API, a probe) are never synced. A peer's copy of one, sent back in a
   * resend, would replace the live entry.
   */
  readonly ownAddresses?: readonly string[];
  /** Default takeover. */
  readonly mode?: 'takeover' | 'active-active';
}

export class HaConfigError extends Error {
  override readonly name = 'HaConfigError';
}

/** Values go into conntrackd's own config syntax: only the shapes we validated may pass. */
const SAFE = /^[A-Za-z0-9_.:/@%+-]+$/;
function safe(what: string, v: string): string {
  if (!SAFE.test(v)) throw new HaConfigError(`${what} '${v}' cannot be written into conntrackd.conf (use letters, digits and . : / _ - only)`);
  return v;
}

/**
 * conntrackd.conf for one replica of a pair: FTFW (reliable, acknowledged) over UDP unicast.
 *
 * - The external cache stays on: the peer's flows wait in userspace until a takeover commits
 *   them (`conntrackd -c`), so a standby never holds stale NAT entries that would steer its own
 *   traffic; the commit writes the original and reply tuples, i.e. the NAT mapping with the
 *   port `--random-fully` chose, into the kernel.
 * - TCP window tracking off: a committed entry is marked liberal, so the first packets after a
 *   failover are not dropped as out of window (the windows moved on since the last update).
 * - Only TCP, UDP and ICMP flows, TCP only once established: half-open connections are not
 *   worth a failover, and their churn would crowd the channel.
 * - The sync channel's own flows, loopback and the replica's own connections are ignored: the
 *   exchanges would be synced, and a peer's copy of a connection of this replica's own, sent
 *   back in a resend, replaced the live entry (seen, with a BGP session that then carried nothing).
 * - No log file, no syslog: conntrackd runs in the foreground under natgw, which reads its
 *   console output.
 *
 * Active-active (every replica forwards behind ECMP, a flow may move at any packet) differs:
 * - The external cache is off: the peer's flows go straight into the kernel as they arrive, so
 *   a packet that ECMP moves finds its NAT mapping without a takeover.
 * - The internal cache stays on: without it conntrackd sends only on its timer (about 1 s late,
 *   against a few ms), and the resend a (re)joining peer needs comes from it.
 * - No TCP state filter: a flow synced only once established is unknown to the peer during its
 *   handshake, and a SYN-ACK that ECMP sends to the peer then finds nothing.
 * - More than two replicas: one multicast channel over the sync interface reaches them all
 *   (UDP unicast links exactly two), in NOTRACK mode.
 */
export function renderConntrackdConf(s: ConntrackdSettings): string {
  const v6 = isIpv6(s.peerAddress);
  const peers = [...new Set([s.peerAddress, ...(s.peerAddresses ?? [])])];
  for (const p of [s.localAddress, ...peers, ...(s.multicastGroup ? [s.multicastGroup] : [])]) {
    if (isIpv6(p) !== v6) throw new HaConfigError(`sync address ${s.localAddress} and ${p} are not of one family`);
  }
  if (!Number.isInteger(s.port) || s.port < 1 || s.port > 65535) throw new HaConfigError(`sync port ${s.port} is not a port number`);
  const fam = v6 ? 'IPv6' : 'IPv4';
  const activeActive = s.mode === 'active-active';
  const multicast = s.multicastGroup !== undefined;
  if (multicast && (!activeActive || !s.syncInterface)) throw new HaConfigError('a multicast sync channel needs active-active mode and a sync interface');
  const mode = multicast
    ? // FTFW tracks one sequence of messages, one sender's: with several senders on a group it
      // takes the others' messages for losses and drops them as late (tried with three
      // replicas: most new flows never got through). NOTRACK tracks none.
      ['\tMode NOTRACK {', '\t\tDisableExternalCache On', '\t\tDisableInternalCache Off', '\t\tPurgeTimeout 5', '\t}']
    : [
        '\tMode FTFW {',
        `\t\tDisableExternalCache ${activeActive ? 'On' : 'Off'}`,
        // conntrackd refuses a commit timeout without an external cache (there is nothing to commit).
        ...(activeActive ? [] : ['\t\tCommitTimeout 1800']),
        '\t\tPurgeTimeout 5',
        '\t\tResendQueueSize 131072',
        '\t\tACKWindowSize 300',
        '\t}',
      ];
  const channel = multicast
    ? [
        '\tMulticast {',
        `\t\t${fam}_address ${safe('multicast group', s.multicastGroup as string)}`,
        `\t\tGroup ${s.port}`,
        `\t\t${fam}_interface ${safe('sync address', s.localAddress)}`,
        `\t\tInterface ${safe('sync interface', s.syncInterface as string)}`,
      ]
    : [
        '\tUDP {',
        `\t\t${fam}_address ${safe('sync address', s.localAddress)}`,
        `\t\t${fam}_Destination_Address ${safe('peer address', s.peerAddress)}`,
        `\t\tPort ${s.port}`,
        ...(s.syncInterface ? [`\t\tInterface ${safe('sync interface', s.syncInterface)}`] : []),
      ];
  const lines = [
    '# Written by natgw at every start; edits are lost.',
    'Sync {',
    ...mode,
    ...channel,
    '\t\tSndSocketBuffer 1249280',
    '\t\tRcvSocketBuffer 1249280',
    '\t\tChecksum on',
    '\t}',
    '\tOptions {',
    '\t\tTCPWindowTracking Off',
    '\t\tExpectationSync Off',
    '\t}',
    '}',
    'General {',
    '\tSystemd off',
    '\tHashSize 32768',
    '\tHashLimit 262144',
    '\tLogFile off',
    '\tSyslog off',
    `\tLockFile ${safe('lock file', s.paths.lock)}`,
    '\tUNIX {',
    `\t\tPath ${safe('control socket', s.paths.socket)}`,
    '\t}',
    '\tNetlinkBufferSize 2097152',
    '\tNetlinkBufferSizeMaxGrowth 8388608',
    '\tNetlinkOverrunResync On',
    '\tNetlinkEventsReliable Off',
    '\tFilter From Kernelspace {',
    '\t\tProtocol Accept {',
    '\t\t\tTCP',
    '\t\t\tUDP',
    '\t\t\tICMP',
    '\t\t}',
    '\t\tAddress Ignore {',
    '\t\t\tIPv4_address 127.0.0.1',
    '\t\t\tIPv6_address ::1',
    `\t\t\t${fam}_address ${s.localAddress}`,
    ...peers.map((p) => `\t\t\t${fam}_address ${safe('peer address', p)}`),
    ...[...new Set(s.ownAddresses ?? [])]
      .filter((a) => a !== s.localAddress)
      .map((a) => `\t\t\t${isIpv6(a) ? 'IPv6' : 'IPv4'}_address ${safe('own address', a)}`),
    '\t\t}',
    ...(activeActive ? [] : ['\t\tState Accept {', '\t\t\tESTABLISHED CLOSED TIME_WAIT CLOSE_WAIT for TCP', '\t\t}']),
    '\t}',
    '}',
  ];
  return `${lines.join('\n')}\n`;
}
