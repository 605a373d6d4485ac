/**
 * Real-kernel test topology for natgw: a handful of network namespaces wired like a
 * Kube-OVN VPC NAT gateway pod and its surroundings.
 *
 *   vpc1 10.0.1.6 ─┐                                  ┌─ e0 172.20.0.1/24 (upstream gw)
 *   vpc2 10.0.1.7 ─┤  vsw: br0  ── eth0 10.0.1.1  gw  net1 ── ext   172.20.0.100/24 (ext host)
 *   rtr 10.0.1.254 ┘                   (no address on net1)        fd00:20::1/64
 *    └ eth1 10.0.2.1 ── sub2 10.0.2.5
 *
 * Every process runs through `ip netns exec` with an argument array (never a shell
 * string), names are unique per topology so test files may run in parallel, and
 * cleanup is idempotent with a synchronous last-resort sweep at process exit.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { constants, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { waitFor } from './poll.js';

export type NsRole = 'gw' | 'vsw' | 'vpc1' | 'vpc2' | 'rtr' | 'sub2' | 'ext' | 'ext2';
const ROLES: readonly NsRole[] = ['gw', 'vsw', 'vpc1', 'vpc2', 'rtr', 'sub2', 'ext'];
/** With a second uplink (TopologyOptions.secondUplink): gw's net2 ⇄ ext2's e0. */
const ROLES_TWO_UPLINKS: readonly NsRole[] = [...ROLES, 'ext2'];

/** Fixed addressing of the topology (see the diagram above). */
export const ADDR = {
  gw: '10.0.1.1',
  vpc1: '10.0.1.6',
  vpc2: '10.0.1.7',
  rtr: '10.0.1.254',
  rtrSub2: '10.0.2.1',
  sub2: '10.0.2.5',
  vpcCidr: '10.0.1.0/24',
  sub2Cidr: '10.0.2.0/24',
  extCidr: '172.20.0.0/24',
  extGateway: '172.20.0.1',
  extHost: '172.20.0.100',
  extGatewayV6: 'fd00:20::1',
  extCidrV6: 'fd00:20::/64',
  /** The second uplink's network (secondUplink topologies): ext2's e0 holds its gateway and a host. */
  ext2Cidr: '172.21.0.0/24',
  ext2Gateway: '172.21.0.1',
  ext2Host: '172.21.0.100',
} as const;

/** Repository root, from this file's location (test/helpers → ../..), so a clone anywhere works. */
export const REPO_ROOT = findRepoRoot(dirname(fileURLToPath(import.meta.url)));
/** natgw is driven through the real shim, exactly as the controller runs it. */
const NATGW_SHIM = join(REPO_ROOT, 'image', 'nat-gateway.sh');

/** The nearest folder holding package.json: works from test/helpers and from the compiled dist/test/helpers. */
function findRepoRoot(from: string): string {
  for (let dir = from; ; dir = dirname(dir)) {
    if (existsSync(join(dir, 'package.json'))) return dir;
    if (dirname(dir) === dir) return resolve(from, '..', '..');
  }
}

export interface ExecOptions {
  /** Written to the process's stdin, which is then closed. */
  readonly input?: string;
  /** Added to the inherited environment. */
  readonly env?: Readonly<Record<string, string>>;
  /** Throw unless the exit code is 0 (default true). */
  readonly reject?: boolean;
  /** Kill the process (SIGKILL) after this long (default 30 s). */
  readonly timeoutMs?: number;
}

export interface ExecResult {
  /** 128 + signal number when killed by a signal, 127 when it could not be started. */
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
  readonly timedOut: boolean;
}

export interface SpawnOptions {
  readonly env?: Readonly<Record<string, string>>;
}

/** Where a namespace is named: by its role ('gw') or by its real name (topo.ns.gw). */
export type NsRef = NsRole | string;

export interface Topology {
  readonly prefix: string;
  /** Real namespace names. */
  readonly ns: Readonly<Record<NsRole, string>>;
  readonly addr: typeof ADDR;
  /** Fresh temp directory for natgw's state, removed by cleanup(). */
  readonly stateDir: string;
  /** Extra environment for natgw (GATEWAY_V4, GATEWAY_NETFILTER_MODE, ...); tests mutate it. */
  readonly env: Record<string, string>;

  exec(ns: NsRef, argv: readonly string[], opts?: ExecOptions): Promise<ExecResult>;
  /** Start a long-lived process in a namespace; it is killed by cleanup(). */
  spawn(ns: NsRef, argv: readonly string[], opts?: SpawnOptions): ChildProcess;

  /** The environment natgw runs with (defaults pointing into stateDir, then topo.env). */
  natgwEnv(): Record<string, string>;
  /** Run `natgw <command> <rules...>` in gw; never throws on a non-zero exit. */
  natgw(command: string, ...rules: string[]): Promise<ExecResult>;
  /** Like natgw() but throws unless exit 0 and empty stderr; returns stdout. */
  natgwOk(command: string, ...rules: string[]): Promise<string>;
  /** Start a long-running natgw (e.g. the daemon) in gw; killed by cleanup(). */
  spawnNatgw(command: string, ...args: string[]): ChildProcess;

  /** Normalised `iptables-save -t <table>` from gw ('' when that backend has no such table). */
  iptablesSave(table: 'nat' | 'mangle', variant?: 'legacy' | 'nft'): Promise<string>;
  /** Addresses (CIDR form) on an interface, or null when the interface does not exist. */
  addresses(ns: NsRef, ifname: string, family?: 4 | 6): Promise<string[] | null>;

  /** Create gw's net1 ⇄ ext's e0 (for lateExternal topologies, or after detachExternal). */
  attachExternal(): Promise<void>;
  /** Delete gw's net1 (and with it ext's e0). */
  detachExternal(): Promise<void>;
  /** Delete and re-create net1: a fresh link without addresses (drift tests). */
  recreateExternal(): Promise<void>;

  /** Kill everything started in the namespaces, delete them and stateDir. Idempotent, never throws. */
  cleanup(): Promise<void>;
}

interface IpAddrInfo {
  readonly family: string;
  readonly local: string;
  readonly prefixlen: number;
}

export interface TopologyOptions {
  /** Do not create gw's net1 yet; call attachExternal() later. */
  readonly lateExternal?: boolean;
  /** A second external network: namespace ext2 behind gw's net2 (see ADDR.ext2*). */
  readonly secondUplink?: boolean;
}

// ---------------------------------------------------------------------------------
// Process running
// ---------------------------------------------------------------------------------

export class ExecFailedError extends Error {
  override readonly name = 'ExecFailedError';
  constructor(
    readonly argv: readonly string[],
    readonly result: ExecResult,
  ) {
    super(
      `${argv.join(' ')} ${result.timedOut ? 'timed out' : `exited ${result.exitCode}`}\n` + `stdout: ${result.stdout.trim()}\nstderr: ${result.stderr.trim()}`,
    );
  }
}

const DEFAULT_EXEC_TIMEOUT_MS = 30_000;

/** Spawn in a new process group so a timeout or cleanup can kill the whole tree. */
export function spawnTracked(argv: readonly string[], env: NodeJS.ProcessEnv, track: Set<ChildProcess>): ChildProcess {
  const [file, ...args] = argv;
  if (file === undefined) throw new Error('empty argv');
  const child = spawn(file, args, { env, stdio: ['pipe', 'pipe', 'pipe'], detached: true });
  track.add(child);
  child.once('exit', () => track.delete(child));
  child.once('error', () => track.delete(child));
  // A process that exits without reading stdin must not crash the test with EPIPE.
  child.stdin?.on('error', () => undefined);
  return child;
}

export function killTree(child: ChildProcess): void {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(-child.pid, 'SIGKILL');
  } catch {
    // Already gone, or not a group leader any more: fall back to the process itself.
    child.kill('SIGKILL');
  }
}

export function runProcess(argv: readonly string[], env: NodeJS.ProcessEnv, opts: ExecOptions, track: Set<ChildProcess>): Promise<ExecResult> {
  return new Promise((resolvePromise, rejectPromise) => {
    const child = spawnTracked(argv, env, track);
    let stdout = '';
    let stderr = '';
    let timedOut = false;
    child.stdout?.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr?.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = setTimeout(() => {
      timedOut = true;
      killTree(child);
      // A grandchild that escaped the group could hold the pipes open and delay 'close' forever.
      child.stdout?.destroy();
      child.stderr?.destroy();
    }, opts.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS);

    const finish = (exitCode: number): void => {
      clearTimeout(timer);
      const result: ExecResult = { exitCode, stdout, stderr, timedOut };
      if ((opts.reject ?? true) && (exitCode !== 0 || timedOut)) rejectPromise(new ExecFailedError(argv, result));
      else resolvePromise(result);
    };
    child.once('error', (err) => {
      stderr += String(err);
      finish(127);
    });
    child.once('close', (code, signal) => finish(code ?? 128 + (signal ? constants.signals[signal] : 0)));
    child.stdin?.end(opts.input ?? '');
  });
}

/** Commands in the root namespace: only `ip netns add/del` and `ip -n <ours> ...`. */
async function ip(args: readonly string[]): Promise<ExecResult> {
  return runProcess(['ip', ...args], process.env, {}, new Set());
}

// ---------------------------------------------------------------------------------
// Last-resort sweep: namespaces outlive the process that made them, so whatever a
// crashed or interrupted run leaves behind is deleted synchronously at exit.
// ---------------------------------------------------------------------------------

interface Leftovers {
  readonly namespaces: Set<string>;
  readonly stateDirs: Set<string>;
}
const leftovers: Leftovers = { namespaces: new Set(), stateDirs: new Set() };
let exitHookInstalled = false;

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on('exit', sweepLeftoversSync);
}

function sweepLeftoversSync(): void {
  for (const ns of leftovers.namespaces) {
    killNamespacePidsSync(ns);
    spawnSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
  }
  leftovers.namespaces.clear();
  for (const dir of leftovers.stateDirs) rmSync(dir, { recursive: true, force: true });
  leftovers.stateDirs.clear();
}

function killNamespacePidsSync(ns: string): void {
  const r = spawnSync('ip', ['netns', 'pids', ns], { encoding: 'utf8' });
  for (const pid of parsePids(r.stdout ?? '')) killPid(pid);
}

function parsePids(text: string): number[] {
  return text
    .split('\n')
    .map((l) => Number.parseInt(l.trim(), 10))
    .filter((n) => Number.isInteger(n) && n > 1 && n !== process.pid);
}

function killPid(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // Exited meanwhile.
  }
}

/** Kill whatever runs in `ns`, including daemons that natgw started on its own. */
export async function killNamespacePids(ns: string): Promise<void> {
  // A process may fork while we kill; a few rounds catch the stragglers.
  for (let round = 0; round < 5; round++) {
    const r = await ip(['netns', 'pids', ns]).catch(() => null);
    const pids = parsePids(r?.stdout ?? '');
    if (pids.length === 0) return;
    pids.forEach(killPid);
  }
}

/** Real names of the namespaces that currently exist and start with `prefix`. */
export async function listNamespaces(prefix: string): Promise<string[]> {
  const r = await ip(['netns', 'list']);
  return r.stdout
    .split('\n')
    .map((l) => l.split(' ')[0] ?? '')
    .filter((name) => name !== '' && name.startsWith(prefix));
}

// ---------------------------------------------------------------------------------
// The topology
// ---------------------------------------------------------------------------------

/** Bridge port names in vsw, one per host plugged into the VPC switch. */
const VSW_PORTS = { gw: 'p-gw', vpc1: 'p-vpc1', vpc2: 'p-vpc2', rtr: 'p-rtr' } as const;

/** Environment keys that configure natgw: never inherited from the developer's shell. */
const NATGW_ENV_PREFIXES = ['NATGW_', 'GATEWAY_'];

let cachedDefaultIptablesVariant: Promise<'legacy' | 'nft'> | undefined;

class NetnsTopology implements Topology {
  readonly ns: Readonly<Record<NsRole, string>>;
  readonly addr = ADDR;
  readonly stateDir: string;
  readonly env: Record<string, string> = {};
  private readonly children = new Set<ChildProcess>();
  private cleaning: Promise<void> | undefined;

  private readonly roles: readonly NsRole[];

  constructor(
    readonly prefix: string,
    secondUplink = false,
  ) {
    this.roles = secondUplink ? ROLES_TWO_UPLINKS : ROLES;
    this.ns = Object.fromEntries(this.roles.map((r) => [r, `${prefix}${r}`])) as Record<NsRole, string>;
    this.stateDir = mkdtempSync(join(tmpdir(), `natgw-${prefix}`));
    leftovers.stateDirs.add(this.stateDir);
  }

  /** Resolve a role or real name to a real name, refusing anything not ours. */
  private resolveNs(ns: NsRef): string {
    if ((this.roles as readonly string[]).includes(ns)) return this.ns[ns as NsRole];
    if (Object.values(this.ns).includes(ns)) return ns;
    throw new Error(`namespace ${ns} does not belong to topology ${this.prefix}`);
  }

  async exec(ns: NsRef, argv: readonly string[], opts: ExecOptions = {}): Promise<ExecResult> {
    if (this.cleaning) throw new Error(`topology ${this.prefix} was cleaned up`);
    const env = { ...process.env, LC_ALL: 'C', ...opts.env };
    return runProcess(['ip', 'netns', 'exec', this.resolveNs(ns), ...argv], env, opts, this.children);
  }

  spawn(ns: NsRef, argv: readonly string[], opts: SpawnOptions = {}): ChildProcess {
    if (this.cleaning) throw new Error(`topology ${this.prefix} was cleaned up`);
    const env = { ...process.env, LC_ALL: 'C', ...opts.env };
    return spawnTracked(['ip', 'netns', 'exec', this.resolveNs(ns), ...argv], env, this.children);
  }

  /** `ip -n <ns> ...` from the root namespace: no extra mount namespace per call. */
  private ipIn(ns: NsRef, args: readonly string[]): Promise<ExecResult> {
    return ip(['-n', this.resolveNs(ns), ...args]);
  }

  private sysctl(ns: NsRef, settings: readonly string[]): Promise<ExecResult> {
    return this.exec(ns, ['sysctl', '-q', '-w', ...settings]);
  }

  // --- natgw -------------------------------------------------------------------

  natgwEnv(): Record<string, string> {
    const inherited = Object.fromEntries(
      Object.entries(process.env).filter((e): e is [string, string] => e[1] !== undefined && !NATGW_ENV_PREFIXES.some((p) => e[0].startsWith(p))),
    );
    return {
      ...inherited,
      NATGW_STATE_DIR: this.stateDir,
      NATGW_ENV_FILE: join(this.stateDir, 'nat-gateway.env'),
      NATGW_SOCKET: join(this.stateDir, 'natgw.sock'),
      NATGW_AUTOSTART: 'false',
      NATGW_INTERFACE_WAIT_TIMEOUT: '10s',
      ...this.env,
    };
  }

  private natgwArgv(command: string, args: readonly string[]): string[] {
    // ip netns exec keeps the environment; the shim finds node on PATH as the controller's image does.
    return ['ip', 'netns', 'exec', this.ns.gw, 'bash', NATGW_SHIM, command, ...args];
  }

  async natgw(command: string, ...rules: string[]): Promise<ExecResult> {
    if (this.cleaning) throw new Error(`topology ${this.prefix} was cleaned up`);
    const opts = { reject: false, timeoutMs: 45_000 };
    return runProcess(this.natgwArgv(command, rules), this.natgwEnv(), opts, this.children);
  }

  async natgwOk(command: string, ...rules: string[]): Promise<string> {
    const r = await this.natgw(command, ...rules);
    if (r.exitCode !== 0 || r.stderr !== '') {
      throw new Error(
        `natgw ${[command, ...rules].join(' ')} → exit ${r.exitCode}${r.timedOut ? ' (timed out)' : ''}\n` + `stdout: ${r.stdout}\nstderr: ${r.stderr}`,
      );
    }
    return r.stdout;
  }

  spawnNatgw(command: string, ...args: string[]): ChildProcess {
    if (this.cleaning) throw new Error(`topology ${this.prefix} was cleaned up`);
    return spawnTracked(this.natgwArgv(command, args), this.natgwEnv(), this.children);
  }

  // --- inspection ----------------------------------------------------------------

  async iptablesSave(table: 'nat' | 'mangle', variant?: 'legacy' | 'nft'): Promise<string> {
    const v = variant ?? (await defaultIptablesVariant());
    // Dumping a legacy table that does not exist would create it (the kernel instantiates
    // xt tables on first access), which natgw's backend detection could then see.
    if (!(await this.iptablesTableExists(table, v))) return '';
    const r = await this.exec('gw', [`iptables-${v}-save`, '-t', table]);
    return normalizeIptablesSave(r.stdout);
  }

  private async iptablesTableExists(table: string, variant: 'legacy' | 'nft'): Promise<boolean> {
    if (variant === 'legacy') {
      const r = await this.exec('gw', ['cat', '/proc/net/ip_tables_names']);
      return r.stdout.split('\n').includes(table);
    }
    const r = await this.exec('gw', ['nft', 'list', 'table', 'ip', table], { reject: false });
    return r.exitCode === 0;
  }

  async addresses(ns: NsRef, ifname: string, family?: 4 | 6): Promise<string[] | null> {
    // `ip` fails when the link does not exist: that is the null case.
    const r = await this.ipIn(ns, ['-j', 'addr', 'show', 'dev', ifname]).catch(() => null);
    if (r === null) return null;
    const links = JSON.parse(r.stdout || '[]') as Array<{ addr_info?: IpAddrInfo[] }>;
    const wanted = family === undefined ? undefined : family === 4 ? 'inet' : 'inet6';
    return links
      .flatMap((l) => l.addr_info ?? [])
      .filter((a) => wanted === undefined || a.family === wanted)
      .map((a) => `${a.local}/${a.prefixlen}`);
  }

  private async linkIsUp(ns: NsRef, ifname: string): Promise<boolean> {
    const r = await this.ipIn(ns, ['-j', 'link', 'show', 'dev', ifname]);
    const links = JSON.parse(r.stdout || '[]') as Array<{ flags?: string[] }>;
    const link = links[0];
    return link !== undefined && (link.flags ?? []).includes('LOWER_UP') && (link.flags ?? []).includes('UP');
  }

  private async waitLinkUp(ns: NsRole, ifname: string): Promise<void> {
    await waitFor(() => this.linkIsUp(ns, ifname).then((up) => up || undefined), {
      what: `${ifname} in ${this.ns[ns]} to be up with carrier`,
      timeoutMs: 10_000,
      intervalMs: 20,
    });
  }

  // --- building ----------------------------------------------------------------

  async build(opts: TopologyOptions): Promise<void> {
    installExitHook();
    for (const role of this.roles) {
      leftovers.namespaces.add(this.ns[role]);
      await ip(['netns', 'add', this.ns[role]]);
    }
    // Sysctls first: links created afterwards inherit the namespace's `default` settings.
    await Promise.all(this.roles.map((role) => this.prepareNamespace(role)));
    await this.buildVpcSwitch();
    await this.buildSecondSubnet();
    if (!opts.lateExternal) await this.attachExternal();
    if (opts.secondUplink) await this.attachSecondExternal();
    await this.waitLinkUp('gw', 'eth0');
  }

  private async prepareNamespace(role: NsRole): Promise<void> {
    await this.ipIn(role, ['link', 'set', 'lo', 'up']);
    const settings = [
      // Asymmetric paths (DNAT, hairpin, the routed second subnet) must not be dropped.
      'net.ipv4.conf.all.rp_filter=0',
      'net.ipv4.conf.default.rp_filter=0',
      // v6 addresses are usable at once instead of after duplicate address detection.
      'net.ipv6.conf.all.accept_dad=0',
      'net.ipv6.conf.default.accept_dad=0',
    ];
    if (role === 'gw' || role === 'rtr') settings.push('net.ipv4.ip_forward=1');
    if (role === 'vpc1' || role === 'vpc2' || role === 'rtr') {
      // gw would redirect hosts to rtr (same segment); keep every path through gw.
      settings.push('net.ipv4.conf.all.accept_redirects=0', 'net.ipv4.conf.default.accept_redirects=0');
    }
    if (role === 'vsw') {
      // The switch is pure L2: no v6 link-local chatter from its own ports.
      settings.push('net.ipv6.conf.all.disable_ipv6=1', 'net.ipv6.conf.default.disable_ipv6=1');
    }
    await this.sysctl(role, settings);
  }

  /** A veth from `host`'s `ifname` to a port of vsw's bridge, both ends up. */
  private async plugIntoSwitch(host: keyof typeof VSW_PORTS, ifname: string): Promise<void> {
    const port = VSW_PORTS[host];
    await this.ipIn('vsw', ['link', 'add', port, 'type', 'veth', 'peer', 'name', ifname, 'netns', this.ns[host]]);
    await this.ipIn('vsw', ['link', 'set', port, 'master', 'br0', 'up']);
    await this.ipIn(host, ['link', 'set', ifname, 'up']);
  }

  private async addAddress(ns: NsRole, ifname: string, cidr: string, extra: readonly string[] = []): Promise<void> {
    await this.ipIn(ns, ['addr', 'add', cidr, 'dev', ifname, ...extra]);
  }

  private async buildVpcSwitch(): Promise<void> {
    await this.ipIn('vsw', ['link', 'add', 'br0', 'type', 'bridge']);
    await this.ipIn('vsw', ['link', 'set', 'br0', 'up']);

    await this.plugIntoSwitch('gw', 'eth0');
    await this.addAddress('gw', 'eth0', `${ADDR.gw}/24`);

    for (const host of ['vpc1', 'vpc2'] as const) {
      await this.plugIntoSwitch(host, 'eth0');
      await this.addAddress(host, 'eth0', `${ADDR[host]}/24`);
      await this.ipIn(host, ['route', 'add', 'default', 'via', ADDR.gw]);
    }

    await this.plugIntoSwitch('rtr', 'eth0');
    await this.addAddress('rtr', 'eth0', `${ADDR.rtr}/24`);
    await this.ipIn('rtr', ['route', 'add', 'default', 'via', ADDR.gw]);
  }

  private async buildSecondSubnet(): Promise<void> {
    await this.ipIn('rtr', ['link', 'add', 'eth1', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', this.ns.sub2]);
    await this.ipIn('rtr', ['link', 'set', 'eth1', 'up']);
    await this.ipIn('sub2', ['link', 'set', 'eth0', 'up']);
    await this.addAddress('rtr', 'eth1', `${ADDR.rtrSub2}/24`);
    await this.addAddress('sub2', 'eth0', `${ADDR.sub2}/24`);
    await this.ipIn('sub2', ['route', 'add', 'default', 'via', ADDR.rtrSub2]);
  }

  // --- the external link ------------------------------------------------------------

  async attachExternal(): Promise<void> {
    await this.ipIn('gw', ['link', 'add', 'net1', 'type', 'veth', 'peer', 'name', 'e0', 'netns', this.ns.ext]);
    await this.ipIn('gw', ['link', 'set', 'net1', 'up']);
    await this.ipIn('ext', ['link', 'set', 'e0', 'up']);
    await this.addAddress('ext', 'e0', `${ADDR.extGateway}/24`);
    await this.addAddress('ext', 'e0', `${ADDR.extHost}/24`);
    await this.addAddress('ext', 'e0', `${ADDR.extGatewayV6}/64`, ['nodad']);
    await this.waitLinkUp('gw', 'net1');
  }

  /** gw's net2 ⇄ ext2's e0 (its gateway and host addresses), as attachExternal does for net1. */
  private async attachSecondExternal(): Promise<void> {
    await this.ipIn('gw', ['link', 'add', 'net2', 'type', 'veth', 'peer', 'name', 'e0', 'netns', this.ns.ext2]);
    await this.ipIn('gw', ['link', 'set', 'net2', 'up']);
    await this.ipIn('ext2', ['link', 'set', 'e0', 'up']);
    await this.addAddress('ext2', 'e0', `${ADDR.ext2Gateway}/24`);
    await this.addAddress('ext2', 'e0', `${ADDR.ext2Host}/24`);
    await this.waitLinkUp('gw', 'net2');
  }

  async detachExternal(): Promise<void> {
    // Deleting one end of a veth deletes its peer (ext's e0) in the same operation.
    await this.ipIn('gw', ['link', 'del', 'net1']);
  }

  async recreateExternal(): Promise<void> {
    await this.detachExternal();
    await this.attachExternal();
  }

  // --- teardown ------------------------------------------------------------------

  cleanup(): Promise<void> {
    this.cleaning ??= this.teardown().catch(() => undefined);
    return this.cleaning;
  }

  private async teardown(): Promise<void> {
    for (const child of this.children) killTree(child);
    for (const ns of Object.values(this.ns)) {
      await killNamespacePids(ns).catch(() => undefined);
      await ip(['netns', 'del', ns]).catch(() => undefined);
      leftovers.namespaces.delete(ns);
    }
    rmSync(this.stateDir, { recursive: true, force: true });
    leftovers.stateDirs.delete(this.stateDir);
  }
}

function defaultIptablesVariant(): Promise<'legacy' | 'nft'> {
  cachedDefaultIptablesVariant ??= runProcess(['iptables', '--version'], process.env, { reject: false }, new Set()).then((r) =>
    r.stdout.includes('nf_tables') ? 'nft' : 'legacy',
  );
  return cachedDefaultIptablesVariant;
}

/** Drop comments and packet/byte counters so that two dumps compare equal when the rules do. */
export function normalizeIptablesSave(text: string): string {
  return text
    .split('\n')
    .filter((l) => !l.startsWith('#') && l.trim() !== '')
    .map((l) => l.replace(/\s*\[\d+:\d+\]$/, '').replace(/^\[\d+:\d+\]\s*/, ''))
    .join('\n');
}

function randomPrefix(): string {
  // 'ng' + 5 hex + '-': short enough that `${prefix}${role}` reads well in `ip netns list`.
  return `ng${randomBytes(3).toString('hex').slice(0, 5)}-`;
}

/** Build a fresh topology; on failure everything already created is removed again. */
export async function createTopology(opts: TopologyOptions = {}): Promise<Topology> {
  const topo = new NetnsTopology(randomPrefix(), opts.secondUplink);
  try {
    await topo.build(opts);
  } catch (err) {
    await topo.cleanup();
    throw err;
  }
  return topo;
}

/** Run `fn` on a fresh topology and always clean it up, whether `fn` returns or throws. */
export async function withTopology<T>(fn: (topo: Topology) => Promise<T>, opts: TopologyOptions = {}): Promise<T> {
  const topo = await createTopology(opts);
  try {
    return await fn(topo);
  } finally {
    await topo.cleanup();
  }
}
