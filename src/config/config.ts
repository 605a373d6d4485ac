import { z } from 'zod';
import { readEnvFile } from './envFile.js';
import { DEFAULT_ENV_FILE, DEFAULT_SOCKET } from './socketPath.js';
import { canonicalIp, isInterfaceName, isIpv4, isIpv6 } from '../model/net.js';
import { printable } from '../model/printable.js';
import { parsePortSlice, type PortSlice } from './portSlice.js';

export { DEFAULT_ENV_FILE };

/** Units of a measure and their factors, largest first; the first that divides a bound names it in messages. */
type Units = Readonly<Record<string, number>>;
/** Durations, in milliseconds. `m` is read but never shown: bounds read as `600s`, not `10m`. */
const TIME: Units = { h: 3_600_000, m: 60_000, s: 1000, ms: 1 };
/** Sizes, in bytes; their units are read in any case. */
const BYTES: Units = { gb: 1024 ** 3, mb: 1024 ** 2, kb: 1024, b: 1 };

/** `<number>[unit]` → the number in the smallest unit (a bare number is in `bare`); null if malformed. */
function parseMeasure(s: string, units: Units, bare: string): number | null {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$/.exec(s);
  const unit = m?.[2] || bare;
  return m && Object.hasOwn(units, unit) ? Math.round(Number(m[1]) * (units[unit] as number)) : null;
}

/** `500ms`, `30s`, `2m`, `1h`, or a bare number of seconds → milliseconds; null if malformed. */
export const parseDuration = (s: string): number | null => parseMeasure(s, TIME, 's');

function formatMeasure(n: number, units: Units): string {
  const shown = Object.entries(units).filter(([unit]) => unit !== 'm');
  const [unit, f] = shown.find(([, f]) => n > 0 && n % f === 0) ?? (shown.at(-1) as [string, number]);
  return `${n / f}${unit}`;
}

/**
 * A duration or a size within bounds, in milliseconds or bytes. Durations are bounded because 0
 * would spin a timer and Node clamps anything above 2^31 ms to 1 ms; sizes because a limit of a
 * byte, or none, is no limit anyone means.
 */
const measure = (what: 'duration' | 'size', min: number, max: number) => {
  const units = what === 'duration' ? TIME : BYTES;
  const [lo, hi] = [formatMeasure(min, units), formatMeasure(max, units)];
  return z
    .string()
    .transform((s, ctx) => {
      const n = what === 'duration' ? parseDuration(s) : parseMeasure(s.toLowerCase(), BYTES, 'b');
      const example = what === 'duration' ? 'a duration such as 500ms, 30s or 2m' : 'a size such as 512kb or 64mb';
      if (n === null) ctx.addIssue({ code: 'custom', message: `must be ${example}, got ${s.trim() || 'nothing'}` });
      else if (n < min || n > max) ctx.addIssue({ code: 'custom', message: `must be between ${lo} and ${hi}, got ${s.trim()}` });
      else return n;
      return z.NEVER;
    })
    .meta({ values: `a ${what}, ${lo} to ${hi}` });
};
const duration = (minMs: number, maxMs: number) => measure('duration', minMs, maxMs);
const size = (min: number, max: number) => measure('size', min, max);

const optionalText = z
  .string()
  .optional()
  .transform((s) => (s === undefined || s.trim() === '' ? undefined : s.trim()));

/**
 * A connection timeout: whole seconds, 1s to 30 days (the kernel keeps seconds); empty or
 * unset keeps the kernel's own.
 */
const ctTimeout = optionalText
  .transform((s, ctx): number | undefined => {
    if (s === undefined) return undefined;
    const ms = parseDuration(s);
    if (ms === null || ms % 1000 !== 0) {
      ctx.addIssue({ code: 'custom', message: `must be whole seconds such as 30s, 20m or 1h, got ${s}` });
      return z.NEVER;
    }
    if (ms < 1000 || ms > 2_592_000_000) {
      ctx.addIssue({ code: 'custom', message: `must be between 1s and 720h (30 days), got ${s}` });
      return z.NEVER;
    }
    return ms / 1000;
  })
  .meta({ values: 'whole seconds, 1s to 720h; unset: the kernel default' });

/** A whole number within bounds, written in decimal. */
const count = (min: number, max: number) =>
  z
    .string()
    .transform((s, ctx) => {
      const t = s.trim();
      const n = /^\d{1,10}$/.test(t) ? Number(t) : Number.NaN;
      if (!(n >= min && n <= max)) {
        ctx.addIssue({ code: 'custom', message: `must be a whole number from ${min} to ${max}, got ${t || 'nothing'}` });
        return z.NEVER;
      }
      return n;
    })
    .meta({ values: `a whole number, ${min} to ${max}` });

/** The address as the kernel prints it, so a configured gateway compares equal to a read-back route. */
const gateway = (check: (s: string) => boolean, what: string) =>
  optionalText
    .refine((s) => s === undefined || check(s), `must be an ${what} address`)
    .transform((s) => (s === undefined ? s : canonicalIp(s)))
    .meta({ values: `an ${what} address` });

const bool = z
  .string()
  .transform((s) => s.trim().toLowerCase())
  .pipe(z.enum(['true', 'false', '1', '0', 'yes', 'no', 'on', 'off']))
  .transform((s) => ['true', '1', 'yes', 'on'].includes(s))
  .meta({ values: 'true or false (also 1/0, yes/no, on/off)' });

/** A program natgw runs: a name looked up in PATH, or a path. */
const program = (name: string) => z.string().trim().min(1).default(name).meta({ values: 'a command or path' });

/** An AS number (BGP), 1 to 4294967295. */
const asn = optionalText
  .refine((s) => s === undefined || (/^\d{1,10}$/.test(s) && Number(s) >= 1 && Number(s) <= 4_294_967_295), 'must be an AS number from 1 to 4294967295')
  .meta({ values: 'an AS number' });

/**
 * Every key natgw reads, with its default (SPEC §4.3). Each key's `describe()` text and its
 * values' `meta({ values })` are the README's configuration table (scripts/config-table.ts;
 * a test fails when the two disagree), so a key is documented where it is defined.
 */
export const configSchema = z.object({
  VPC_INTERFACE: z
    .string()
    .default('eth0')
    .refine(isInterfaceName, 'must be an interface name')
    .meta({ values: 'an interface name' })
    .describe('Interface facing the VPC (`init` writes the names it used back into the env file).'),
  EXTERNAL_INTERFACE: z
    .string()
    .default('net1')
    .refine((s) => s.split(',').every((n) => isInterfaceName(n.trim())), 'must be an interface name, or several separated by commas')
    .meta({ values: 'an interface name, or a comma-separated list' })
    .describe(
      'Interface facing the external network, attached late by Multus; natgw waits for it. Several (`net1,net2`): the first is the primary (its default route stays the main one), the others are secondary uplinks whose EIPs leave by their own interface.',
    ),
  NATGW_UPLINK_GATEWAYS: optionalText
    .refine((s) => s === undefined || uplinkGatewayList(s) !== undefined, 'must be a comma-separated list of <interface>=<IPv4 gateway>')
    .meta({ values: 'a comma-separated list of <interface>=<IPv4 address>' })
    .describe(
      "Each secondary uplink's next hop (`net2=10.0.2.1`): its EIPs' traffic leaves by its own route table with this default route. Without one, only destinations on its own network are reached through it.",
    ),
  GATEWAY_V4: gateway(isIpv4, 'IPv4').describe('Upstream IPv4 gateway: `eip-add` installs `default via <gw> dev <EXT> onlink`.'),
  GATEWAY_V6: gateway(isIpv6, 'IPv6').describe("Upstream IPv6 gateway, as GATEWAY_V4 (any spelling; compared in the kernel's form)."),
  QOS_DEBUG: optionalText.meta({ values: 'true or false' }).describe('Verbose QoS logging, as in the script.'),
  GATEWAY_NETFILTER_MODE: z
    .enum(['auto', 'nftables', 'iptables'])
    .default('auto')
    .describe("Netfilter backend. `auto`: a recorded choice, then the rules natgw already owns here, else iptables (the script's layout)."),
  NATGW_IPTABLES_VARIANT: z
    .enum(['auto', 'legacy', 'nft'])
    .default('auto')
    .describe("iptables variant; `auto` uses the script's probe (`iptables-legacy -t nat -S INPUT 1` answers: legacy)."),
  NATGW_LIBNFTABLES: z
    .enum(['auto', 'off'])
    .default('auto')
    .describe(
      "How the daemon runs nftables changes: `auto` through a long-lived helper on libnftables (nft's own library, through Debian's python3-nftables) where it starts, else the `nft` tool; `off` always the `nft` tool.",
    ),
  NATGW_INTERFACE_WAIT_TIMEOUT: duration(0, 3_600_000).prefault('30s').describe('How long `init` and the daemon at start wait for both interfaces.'),
  NATGW_STATE_DIR: z
    .string()
    .min(1)
    .default('/var/lib/natgw')
    .meta({ values: 'a directory' })
    .describe('Desired state (snapshot and journal), backend record, lock and command log.'),
  NATGW_SOCKET: z
    .string()
    .min(1)
    .default(DEFAULT_SOCKET)
    .refine((s) => Buffer.byteLength(s) <= 107, "must be at most 107 bytes (the kernel's limit on a Unix socket path)")
    .meta({ values: 'a path of at most 107 bytes' })
    .describe("The daemon's Unix socket (mode 0600); the shim and the CLI talk to it."),
  NATGW_LISTEN: optionalText
    .meta({ values: 'host:port, or a port' })
    .describe(
      "Optional TCP listener for the API; needs NATGW_TOKEN_FILE or TLS with client verification. A port alone (`8443`, `:8443`) binds to the VPC interface's address, not net1's.",
    ),
  NATGW_TOKEN_FILE: optionalText
    .meta({ values: 'a path' })
    .describe("Bearer token for the TCP API: at least 32 bytes, not the examples' placeholder (refused at start)."),
  NATGW_TLS_CERT: optionalText.meta({ values: 'a path' }).describe('Server certificate (PEM) for the TCP API.'),
  NATGW_TLS_KEY: optionalText.meta({ values: 'a path' }).describe('Server key (PEM) for the TCP API.'),
  NATGW_TLS_CLIENT_CA: optionalText.meta({ values: 'a path' }).describe('CA (PEM) that client certificates must chain to.'),
  NATGW_RESYNC_PERIOD: duration(100, 86_400_000).prefault('30s').describe('Period of the full sync: read back everything natgw owns and repair drift.'),
  NATGW_LOG_LEVEL: z
    .enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'])
    .default('info')
    .describe("Log level of the daemon's JSON log on stdout."),
  NATGW_AUTOSTART: bool.prefault('true').describe('Whether the shim starts the daemon when none answers.'),
  NATGW_NETWORK_STATUS_FILE: z
    .string()
    .default('/etc/podinfo/network-status')
    .meta({ values: 'a path' })
    .describe("Downward-API file with the pod's Multus network-status annotation (optional)."),
  // The default admits the GET /v1/state document of the largest benchmarked gateway (20,000
  // objects of each kind: about 6 MiB with its last-applied copy) with room to spare.
  NATGW_BODY_LIMIT: size(16 * 1024, 1024 ** 3)
    .prefault('64mb')
    .describe('Largest HTTP request body; the default admits the state document of a 20,000-object gateway.'),
  NATGW_CONNTRACK_CLEANUP: bool
    .prefault('true')
    .describe(
      "After the first full apply, delete conntrack entries committed untranslated while natgw's rules were absent (Kube-OVN #4193), before reporting ready.",
    ),
  NATGW_FLOW_LOG: z
    .enum(['off', 'file', 'stdout'])
    .default('off')
    .describe('Flow logs: one JSON line (`"type":"flow"`) per translated connection at its start and end, from conntrack events.'),
  NATGW_FLOW_LOG_FILE: z.string().min(1).default('/var/log/natgw/flows.log').meta({ values: 'a path' }).describe('The flow-log file (`NATGW_FLOW_LOG=file`).'),
  NATGW_FLOW_LOG_MAX_SIZE: size(64 * 1024, 1024 ** 3)
    .prefault('64mb')
    .describe('Size at which the flow-log file is rotated to `<file>.1`.'),
  NATGW_FLOW_LOG_RATE: count(1, 1_000_000)
    .prefault('1000')
    .describe('Flow-log lines per second (token-bucket refill); lines above it are dropped and counted.'),
  NATGW_FLOW_LOG_BURST: count(1, 1_000_000).prefault('2000').describe('Flow-log lines allowed at once before the rate applies (token-bucket size).'),
  NATGW_FLOW_LOG_SCHEMA: z
    .enum(['natgw', 'kube-ovn'])
    .default('natgw')
    .describe(
      "Flow-line fields: natgw's own, or `kube-ovn`, those of Kube-OVN's VPC egress gateway observer (schemaVersion v1; identity from `NATGW_GATEWAY_NAME`, `POD_NAMESPACE`, `POD_NAME`, `NODE_NAME`).",
    ),
  NATGW_GATEWAY_NAME: optionalText.meta({ values: 'a name' }).describe("The gateway's name, written as `name` in flow lines of the `kube-ovn` schema."),
  NATGW_SNAT_PORT_RANGE: z
    .string()
    .transform((s, ctx) => {
      const m = /^\s*(\d{1,5})\s*-\s*(\d{1,5})\s*$/.exec(s);
      const min = Number(m?.[1]);
      const max = Number(m?.[2]);
      if (!m || min < 1 || max > 65535 || min > max) {
        ctx.addIssue({ code: 'custom', message: `must be two ports min-max, 1 to 65535, got ${s.trim() || 'nothing'}` });
        return z.NEVER;
      }
      return { min, max };
    })
    .prefault('1024-65535')
    .meta({ values: 'min-max, ports 1 to 65535' })
    .describe(
      "The source ports SNAT translates into, the denominator of natgw_snat_port_usage_ratio. Without NATGW_SNAT_PORT_SLICE natgw's SNAT rules name no range, so the kernel's 1024-65535 applies; set it only where the SNAT is narrowed elsewhere. With a slice, the slice is the range (this key is ignored).",
    ),
  NATGW_CONNTRACK_METRICS: bool.prefault('true').describe('Follow conntrack events for the per-EIP connection metrics, even without flow logs.'),
  NATGW_CONNTRACK_SYSCTLS: bool
    .prefault('false')
    .describe("Set `nf_conntrack_acct=1` and `nf_conntrack_timestamp=1` in the pod's network namespace at start (bytes and durations in flow logs)."),
  // One address: conntrackd's FTFW over UDP unicast pairs two replicas. More: a multicast
  // channel over the sync interface carries every replica's flows to all the others.
  NATGW_HA_PEERS: optionalText
    .refine(
      (s) => s === undefined || (s.split(',').length <= 16 && s.split(',').every((p) => isIpv4(p.trim()) || isIpv6(p.trim()))),
      'must be the IP addresses of the other replicas on the sync network, separated by commas (one for a pair, up to 16)',
    )
    .meta({ values: 'IP addresses, comma-separated' })
    .describe(
      "Replica sync: the other replicas' addresses on the sync network; unset turns conntrackd off. One address: a pair over UDP unicast. Several (NATGW_HA_MODE=active-active only): multicast to NATGW_HA_SYNC_GROUP over NATGW_HA_SYNC_INTERFACE.",
    ),
  NATGW_HA_SYNC_GROUP: optionalText
    .refine((s) => s === undefined || isMulticast(s), 'must be a multicast address (IPv4 224.0.0.0/4 or IPv6 ff00::/8)')
    .meta({ values: 'a multicast address' })
    .describe(
      'With several NATGW_HA_PEERS: the multicast group conntrackd syncs to, the same on every replica (default 225.0.0.50 for IPv4 peers; IPv6 peers need one set).',
    ),
  NATGW_HA_INITIAL_ROLE: z
    .enum(['standby', 'active'])
    .default('standby')
    .describe(
      'With NATGW_HA_PEERS set, the role a replica starts in: a standby sends no gratuitous ARP until a takeover (POST /v1/ha/takeover, SIGUSR2), so a restarted replica never pulls the EIPs from the active one.',
    ),
  NATGW_HA_MODE: z
    .enum(['takeover', 'active-active'])
    .default('takeover')
    .describe(
      "With NATGW_HA_PEERS set: `takeover` (one active replica, keepalived calls POST /v1/ha/takeover) or `active-active` (every replica forwards behind ECMP; conntrackd writes the peer's flows straight into the kernel; no gratuitous ARP, the EIPs are routed).",
    ),
  NATGW_HA_HAND_OFF: z
    .enum(['on', 'off'])
    .default('on')
    .describe(
      "With NATGW_HA_MODE=active-active: `on` copies a packet this replica finds invalid (a flow whose state it does not hold yet, as when ECMP sends a connection's reply here before conntrackd brought the state), or a new UDP packet to it that no local socket takes (an early UDP reply), to every peer over the sync network, and the replica that holds the state carries it; `off` only drops it (the sender retransmits, 1-3 s for a new connection whose handshake crosses replicas).",
    ),
  NATGW_HA_HAND_OFF_RATE: count(1, 10_000)
    .prefault('10000')
    .describe(
      'With NATGW_HA_HAND_OFF=on: the most packets per second a replica copies to each peer (bursts of as many), so that a flood of stray packets toward the EIPs cannot crowd conntrackd off the sync network; beyond it they are only dropped. On iptables the bound holds per arriving interface.',
    ),
  NATGW_SNAT_PORT_SLICE: optionalText
    .transform((s, ctx) => {
      if (s === undefined) return undefined;
      const r = parsePortSlice(s);
      if (typeof r === 'string') {
        ctx.addIssue({ code: 'custom', message: r });
        return z.NEVER;
      }
      return r;
    })
    .meta({ values: '`<index>/<count>` or `<lo>-<hi>`' })
    .describe(
      "This replica's SNAT source ports for TCP and UDP, on every EIP: `<index>/<count>` (index from 0; 1024-65535 cut into count slices) or an explicit range. Give each replica its own, so synchronised flows never collide.",
    ),
  NATGW_HA_SYNC_INTERFACE: optionalText
    .refine((s) => s === undefined || isInterfaceName(s), 'must be an interface name')
    .meta({ values: 'an interface name' })
    .describe('The interface conntrackd syncs over (its first address is the local end unless NATGW_HA_SYNC_ADDRESS is set).'),
  NATGW_HA_SYNC_ADDRESS: optionalText
    .refine((s) => s === undefined || isIpv4(s) || isIpv6(s), 'must be an IP address')
    .meta({ values: 'an IP address' })
    .describe("This replica's address on the sync network (default: the sync interface's first address of the peer's family)."),
  NATGW_HA_SYNC_PORT: count(1, 65535).prefault('3780').describe("UDP port of conntrackd's sync channel, the same on both replicas."),
  NATGW_HA_SYNC_TIMEOUT: duration(1000, 600_000).prefault('10s').describe('Sync is reported unhealthy when nothing arrived from the peer for this long.'),
  NATGW_CONNTRACKD: program('conntrackd').describe('The conntrackd binary natgw runs and supervises.'),
  NATGW_HA_PEER_API: optionalText
    .refine(
      (s) => s === undefined || s.split(',').every((a) => /^https?:\/\/[^\s/]+\/?$/.test(a.trim())),
      'must be http://host:port or https://host:port, one per peer replica, separated by commas',
    )
    .meta({ values: 'http(s)://host:port, comma-separated' })
    .describe(
      "The peers' natgw TCP APIs: an active-active replica that (re)joins asks each to resend its flows; each one's state digest is compared every resync period (a metric and a log line, never a change).",
    ),
  NATGW_HA_PEER_TOKEN_FILE: optionalText
    .meta({ values: 'a path' })
    .describe("Bearer token for the peer's API (default: NATGW_TOKEN_FILE, the same secret on both replicas)."),
  NATGW_CT_TIMEOUT_TCP_ESTABLISHED: ctTimeout.describe(
    "Idle timeout of an established TCP connection natgw translates (Cloud NAT's default: 1200s); unset keeps the kernel's (5 days). Other flows keep the kernel's.",
  ),
  NATGW_CT_TIMEOUT_TCP_TRANSITORY: ctTimeout.describe(
    "Timeout of a translated TCP connection opening or closing (SYN_SENT, SYN_RECV, FIN_WAIT, CLOSE_WAIT, LAST_ACK, CLOSE; Cloud NAT's default: 30s); unset keeps the kernel's.",
  ),
  NATGW_CT_TIMEOUT_TCP_TIME_WAIT: ctTimeout.describe("TIME_WAIT timeout of a translated TCP connection (Cloud NAT's default: 120s); unset keeps the kernel's."),
  NATGW_CT_TIMEOUT_UDP: ctTimeout.describe(
    "Idle timeout of a translated UDP flow, answered or not (Cloud NAT's default: 30s); unset keeps the kernel's (30s, 120s once a stream).",
  ),
  NATGW_TOOL_TIMEOUT: duration(1000, 600_000)
    .prefault('30s')
    .describe('The deadline of every tool run (nft, iptables-restore, ip, tc, conntrack): a hung tool is killed and the change fails.'),
  NATGW_MAX_CONNECTIONS: count(1, 10_000).prefault('64').describe('Connections the TCP listener holds at once; more are refused.'),
  NATGW_HEADERS_TIMEOUT: duration(1000, 600_000).prefault('10s').describe('How long a TCP client may take to send its request headers.'),
  NATGW_REQUEST_TIMEOUT: duration(1000, 3_600_000).prefault('2m').describe('How long a TCP client may take to send its whole request (headers and body).'),
  NATGW_BGP_PEERS: optionalText
    .refine(
      (s) => s === undefined || (s.split(',').length <= 8 && s.split(',').every((p) => isIpv4(p.trim()) || isIpv6(p.trim()))),
      'must be one to eight IP addresses of upstream routers on the external network, separated by commas (e.g. 172.20.0.1,172.20.0.2)',
    )
    .meta({ values: 'IP addresses, comma-separated' })
    .describe(
      'EIPs announced by BGP: the upstream routers this replica peers with (BIRD, supervised by natgw). Each router carries the EIPs of its family (/32, /128), next hop this replica, while its data plane is ready; the EIPs then get no gratuitous ARP. Unset: off.',
    ),
  NATGW_BGP_ASN: asn.describe("This replica's AS number (needed with NATGW_BGP_PEERS; the same on every replica)."),
  NATGW_BGP_PEER_ASN: asn.describe("The upstream routers' AS number (needed with NATGW_BGP_PEERS)."),
  NATGW_BGP_ROUTER_ID: optionalText
    .refine((s) => s === undefined || isIpv4(s), 'must be an IPv4 address (BGP router IDs are written as one)')
    .meta({ values: 'an IPv4 address' })
    .describe("BGP router ID (default: this replica's own IPv4 address on the external interface, never an EIP, which every replica holds)."),
  NATGW_BFD: bool.prefault('true').describe('BFD with each BGP peer: a replica whose BFD stops is withdrawn within NATGW_BFD_INTERVAL × NATGW_BFD_MULTIPLIER.'),
  NATGW_BFD_INTERVAL: duration(10, 10_000).prefault('300ms').describe('BFD transmit and receive interval.'),
  NATGW_BFD_MULTIPLIER: count(1, 255).prefault('3').describe('BFD packets missed before the session (and its routes) is declared down.'),
  NATGW_BIRD: program('bird').describe('The BIRD 2 daemon natgw runs and supervises for BGP.'),
  NATGW_BIRDC: program('birdc').describe("BIRD's control client (reconfiguration, session status)."),
});

/** The keys above: what an env file or the environment may set (NATGW_ENV_FILE, read from the environment only, is not one). */
export const CONFIG_KEYS: readonly string[] = Object.keys(configSchema.shape);

/**
 * The validated configuration. Each key is declared once, in configSchema; loadConfig names
 * its field, and this type is what loadConfig builds.
 */
export type Config = Awaited<ReturnType<typeof loadConfig>>;

/** Replica sync with conntrackd (src/ha); no peers means off. */
export interface HaConfig {
  /** Every other replica on the sync network. */
  readonly peers: readonly string[];
  /** The multicast group with more than one peer (NATGW_HA_SYNC_GROUP). */
  readonly syncGroup?: string;
  readonly syncInterface?: string;
  readonly syncAddress?: string;
  readonly port: number;
  readonly syncTimeoutMs: number;
  readonly conntrackd: string;
  /** Every peer's API: each one's digest is compared, and a joining active-active replica asks each to resend. */
  readonly peerApis: readonly string[];
  readonly peerTokenFile?: string;
  /** The role at start with a peer (src/ha/role.ts); without a peer the gateway is always active. */
  readonly initialRole: 'standby' | 'active';
  /** How replicas share the traffic (NATGW_HA_MODE; absent: takeover); only with a peer. */
  readonly mode?: 'takeover' | 'active-active';
  /** This replica's SNAT source ports (NATGW_SNAT_PORT_SLICE); all ports when absent. */
  readonly snatPortSlice?: PortSlice;
  /** Active-active: copy what this replica holds no state of (invalid packets, early UDP replies) to the peers (NATGW_HA_HAND_OFF; absent: on). */
  readonly handOff?: boolean;
  /** Packets per second copied to each peer at most (NATGW_HA_HAND_OFF_RATE; absent: 10,000). */
  readonly handOffRate?: number;
}

/** EIPs announced by BGP (src/routing); absent means off. */
export interface BgpConfig {
  /** Canonical addresses, in the order given. */
  readonly peers: readonly string[];
  readonly asn: number;
  readonly peerAsn: number;
  readonly routerId?: string;
  /** Null: no BFD. */
  readonly bfd: { readonly intervalMs: number; readonly multiplier: number } | null;
  readonly bird: string;
  readonly birdc: string;
}

export class ConfigError extends Error {
  override readonly name = 'ConfigError';
}

/** Defaults, then the environment, then the env file (its values win, as when the script sourced it). */
export async function loadConfig(env: NodeJS.ProcessEnv = process.env) {
  const envFile = env.NATGW_ENV_FILE?.trim() || DEFAULT_ENV_FILE;
  const fromFile = await readEnvFile(envFile);
  const merged: Record<string, string> = {};
  for (const key of CONFIG_KEYS) {
    const v = fromFile[key] ?? env[key];
    if (v !== undefined) merged[key] = v;
  }
  const parsed = configSchema.safeParse(merged);
  if (!parsed.success) {
    // Messages quote the value given; a control character in it must not break the one-line error.
    const msg = printable(parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; '));
    throw new ConfigError(`invalid configuration (${envFile} or environment): ${msg}`);
  }
  const c = parsed.data;
  const ha: HaConfig = {
    ...haPeersOf(c, envFile),
    syncInterface: c.NATGW_HA_SYNC_INTERFACE,
    syncAddress: c.NATGW_HA_SYNC_ADDRESS === undefined ? undefined : canonicalIp(c.NATGW_HA_SYNC_ADDRESS),
    port: c.NATGW_HA_SYNC_PORT,
    syncTimeoutMs: c.NATGW_HA_SYNC_TIMEOUT,
    conntrackd: c.NATGW_CONNTRACKD,
    peerTokenFile: c.NATGW_HA_PEER_TOKEN_FILE ?? c.NATGW_TOKEN_FILE,
    initialRole: c.NATGW_HA_INITIAL_ROLE,
    mode: c.NATGW_HA_MODE,
    handOff: c.NATGW_HA_HAND_OFF === 'on',
    handOffRate: c.NATGW_HA_HAND_OFF_RATE,
    ...(c.NATGW_SNAT_PORT_SLICE ? { snatPortSlice: c.NATGW_SNAT_PORT_SLICE } : {}),
  };
  return {
    envFile,
    vpcInterface: c.VPC_INTERFACE,
    ...externalInterfaces(c.EXTERNAL_INTERFACE),
    ...(c.NATGW_UPLINK_GATEWAYS ? { uplinkGateways: uplinkGatewayList(c.NATGW_UPLINK_GATEWAYS) } : {}),
    gatewayV4: c.GATEWAY_V4,
    gatewayV6: c.GATEWAY_V6,
    qosDebug: c.QOS_DEBUG === 'true' || c.QOS_DEBUG === '1',
    mode: c.GATEWAY_NETFILTER_MODE,
    iptablesVariant: c.NATGW_IPTABLES_VARIANT,
    libnftables: c.NATGW_LIBNFTABLES,
    interfaceWaitMs: c.NATGW_INTERFACE_WAIT_TIMEOUT,
    stateDir: c.NATGW_STATE_DIR,
    socket: c.NATGW_SOCKET,
    listen: c.NATGW_LISTEN,
    tokenFile: c.NATGW_TOKEN_FILE,
    tlsCert: c.NATGW_TLS_CERT,
    tlsKey: c.NATGW_TLS_KEY,
    tlsClientCa: c.NATGW_TLS_CLIENT_CA,
    resyncMs: c.NATGW_RESYNC_PERIOD,
    logLevel: c.NATGW_LOG_LEVEL,
    autostart: c.NATGW_AUTOSTART,
    networkStatusFile: c.NATGW_NETWORK_STATUS_FILE,
    bodyLimit: c.NATGW_BODY_LIMIT,
    conntrackCleanup: c.NATGW_CONNTRACK_CLEANUP,
    flowLog: c.NATGW_FLOW_LOG,
    flowLogFile: c.NATGW_FLOW_LOG_FILE,
    flowLogMaxSize: c.NATGW_FLOW_LOG_MAX_SIZE,
    flowLogRate: c.NATGW_FLOW_LOG_RATE,
    flowLogBurst: c.NATGW_FLOW_LOG_BURST,
    conntrackMetrics: c.NATGW_CONNTRACK_METRICS,
    conntrackSysctls: c.NATGW_CONNTRACK_SYSCTLS,
    flowLogSchema: c.NATGW_FLOW_LOG_SCHEMA,
    // The Kubernetes downward API's usual names (Kube-OVN's observer reads POD_NAME and NODE_NAME).
    flowLogIdentity: { namespace: env.POD_NAMESPACE ?? '', name: c.NATGW_GATEWAY_NAME ?? '', pod: env.POD_NAME ?? '', node: env.NODE_NAME ?? '' },
    // natgw's own slice, where it translates into one, is the range its ports come from.
    snatPortRange: c.NATGW_SNAT_PORT_SLICE ? { min: c.NATGW_SNAT_PORT_SLICE.lo, max: c.NATGW_SNAT_PORT_SLICE.hi } : c.NATGW_SNAT_PORT_RANGE,
    toolTimeoutMs: c.NATGW_TOOL_TIMEOUT,
    maxConnections: c.NATGW_MAX_CONNECTIONS,
    headersTimeoutMs: c.NATGW_HEADERS_TIMEOUT,
    requestTimeoutMs: c.NATGW_REQUEST_TIMEOUT,
    ctTimeouts: {
      ...(c.NATGW_CT_TIMEOUT_TCP_ESTABLISHED !== undefined ? { tcpEstablished: c.NATGW_CT_TIMEOUT_TCP_ESTABLISHED } : {}),
      ...(c.NATGW_CT_TIMEOUT_TCP_TRANSITORY !== undefined ? { tcpTransitory: c.NATGW_CT_TIMEOUT_TCP_TRANSITORY } : {}),
      ...(c.NATGW_CT_TIMEOUT_TCP_TIME_WAIT !== undefined ? { tcpTimeWait: c.NATGW_CT_TIMEOUT_TCP_TIME_WAIT } : {}),
      ...(c.NATGW_CT_TIMEOUT_UDP !== undefined ? { udp: c.NATGW_CT_TIMEOUT_UDP } : {}),
    },
    ha,
    bgp: bgpOf(c, envFile),
  };
}

const isMulticast = (s: string): boolean => (isIpv4(s) && Number(s.split('.')[0]) >= 224 && Number(s.split('.')[0]) <= 239) || (isIpv6(s) && /^ff/i.test(s));

/** The peers, the multicast group with several, the peers' APIs; what several peers need is named. */
function haPeersOf(c: z.infer<typeof configSchema>, envFile: string): Pick<HaConfig, 'peers' | 'syncGroup' | 'peerApis'> {
  const fail = (msg: string): never => {
    throw new ConfigError(`invalid configuration (${envFile} or environment): ${msg}`);
  };
  const peers = c.NATGW_HA_PEERS === undefined ? [] : [...new Set(c.NATGW_HA_PEERS.split(',').map((p) => canonicalIp(p.trim())))];
  const peerApis = c.NATGW_HA_PEER_API === undefined ? [] : c.NATGW_HA_PEER_API.split(',').map((a) => a.trim().replace(/\/$/, ''));
  let syncGroup: string | undefined;
  if (peers.length > 1) {
    if (c.NATGW_HA_MODE !== 'active-active') fail('NATGW_HA_PEERS names several replicas, which only NATGW_HA_MODE=active-active runs (takeover pairs two)');
    if (new Set(peers.map((p) => isIpv6(p))).size > 1) fail('NATGW_HA_PEERS mixes IPv4 and IPv6 addresses; the sync network is of one family');
    if (c.NATGW_HA_SYNC_INTERFACE === undefined)
      fail('NATGW_HA_PEERS names several replicas, so NATGW_HA_SYNC_INTERFACE must name the interface the multicast channel uses');
    const v6 = isIpv6(peers[0] as string);
    syncGroup = c.NATGW_HA_SYNC_GROUP === undefined ? (v6 ? undefined : '225.0.0.50') : canonicalIp(c.NATGW_HA_SYNC_GROUP);
    if (syncGroup === undefined) fail('NATGW_HA_PEERS names several IPv6 replicas, so NATGW_HA_SYNC_GROUP must be set (an ff00::/8 address)');
    if (isIpv6(syncGroup as string) !== v6) fail(`NATGW_HA_SYNC_GROUP ${syncGroup} is not of the peers' family`);
  }
  return { peers, ...(syncGroup ? { syncGroup } : {}), peerApis };
}

/** The BGP settings, or undefined without peers; the keys BGP cannot run without are named. */
function bgpOf(c: z.infer<typeof configSchema>, envFile: string): BgpConfig | undefined {
  if (c.NATGW_BGP_PEERS === undefined) return undefined;
  const missing = (['NATGW_BGP_ASN', 'NATGW_BGP_PEER_ASN'] as const).filter((k) => c[k] === undefined);
  if (missing.length > 0) {
    throw new ConfigError(
      `invalid configuration (${envFile} or environment): NATGW_BGP_PEERS is set, so ${missing.join(' and ')} must be set too (AS numbers, e.g. NATGW_BGP_ASN=65001 NATGW_BGP_PEER_ASN=65000), or unset NATGW_BGP_PEERS to turn BGP off`,
    );
  }
  const peers = [...new Set(c.NATGW_BGP_PEERS.split(',').map((p) => canonicalIp(p.trim())))];
  return {
    peers,
    asn: Number(c.NATGW_BGP_ASN),
    peerAsn: Number(c.NATGW_BGP_PEER_ASN),
    routerId: c.NATGW_BGP_ROUTER_ID,
    bfd: c.NATGW_BFD ? { intervalMs: c.NATGW_BFD_INTERVAL, multiplier: c.NATGW_BFD_MULTIPLIER } : null,
    bird: c.NATGW_BIRD,
    birdc: c.NATGW_BIRDC,
  };
}

/** EXTERNAL_INTERFACE as the primary and the secondary uplinks (`net1,net2`). */
function externalInterfaces(v: string): { extInterface: string; secondaryExtInterfaces?: readonly string[] } {
  const [ext = '', ...more] = v.split(',').map((n) => n.trim());
  return more.length > 0 ? { extInterface: ext, secondaryExtInterfaces: more } : { extInterface: ext };
}

/** `net2=10.0.2.1,net3=10.0.3.1` as a record; undefined when any entry is malformed. */
function uplinkGatewayList(v: string): Record<string, string> | undefined {
  const out: Record<string, string> = {};
  for (const entry of v.split(',')) {
    const [name = '', gw = '', ...rest] = entry.split('=').map((x) => x.trim());
    if (rest.length > 0 || !isInterfaceName(name) || !isIpv4(gw)) return undefined;
    out[name] = gw;
  }
  return out;
}
