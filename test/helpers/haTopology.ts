/**
 * Two gateway replicas for the replica-sync tests, wired as Kube-OVN runs a VPC NAT gateway
 * with replicas (ECMP towards both, one sync network between them):
 *
 *   vpc1 10.0.1.6 ─┐                 ┌ ga eth0 10.0.1.1   ga net1 (EIPs) ── e-a ┐
 *   vpc2 10.0.1.7 ─┴ vsw: br0 ───────┤                    │ sync0 10.99.0.1     ├ ext: 172.20.0.1, 172.20.0.100 (on lo)
 *                                    └ gb eth0 10.0.1.2   gb net1 (EIPs) ── e-b ┘     EIP /32 routes via e-a, then e-b
 *                                                         │ sync0 10.99.0.2
 *
 * Both replicas hold the same EIPs on their net1; which one receives traffic is decided by
 * the other sides' routes: ext routes each EIP via e-a or e-b, the VPC hosts' default route
 * points at ga's or gb's eth0 (what ECMP/BFD does in a cluster). failover() moves both.
 *
 * With `sharedExt` the external side is one segment instead (a bridge br-ext over e-a and e-b,
 * 172.20.0.1/24 on it): ext reaches an EIP through its neighbour entry, so whichever replica
 * announced last receives the traffic, as an upstream router on a shared L2 does.
 */
import { spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO_ROOT, killNamespacePids, killTree, runProcess, spawnTracked, type ExecOptions, type ExecResult, type Topology } from './netns.js';

export type HaRole = 'ga' | 'gb' | 'vsw' | 'vpc1' | 'vpc2' | 'ext';
const ROLES: readonly HaRole[] = ['ga', 'gb', 'vsw', 'vpc1', 'vpc2', 'ext'];
export type Replica = 'ga' | 'gb';

export const HA_ADDR = {
  eth0: { ga: '10.0.1.1', gb: '10.0.1.2' },
  sync: { ga: '10.99.0.1', gb: '10.99.0.2' },
  vpc1: '10.0.1.6',
  vpc2: '10.0.1.7',
  vpcCidr: '10.0.1.0/24',
  extGateway: '172.20.0.1',
  extHost: '172.20.0.100',
} as const;

const SHIM = join(REPO_ROOT, 'image', 'nat-gateway.sh');
const live = new Set<string>();
let hooked = false;

export class HaTopology {
  readonly ns: Readonly<Record<HaRole, string>>;
  readonly stateDir: Readonly<Record<Replica, string>>;
  private readonly children = new Set<ChildProcess>();
  private eips: string[] = [];
  private cleaning: Promise<void> | undefined;

  private constructor(
    readonly prefix: string,
    readonly sharedExt = false,
  ) {
    this.ns = Object.fromEntries(ROLES.map((r) => [r, `${prefix}${r}`])) as Record<HaRole, string>;
    this.stateDir = { ga: mkdtempSync(join(tmpdir(), `natgw-${prefix}ga-`)), gb: mkdtempSync(join(tmpdir(), `natgw-${prefix}gb-`)) };
  }

  static async create(opts: { sharedExt?: boolean } = {}): Promise<HaTopology> {
    const t = new HaTopology(`nh${randomBytes(3).toString('hex').slice(0, 5)}-`, opts.sharedExt === true);
    try {
      await t.build();
    } catch (e) {
      await t.cleanup();
      throw e;
    }
    return t;
  }

  private resolve(ns: string): string {
    if ((ROLES as readonly string[]).includes(ns)) return this.ns[ns as HaRole];
    if (Object.values(this.ns).includes(ns)) return ns;
    throw new Error(`namespace ${ns} is not part of ${this.prefix}`);
  }

  exec(ns: string, argv: readonly string[], opts: ExecOptions = {}): Promise<ExecResult> {
    if (this.cleaning) throw new Error(`${this.prefix} was cleaned up`);
    return runProcess(['ip', 'netns', 'exec', this.resolve(ns), ...argv], { ...process.env, LC_ALL: 'C', ...opts.env }, opts, this.children);
  }

  spawn(ns: string, argv: readonly string[], opts: { env?: Readonly<Record<string, string>> } = {}): ChildProcess {
    if (this.cleaning) throw new Error(`${this.prefix} was cleaned up`);
    return spawnTracked(['ip', 'netns', 'exec', this.resolve(ns), ...argv], { ...process.env, LC_ALL: 'C', ...opts.env }, this.children);
  }

  /** For test/helpers/traffic.ts, which needs only exec and spawn by namespace name. */
  get traffic(): Topology {
    return this as unknown as Topology;
  }

  private ip(ns: HaRole, args: readonly string[]): Promise<ExecResult> {
    return runProcess(['ip', '-n', this.ns[ns], ...args], process.env, {}, new Set());
  }

  /** natgw's environment for one replica: its own state dir, socket and env file. */
  natgwEnv(r: Replica, extra: Record<string, string> = {}): Record<string, string> {
    const inherited = Object.fromEntries(
      Object.entries(process.env).filter((e): e is [string, string] => e[1] !== undefined && !/^(NATGW_|GATEWAY_)/.test(e[0])),
    );
    const dir = this.stateDir[r];
    return {
      ...inherited,
      NATGW_STATE_DIR: dir,
      NATGW_ENV_FILE: join(dir, 'nat-gateway.env'),
      NATGW_SOCKET: join(dir, 'natgw.sock'),
      NATGW_AUTOSTART: 'false',
      NATGW_INTERFACE_WAIT_TIMEOUT: '10s',
      GATEWAY_V4: HA_ADDR.extGateway,
      ...extra,
    };
  }

  socket(r: Replica): string {
    return join(this.stateDir[r], 'natgw.sock');
  }

  spawnNatgw(r: Replica, env: Record<string, string>, ...args: string[]): ChildProcess {
    return spawnTracked(['ip', 'netns', 'exec', this.ns[r], 'bash', SHIM, ...args], this.natgwEnv(r, env), this.children);
  }

  private async build(): Promise<void> {
    if (!hooked) {
      hooked = true;
      process.on('exit', () => {
        for (const ns of live) spawnSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
      });
    }
    for (const r of ROLES) {
      live.add(this.ns[r]);
      await runProcess(['ip', 'netns', 'add', this.ns[r]], process.env, {}, new Set());
      await this.ip(r, ['link', 'set', 'lo', 'up']);
      const sysctls = [
        'net.ipv4.conf.all.rp_filter=0',
        'net.ipv4.conf.default.rp_filter=0',
        'net.ipv6.conf.all.disable_ipv6=1',
        'net.ipv6.conf.default.disable_ipv6=1',
      ];
      if (r === 'ga' || r === 'gb') sysctls.push('net.ipv4.ip_forward=1');
      if (r === 'vpc1' || r === 'vpc2') sysctls.push('net.ipv4.conf.all.accept_redirects=0', 'net.ipv4.conf.default.accept_redirects=0');
      // A shared segment learns the EIPs' MACs from gratuitous ARP (new entries too), never from a race of two replies.
      if (r === 'ext' && this.sharedExt) sysctls.push('net.ipv4.conf.all.arp_accept=1', 'net.ipv4.conf.default.arp_accept=1');
      await this.exec(r, ['sysctl', '-q', '-w', ...sysctls]);
    }
    await this.ip('vsw', ['link', 'add', 'br0', 'type', 'bridge']);
    await this.ip('vsw', ['link', 'set', 'br0', 'up']);
    const plug = async (host: HaRole, addr: string) => {
      await this.ip('vsw', ['link', 'add', `p-${host}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', this.ns[host]]);
      await this.ip('vsw', ['link', 'set', `p-${host}`, 'master', 'br0', 'up']);
      await this.ip(host, ['link', 'set', 'eth0', 'up']);
      await this.ip(host, ['addr', 'add', `${addr}/24`, 'dev', 'eth0']);
    };
    await plug('ga', HA_ADDR.eth0.ga);
    await plug('gb', HA_ADDR.eth0.gb);
    for (const h of ['vpc1', 'vpc2'] as const) {
      await plug(h, HA_ADDR[h]);
      await this.ip(h, ['route', 'add', 'default', 'via', HA_ADDR.eth0.ga]);
    }
    // The external side: its addresses on lo, so that neither link going down takes them away.
    if (this.sharedExt) {
      await this.ip('ext', ['link', 'add', 'br-ext', 'type', 'bridge']);
      await this.ip('ext', ['link', 'set', 'br-ext', 'up']);
      await this.ip('ext', ['addr', 'add', `${HA_ADDR.extGateway}/24`, 'dev', 'br-ext']);
    } else {
      await this.ip('ext', ['addr', 'add', `${HA_ADDR.extGateway}/32`, 'dev', 'lo']);
    }
    await this.ip('ext', ['addr', 'add', `${HA_ADDR.extHost}/32`, 'dev', 'lo']);
    for (const [r, e] of [
      ['ga', 'e-a'],
      ['gb', 'e-b'],
    ] as const) {
      await this.ip(r, ['link', 'add', 'net1', 'type', 'veth', 'peer', 'name', e, 'netns', this.ns.ext]);
      await this.ip(r, ['link', 'set', 'net1', 'up']);
      if (this.sharedExt) await this.ip('ext', ['link', 'set', e, 'master', 'br-ext']);
      await this.ip('ext', ['link', 'set', e, 'up']);
    }
    await this.ip('ga', ['link', 'add', 'sync0', 'type', 'veth', 'peer', 'name', 'sync0', 'netns', this.ns.gb]);
    for (const r of ['ga', 'gb'] as const) {
      await this.ip(r, ['addr', 'add', `${HA_ADDR.sync[r]}/30`, 'dev', 'sync0']);
      await this.ip(r, ['link', 'set', 'sync0', 'up']);
    }
  }

  /** The external side sends the EIPs to replica `r` (a /32 route per EIP on that replica's link). */
  async routeEips(eips: readonly string[], r: Replica): Promise<void> {
    if (this.sharedExt) throw new Error('on a shared external segment the neighbour entries decide, not routes');
    this.eips = [...eips];
    for (const eip of eips) await this.ip('ext', ['route', 'replace', `${eip}/32`, 'dev', r === 'ga' ? 'e-a' : 'e-b']);
  }

  /** The path moves to replica B: A's links go down, ext routes the EIPs to B, the VPC's default route points at B. */
  async failover(): Promise<void> {
    for (const ifname of ['net1', 'eth0']) await this.ip('ga', ['link', 'set', ifname, 'down']);
    await this.routeEips(this.eips, 'gb');
    for (const h of ['vpc1', 'vpc2'] as const) await this.ip(h, ['route', 'replace', 'default', 'via', HA_ADDR.eth0.gb]);
  }

  /** The MAC address of replica `r`'s external interface (net1). */
  async macOf(r: Replica): Promise<string> {
    const out = JSON.parse((await this.ip(r, ['-j', 'link', 'show', 'net1'])).stdout) as Array<{ address: string }>;
    return out[0]!.address;
  }

  /** The MAC ext's neighbour table holds for `ip` on the shared segment (undefined: no usable entry). */
  async extNeighbour(ip: string): Promise<string | undefined> {
    const out = JSON.parse((await this.ip('ext', ['-j', 'neigh', 'show', ip, 'dev', 'br-ext'])).stdout || '[]') as Array<{ lladdr?: string; state?: string[] }>;
    return out.find((n) => n.lladdr && !n.state?.includes('FAILED'))?.lladdr;
  }

  cleanup(): Promise<void> {
    this.cleaning ??= (async () => {
      for (const c of this.children) killTree(c);
      for (const ns of Object.values(this.ns)) {
        await killNamespacePids(ns);
        await runProcess(['ip', 'netns', 'del', ns], process.env, { reject: false }, new Set());
        live.delete(ns);
      }
      for (const d of Object.values(this.stateDir)) rmSync(d, { recursive: true, force: true });
    })().catch(() => undefined);
    return this.cleaning;
  }
}
