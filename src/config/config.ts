import { z } from 'zod';
import { readEnvFile } from './envFile.js';
import { DEFAULT_ENV_FILE, DEFAULT_SOCKET } from './socketPath.js';

export { DEFAULT_ENV_FILE };
import { parseDuration } from './duration.js';
import { canonicalIp, isInterfaceName, isIpv4, isIpv6 } from '../model/net.js';


/** A duration within bounds: 0 would spin a timer, and Node clamps anything above 2^31 ms to 1 ms. */
const duration = (key: string, minMs: number, maxMs: number) =>
  z.string().transform((s, ctx) => {
    const ms = parseDuration(s);
    if (ms === null) {
      ctx.addIssue({ code: 'custom', message: `${key} must be a duration such as 500ms, 30s or 2m` });
      return z.NEVER;
    }
    if (ms < minMs || ms > maxMs) {
      ctx.addIssue({ code: 'custom', message: `${key} must be between ${formatMs(minMs)} and ${formatMs(maxMs)}, got ${s.trim()}` });
      return z.NEVER;
    }
    return ms;
  });

const formatMs = (ms: number): string => (ms % 3_600_000 === 0 && ms > 0 ? `${ms / 3_600_000}h` : ms % 1000 === 0 && ms > 0 ? `${ms / 1000}s` : `${ms}ms`);

const SIZE_UNITS: Record<string, number> = { b: 1, kb: 1024, mb: 1024 ** 2, gb: 1024 ** 3 };

/** A size such as `512kb` or `64mb` (bare numbers are bytes) within bounds, in bytes. */
const size = (key: string, min: number, max: number) =>
  z.string().transform((s, ctx) => {
    const m = /^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb)?\s*$/i.exec(s);
    const bytes = m ? Math.round(Number(m[1]) * (SIZE_UNITS[(m[2] ?? 'b').toLowerCase()] ?? 1)) : Number.NaN;
    if (!Number.isFinite(bytes)) {
      ctx.addIssue({ code: 'custom', message: `${key} must be a size such as 512kb or 64mb, got ${s.trim() || 'nothing'}` });
      return z.NEVER;
    }
    if (bytes < min || bytes > max) {
      ctx.addIssue({ code: 'custom', message: `${key} must be between ${min / 1024}kb and ${max / 1024 ** 3}gb, got ${s.trim()}` });
      return z.NEVER;
    }
    return bytes;
  });

/** The address as the kernel prints it, so a configured gateway compares equal to a read-back route. */
const gateway = (check: (s: string) => boolean, what: string) =>
  optionalText.refine((s) => s === undefined || check(s), `must be an ${what} address`).transform((s) => (s === undefined ? s : canonicalIp(s)));

const bool = z
  .string()
  .transform((s) => s.trim().toLowerCase())
  .pipe(z.enum(['true', 'false', '1', '0', 'yes', 'no', 'on', 'off']))
  .transform((s) => ['true', '1', 'yes', 'on'].includes(s));

const optionalText = z.string().optional().transform((s) => (s === undefined || s.trim() === '' ? undefined : s.trim()));

/** Every key natgw reads, with its default (SPEC §4.3). */
const rawSchema = z.object({
  VPC_INTERFACE: z.string().default('eth0').refine(isInterfaceName, 'must be an interface name'),
  EXTERNAL_INTERFACE: z.string().default('net1').refine(isInterfaceName, 'must be an interface name'),
  GATEWAY_V4: gateway(isIpv4, 'IPv4'),
  GATEWAY_V6: gateway(isIpv6, 'IPv6'),
  QOS_DEBUG: optionalText,
  GATEWAY_NETFILTER_MODE: z.enum(['auto', 'nftables', 'iptables']).default('auto'),
  NATGW_IPTABLES_VARIANT: z.enum(['auto', 'legacy', 'nft']).default('auto'),
  NATGW_INTERFACE_WAIT_TIMEOUT: duration('NATGW_INTERFACE_WAIT_TIMEOUT', 0, 3_600_000).default(30_000),
  NATGW_STATE_DIR: z.string().min(1).default('/var/lib/natgw'),
  NATGW_SOCKET: z.string().min(1).default(DEFAULT_SOCKET).refine((s) => Buffer.byteLength(s) <= 107, 'must be at most 107 bytes (the kernel\'s limit on a Unix socket path)'),
  NATGW_LISTEN: optionalText,
  NATGW_TOKEN_FILE: optionalText,
  NATGW_TLS_CERT: optionalText,
  NATGW_TLS_KEY: optionalText,
  NATGW_TLS_CLIENT_CA: optionalText,
  NATGW_RESYNC_PERIOD: duration('NATGW_RESYNC_PERIOD', 100, 86_400_000).default(30_000),
  NATGW_LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  NATGW_AUTOSTART: bool.default(true),
  NATGW_NETWORK_STATUS_FILE: z.string().default('/etc/podinfo/network-status'),
  // The default admits the GET /v1/state document of the largest benchmarked gateway (20,000
  // objects of each kind: about 6 MiB with its last-applied copy) with room to spare.
  NATGW_BODY_LIMIT: size('NATGW_BODY_LIMIT', 16 * 1024, 1024 ** 3).default(64 * 1024 ** 2),
  // The deadline of every tool run (nft, iptables-restore, ip, tc, conntrack): a hung tool is killed and the change fails.
  NATGW_TOOL_TIMEOUT: duration('NATGW_TOOL_TIMEOUT', 1000, 600_000).default(30_000),
  // Connections the TCP listener holds at once; more are refused.
  NATGW_MAX_CONNECTIONS: z.coerce.number().int().min(1).max(10_000).default(64),
  // How long a TCP client may take to send its request headers.
  NATGW_HEADERS_TIMEOUT: duration('NATGW_HEADERS_TIMEOUT', 1000, 600_000).default(10_000),
  // How long a TCP client may take to send its whole request (headers and body).
  NATGW_REQUEST_TIMEOUT: duration('NATGW_REQUEST_TIMEOUT', 1000, 3_600_000).default(120_000),
});

export interface Config {
  readonly envFile: string;
  readonly vpcInterface: string;
  readonly extInterface: string;
  readonly gatewayV4?: string;
  readonly gatewayV6?: string;
  readonly qosDebug: boolean;
  readonly mode: 'auto' | 'nftables' | 'iptables';
  readonly iptablesVariant: 'auto' | 'legacy' | 'nft';
  readonly interfaceWaitMs: number;
  readonly stateDir: string;
  readonly socket: string;
  readonly listen?: string;
  readonly tokenFile?: string;
  readonly tlsCert?: string;
  readonly tlsKey?: string;
  readonly tlsClientCa?: string;
  readonly resyncMs: number;
  readonly logLevel: string;
  readonly autostart: boolean;
  readonly networkStatusFile: string;
  /** Bytes. */
  readonly bodyLimit: number;
  readonly toolTimeoutMs: number;
  readonly maxConnections: number;
  readonly headersTimeoutMs: number;
  readonly requestTimeoutMs: number;
}

export class ConfigError extends Error {
  override readonly name = 'ConfigError';
}

/** Defaults, then the environment, then the env file (its values win, as when the script sourced it). */
export async function loadConfig(env: NodeJS.ProcessEnv = process.env): Promise<Config> {
  const envFile = env.NATGW_ENV_FILE?.trim() || DEFAULT_ENV_FILE;
  const fromFile = await readEnvFile(envFile);
  const merged: Record<string, string> = {};
  for (const key of Object.keys(rawSchema.shape)) {
    const v = fromFile[key] ?? env[key];
    if (v !== undefined) merged[key] = v;
  }
  const parsed = rawSchema.safeParse(merged);
  if (!parsed.success) {
    const msg = parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ');
    throw new ConfigError(`invalid configuration (${envFile} or environment): ${msg}`);
  }
  const c = parsed.data;
  return {
    envFile,
    vpcInterface: c.VPC_INTERFACE,
    extInterface: c.EXTERNAL_INTERFACE,
    gatewayV4: c.GATEWAY_V4,
    gatewayV6: c.GATEWAY_V6,
    qosDebug: c.QOS_DEBUG === 'true' || c.QOS_DEBUG === '1',
    mode: c.GATEWAY_NETFILTER_MODE,
    iptablesVariant: c.NATGW_IPTABLES_VARIANT,
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
    toolTimeoutMs: c.NATGW_TOOL_TIMEOUT,
    maxConnections: c.NATGW_MAX_CONNECTIONS,
    headersTimeoutMs: c.NATGW_HEADERS_TIMEOUT,
    requestTimeoutMs: c.NATGW_REQUEST_TIMEOUT,
  };
}
