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
  /** The sync interface (needed for IPv6 link-local addresses; binds the channel otherwise). */
  readonly syncInterface?: string;
  readonly port: number;
  readonly paths: ConntrackdPaths;
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
 * - The sync channel's own flows and loopback are ignored, or every exchange would be synced.
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
 */
export function renderConntrackdConf(s: ConntrackdSettings): string {
  const v6 = isIpv6(s.peerAddress);
  if (v6 !== isIpv6(s.localAddress)) {
    throw new HaConfigError(`sync address ${s.localAddress} and peer ${s.peerAddress} are not of one family`);
  }
  if (!Number.isInteger(s.port) || s.port < 1 || s.port > 65535) throw new HaConfigError(`sync port ${s.port} is not a port number`);
  const fam = v6 ? 'IPv6' : 'IPv4';
  const activeActive = s.mode === 'active-active';
  const lines = [
    '# Written by natgw at every start; edits are lost.',
    'Sync {',
    '\tMode FTFW {',
    `\t\tDisableExternalCache ${activeActive ? 'On' : 'Off'}`,
    // conntrackd refuses a commit timeout without an external cache (there is nothing to commit).
    ...(activeActive ? [] : ['\t\tCommitTimeout 1800']),
    '\t\tPurgeTimeout 5',
    '\t\tResendQueueSize 131072',
    '\t\tACKWindowSize 300',
    '\t}',
    '\tUDP {',
    `\t\t${fam}_address ${safe('sync address', s.localAddress)}`,
    `\t\t${fam}_Destination_Address ${safe('peer address', s.peerAddress)}`,
    `\t\tPort ${s.port}`,
    ...(s.syncInterface ? [`\t\tInterface ${safe('sync interface', s.syncInterface)}`] : []),
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
    `\t\t\t${fam}_address ${s.peerAddress}`,
    '\t\t}',
    ...(activeActive ? [] : ['\t\tState Accept {', '\t\t\tESTABLISHED CLOSED TIME_WAIT CLOSE_WAIT for TCP', '\t\t}']),
    '\t}',
    '}',
  ];
  return `${lines.join('\n')}\n`;
}
