/**
 * N active-active gateway replicas as Kube-OVN runs them behind OVN ECMP, with a static ECMP
 * route on an upstream router standing in for BGP:
 *
 *   vpc1 10.0.1.6 ─┐   default: ECMP over every replica's eth0 (OVN)
 *   vpc2 10.0.1.7 ─┤
 *                  └ vsw br0 ─── g<i> eth0 10.0.1.(1+i)
 *                                g<i> net1 172.20.0.(2+i) ── rtr br-ext 172.20.0.1 ── ext 198.51.100.100
 *                                g<i> sync0 10.99.0.(1+i) ── vsw br-sync            (rtr 198.51.100.1)
 *
 * rtr routes each EIP (/32) by ECMP over the replicas' net1 addresses: either a static route
 * (routeEips; failNexthop stands in for BFD) or, with startRouterBgp, what BIRD learns by BGP
 * from each replica's own BIRD (natgw's NATGW_BGP_*), BFD 100 ms x 3 withdrawing a dead one.
 * The replicas' net1 sit on a bridge in rtr, so a replica's link going down does not take the
 * route away (BFD does). Every ECMP hashes on the five-tuple (fib_multipath_hash_policy 3 with
 * the fields of the five-tuple), never on a hash a sender's socket left on the packet.
 */
import { spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO_ROOT, killNamespacePids, killTree, runProcess, spawnTracked, type ExecOptions, type ExecResult, type Topology } from './netns.js';

export const ECMP_ADDR = {
  eth0: (i: number) => `10.0.1.${1 + i}`,
  net1: (i: number) => `172.20.0.${2 + i}`,
  sync: (i: number) => `10.99.0.${1 + i}`,
  vpc1: '10.0.1.6',
  vpc2: '10.0.1.7',
  vpcCidr: '10.0.1.0/24',
  extGateway: '172.20.0.1',
  replicaAsn: '65001',
  routerAsn: '65000',
  extHost: '198.51.100.100',
  rtrUp: '198.51.100.1',
  apiPort: 18080,
} as const;

const SHIM = join(REPO_ROOT, 'image', 'nat-gateway.sh');
const live = new Set<string>();
let hooked = false;

export class EcmpTopology {
  readonly replicas: readonly string[];
  readonly ns: Readonly<Record<string, string>>;
  readonly stateDir: readonly string[];
  readonly tokenFile: string;
  private readonly children = new Set<ChildProcess>();
  private eips: string[] = [];
  /** Replicas the router and the VPC still send to. */
  private readonly up: Set<number>;
  private cleaning: Promise<void> | undefined;

  private constructor(
    readonly prefix: string,
    readonly n: number,
  ) {
    this.replicas = Array.from({ length: n }, (_, i) => `g${i}`);
    const roles = [...this.replicas, 'vsw', 'vpc1', 'vpc2', 'rtr', 'ext'];
    this.ns = Object.fromEntries(roles.map((r) => [r, `${prefix}${r}`]));
    this.stateDir = this.replicas.map((r) => mkdtempSync(join(tmpdir(), `natgw-${prefix}${r}-`)));
    this.tokenFile = join(this.stateDir[0] as string, 'peer-token');
    writeFileSync(this.tokenFile, `${randomBytes(16).toString('hex')}\n`, { mode: 0o600 });
    this.up = new Set(this.replicas.keys());
  }

  static async create(n = 2): Promise<EcmpTopology> {
    const t = new EcmpTopology(`ne${randomBytes(3).toString('hex').slice(0, 5)}-`, n);
    try {
      await t.build();
    } catch (e) {
      await t.cleanup();
      throw e;
    }
    return t;
  }

  private resolve(ns: string): string {
    const hit = this.ns[ns];
    if (hit) return hit;
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

  private ip(ns: string, args: readonly string[]): Promise<ExecResult> {
    return runProcess(['ip', '-n', this.resolve(ns), ...args], process.env, {}, new Set());
  }

  socket(i: number): string {
    return join(this.stateDir[i] as string, 'natgw.sock');
  }

  /**
   * natgw's environment for replica i: its own state dir, socket and env file; active-active sync
   * with every other replica, its API on the sync network for the peers.
   */
  natgwEnv(i: number, extra: Record<string, string> = {}): Record<string, string> {
    const inherited = Object.fromEntries(
      Object.entries(process.env).filter((e): e is [string, string] => e[1] !== undefined && !/^(NATGW_|GATEWAY_)/.test(e[0])),
    );
    const dir = this.stateDir[i] as string;
    // A pair syncs over UDP unicast; more replicas name every other one (a multicast channel).
    const peers = this.replicas.map((_, j) => j).filter((j) => j !== i);
    return {
      ...inherited,
      NATGW_STATE_DIR: dir,
      NATGW_ENV_FILE: join(dir, 'nat-gateway.env'),
      NATGW_SOCKET: join(dir, 'natgw.sock'),
      NATGW_AUTOSTART: 'false',
      NATGW_INTERFACE_WAIT_TIMEOUT: '10s',
      NATGW_RESYNC_PERIOD: '5s',
      GATEWAY_V4: ECMP_ADDR.extGateway,
      NATGW_HA_PEERS: peers.map((j) => ECMP_ADDR.sync(j)).join(','),
      NATGW_HA_SYNC_INTERFACE: 'sync0',
      NATGW_HA_SYNC_TIMEOUT: '3s',
      NATGW_HA_MODE: 'active-active',
      NATGW_LISTEN: `${ECMP_ADDR.sync(i)}:${ECMP_ADDR.apiPort}`,
      NATGW_TOKEN_FILE: this.tokenFile,
      NATGW_HA_PEER_API: peers.map((j) => `http://${ECMP_ADDR.sync(j)}:${ECMP_ADDR.apiPort}`).join(','),
      ...extra,
    };
  }

  spawnNatgw(i: number, env: Record<string, string>, ...args: string[]): ChildProcess {
    return spawnTracked(['ip', 'netns', 'exec', this.resolve(`g${i}`), 'bash', SHIM, ...args], this.natgwEnv(i, env), this.children);
  }

  private async build(): Promise<void> {
    if (!hooked) {
      hooked = true;
      process.on('exit', () => {
        for (const ns of live) spawnSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
      });
    }
    for (const [role, ns] of Object.entries(this.ns)) {
      live.add(ns);
      await runProcess(['ip', 'netns', 'add', ns], process.env, {}, new Set());
      await this.ip(role, ['link', 'set', 'lo', 'up']);
      const sysctls = [
        'net.ipv4.conf.all.rp_filter=0',
        'net.ipv4.conf.default.rp_filter=0',
        'net.ipv6.conf.all.disable_ipv6=1',
        'net.ipv6.conf.default.disable_ipv6=1',
        // The five-tuple (policy 3: the fields below, 0x37: addresses, protocol, ports), not the
        // hash a sender's socket left on the packet.
        'net.ipv4.fib_multipath_hash_policy=3',
        'net.ipv4.fib_multipath_hash_fields=55',
      ];
      if (role.startsWith('g') || role === 'rtr') sysctls.push('net.ipv4.ip_forward=1');
      if (role.startsWith('vpc')) sysctls.push('net.ipv4.conf.all.accept_redirects=0', 'net.ipv4.conf.default.accept_redirects=0');
      await this.exec(role, ['sysctl', '-q', '-w', ...sysctls]);
    }
    await this.ip('vsw', ['link', 'add', 'br0', 'type', 'bridge']);
    await this.ip('vsw', ['link', 'add', 'br-sync', 'type', 'bridge']);
    await this.ip('rtr', ['link', 'add', 'br-ext', 'type', 'bridge']);
    for (const [ns, br] of [
      ['vsw', 'br0'],
      ['vsw', 'br-sync'],
      ['rtr', 'br-ext'],
    ] as const)
      await this.ip(ns, ['link', 'set', br, 'up']);
    await this.ip('rtr', ['addr', 'add', `${ECMP_ADDR.extGateway}/24`, 'dev', 'br-ext']);
    const plug = async (host: string, hostIf: string, sw: string, br: string, port: string, addr: string) => {
      await this.ip(sw, ['link', 'add', port, 'type', 'veth', 'peer', 'name', hostIf, 'netns', this.resolve(host)]);
      await this.ip(sw, ['link', 'set', port, 'master', br, 'up']);
      await this.ip(host, ['link', 'set', hostIf, 'up']);
      await this.ip(host, ['addr', 'add', addr, 'dev', hostIf]);
    };
    for (let i = 0; i < this.n; i++) {
      const g = `g${i}`;
      await plug(g, 'eth0', 'vsw', 'br0', `p-${g}`, `${ECMP_ADDR.eth0(i)}/24`);
      await plug(g, 'sync0', 'vsw', 'br-sync', `s-${g}`, `${ECMP_ADDR.sync(i)}/24`);
      await plug(g, 'net1', 'rtr', 'br-ext', `e-${g}`, `${ECMP_ADDR.net1(i)}/24`);
    }
    for (const h of ['vpc1', 'vpc2'] as const) await plug(h, 'eth0', 'vsw', 'br0', `p-${h}`, `${ECMP_ADDR[h]}/24`);
    await this.ip('ext', ['link', 'add', 'up0', 'type', 'veth', 'peer', 'name', 'up0', 'netns', this.ns.rtr as string]);
    for (const [ns, addr] of [
      ['ext', ECMP_ADDR.extHost],
      ['rtr', ECMP_ADDR.rtrUp],
    ] as const) {
      await this.ip(ns, ['link', 'set', 'up0', 'up']);
      await this.ip(ns, ['addr', 'add', `${addr}/24`, 'dev', 'up0']);
    }
    await this.ip('ext', ['route', 'add', 'default', 'via', ECMP_ADDR.rtrUp]);
    await this.routeVpc();
  }

  /** ECMP over the replicas still up, or one plain route where one is left. */
  private nexthops(via: (i: number) => string, dev: string): string[] {
    const up = [...this.up].sort();
    if (up.length === 1) return ['via', via(up[0] as number), 'dev', dev];
    return up.flatMap((i) => ['nexthop', 'via', via(i), 'dev', dev]);
  }

  private async routeVpc(): Promise<void> {
    for (const h of ['vpc1', 'vpc2']) await this.ip(h, ['route', 'replace', 'default', ...this.nexthops(ECMP_ADDR.eth0, 'eth0')]);
  }

  /** rtr routes each EIP by ECMP over the replicas that are up (what BGP would install). */
  async routeEips(eips: readonly string[]): Promise<void> {
    this.eips = [...eips];
    for (const eip of eips) await this.ip('rtr', ['route', 'replace', `${eip}/32`, ...this.nexthops(ECMP_ADDR.net1, 'br-ext')]);
  }

  /** What BFD does when replica i stops answering: its next hop leaves the router's and the VPC's ECMP. */
  async failNexthop(i: number): Promise<void> {
    this.up.delete(i);
    await this.routeEips(this.eips);
    await this.routeVpc();
  }

  /** Replica i is back in both ECMP routes. */
  async restoreNexthop(i: number): Promise<void> {
    this.up.add(i);
    await this.routeEips(this.eips);
    await this.routeVpc();
  }

  /**
   * The upstream router's BIRD: a BGP session with each replica's net1 address, BFD at
   * 100 ms x 3 on br-ext, every learned route into rtr's kernel (ECMP over the replicas).
   * natgwBgpEnv() is the replicas' side.
   */
  async startRouterBgp(): Promise<{ log(): string }> {
    const dir = this.stateDir[0] as string;
    const conf = join(dir, 'rtr-bird.conf');
    const sock = join(dir, 'rtr-bird.ctl');
    const sessions = this.replicas.map((g, i) => `protocol bgp ${g} from replica { neighbor ${ECMP_ADDR.net1(i)} as ${ECMP_ADDR.replicaAsn}; }`);
    writeFileSync(
      conf,
      `log stderr all;
router id ${ECMP_ADDR.extGateway};
protocol device {}
protocol kernel { ipv4 { import none; export all; }; merge paths on; }
protocol bfd { interface "br-ext" { interval 100 ms; multiplier 3; }; }
template bgp replica {
  local ${ECMP_ADDR.extGateway} as ${ECMP_ADDR.routerAsn};
  direct;
  bfd on;
  connect delay time 1;
  connect retry time 2;
  error wait time 1, 5;
  ipv4 { import all; export none; };
}
${sessions.join('\n')}
`,
    );
    const bird = this.spawn('rtr', ['bird', '-f', '-c', conf, '-s', sock]);
    let log = '';
    bird.stderr?.setEncoding('utf8').on('data', (d: string) => (log += d));
    for (let deadline = Date.now() + 10_000; ; ) {
      if ((await this.exec('rtr', ['birdc', '-s', sock, 'show', 'status'], { reject: false })).exitCode === 0) break;
      if (Date.now() > deadline) throw new Error(`the router's BIRD does not answer: ${log}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    return { log: () => log };
  }

  /**
   * What every BIRD holds (the router's routes, sessions and BFD; each replica's sessions and
   * what it exports), and each replica's conntrack table, TCP sockets and rules: for the message
   * of a failed wait on rtr's FIB.
   */
  async bgpDiagnosis(): Promise<string> {
    const ask = async (ns: string, sock: string, ...args: string[]) => {
      const r = await this.exec(ns, ['birdc', '-s', sock, ...args], { reject: false });
      return `## ${ns}: birdc ${args.join(' ')}\n${r.stdout}${r.stderr}`;
    };
    const rtrSock = join(this.stateDir[0] as string, 'rtr-bird.ctl');
    const parts = [
      await ask('rtr', rtrSock, 'show', 'route', 'all'),
      await ask('rtr', rtrSock, 'show', 'protocols', 'all'),
      await ask('rtr', rtrSock, 'show', 'bfd', 'sessions'),
      `## rtr: ip route\n${(await this.ip('rtr', ['-4', 'route', 'show'])).stdout}`,
    ];
    for (const [i, g] of this.replicas.entries()) {
      const sock = join(this.stateDir[i] as string, 'bird', 'bird.ctl');
      parts.push(await ask(g, sock, 'show', 'protocols', 'all'), await ask(g, sock, 'show', 'route', 'all'));
      for (const cmd of [
        ['conntrack', '-L', '-p', 'tcp'],
        ['ss', '-tnio'],
        ['iptables-legacy-save', '-c'],
        ['nft', 'list', 'ruleset'],
      ]) {
        const r = await this.exec(g, cmd, { reject: false });
        parts.push(`## ${g}: ${cmd.join(' ')}\n${r.stdout}${r.stderr}`);
      }
    }
    return parts.join('\n');
  }

  /** A replica's BGP settings toward rtr's BIRD (BFD as the router's). */
  static natgwBgpEnv(): Record<string, string> {
    return {
      NATGW_BGP_PEERS: ECMP_ADDR.extGateway,
      NATGW_BGP_ASN: ECMP_ADDR.replicaAsn,
      NATGW_BGP_PEER_ASN: ECMP_ADDR.routerAsn,
      NATGW_BFD_INTERVAL: '100ms',
      NATGW_BFD_MULTIPLIER: '3',
    };
  }

  /** The next hops rtr's kernel holds for `eip`/32 (none: no route). */
  async fibVia(eip: string): Promise<string[]> {
    const r = await this.ip('rtr', ['-4', '-j', 'route', 'show', `${eip}/32`]);
    const routes = JSON.parse(r.stdout || '[]') as Array<{ gateway?: string; nexthops?: Array<{ gateway?: string }> }>;
    return routes.flatMap((x) => (x.nexthops ? x.nexthops.map((n) => n.gateway ?? '') : [x.gateway ?? ''])).filter(Boolean);
  }

  /** The VPC side only (OVN's own BFD, which this stand-in has not): replica i leaves the VPC's ECMP. */
  async failVpcNexthop(i: number): Promise<void> {
    this.up.delete(i);
    await this.routeVpc();
  }

  /**
   * Every process of replica i killed (natgw and conntrackd), its links down. linksFirst: the
   * links go down before the kill, as when a node dies, so that no FIN of a closing socket (the
   * BGP session's) reaches the router, and only BFD can tell.
   */
  async killReplica(i: number, linksFirst = false): Promise<void> {
    const down = async () => {
      for (const ifname of ['net1', 'eth0', 'sync0']) await this.ip(`g${i}`, ['link', 'set', ifname, 'down']);
    };
    if (linksFirst) await down();
    await killNamespacePids(this.resolve(`g${i}`));
    if (!linksFirst) await down();
  }

  /** Replica i's links up again (a new pod in its place would get the same addresses). */
  async linksUp(i: number): Promise<void> {
    for (const ifname of ['net1', 'eth0', 'sync0']) await this.ip(`g${i}`, ['link', 'set', ifname, 'up']);
  }

  cleanup(): Promise<void> {
    this.cleaning ??= (async () => {
      for (const c of this.children) killTree(c);
      for (const ns of Object.values(this.ns)) {
        await killNamespacePids(ns);
        await runProcess(['ip', 'netns', 'del', ns], process.env, { reject: false }, new Set());
        live.delete(ns);
      }
      for (const d of this.stateDir) rmSync(d, { recursive: true, force: true });
    })().catch(() => undefined);
    return this.cleaning;
  }
}
