/**
 * EIPs announced by BGP (issue 30), on the real kernel with the real routing daemon: an
 * upstream router (BIRD, BGP + BFD at 100 ms × 3, ECMP into its kernel FIB) and replica A
 * (natgw supervising its own BIRD) on one bridge, so a replica's link going down leaves the
 * router's side up and only BFD can tell; an external client behind the router.
 *
 *   cl 192.0.2.2 ── router (ext) 192.0.2.1 │ br-ext 172.20.0.1 ─┬─ e-a ── ga net1 172.20.0.11 (+ EIPs)
 *                                                              └─ e-b ── gb net1 (idle: keeps br-ext up)
 *
 * Asserted: the router's FIB holds each EIP/32 via A while A is ready; real TCP from the client
 * through the routed EIP (DNAT to a VPC host), on every backend; no gratuitous ARP from A for its
 * EIPs; and (one backend: routing does not depend on it) the routes go within 1 s when A's net1
 * goes down, when A's readiness fails (its VPC interface gone) and when natgw is SIGKILLed
 * (withdrawal times printed), and a restarted A announces only once it is ready. With two
 * replicas the router spreads an EIP over both (ECMP) and keeps the survivor when one is killed.
 * An IPv6 EIP goes to the IPv6 peer as a /128 beside the IPv4 session.
 */
import type { ChildProcess } from 'node:child_process';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterEach, describe, expect, it } from 'vitest';
import { BACKENDS, isOneBackend } from '../helpers/backends.js';
import { HA_ADDR, HaTopology } from '../helpers/haTopology.js';
import { killTree, runProcess, spawnTracked, type ExecOptions, type ExecResult, type Topology } from '../helpers/netns.js';
import { waitFor } from '../helpers/poll.js';
import { request, startEchoServer } from '../helpers/traffic.js';
import { api, ok } from './daemon-util.js';
import { legacy, metric, startReplica, syncEnv, type Replicad } from './ha-util.js';

/** Routed: outside the external segment, reachable only through the BGP route. */
const EIP = '198.51.100.10';
/** On the segment: a gratuitous ARP for it would show in the capture (and route nothing: BGP's /32 wins). */
const EIP_SEG = '172.20.0.50';
const OWN_A = '172.20.0.11';
const OWN_B = '172.20.0.12';
const ROUTER = HA_ADDR.extGateway;
const CLIENT = { addr: '192.0.2.2', router: '192.0.2.1' };
const ASN = '65001';
const ROUTER_ASN = '65000';
const WITHDRAW_MAX_MS = 1000;
/** IPv6: the segment's prefix and a routed EIP outside it. */
const V6 = { router: 'fd00:20::1', ownA: 'fd00:20::11', eip: '2001:db8:100::10' };

const live: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of live.splice(0).reverse()) await c();
});

/** The upstream router's BIRD: a session per replica, BFD 100 ms × 3, every learned route into the kernel (ECMP). */
function routerConf(v6: boolean): string {
  const six = v6
    ? `protocol kernel { ipv6 { import none; export all; }; merge paths on; }
template bgp replica6 {
  local ${V6.router} as ${ROUTER_ASN};
  direct;
  bfd on;
  connect delay time 1;
  connect retry time 2;
  error wait time 1, 5;
  ipv6 { import all; export none; };
}
protocol bgp ga6 from replica6 { neighbor ${V6.ownA} as ${ASN}; }
`
    : '';
  return `log stderr all;
router id ${ROUTER};
protocol device {}
${six}protocol kernel { ipv4 { import none; export all; }; merge paths on; }
protocol bfd { interface "br-ext" { interval 100 ms; multiplier 3; }; }
template bgp replica {
  local ${ROUTER} as ${ROUTER_ASN};
  direct;
  bfd on;
  connect delay time 1;
  connect retry time 2;
  error wait time 1, 5;
  ipv4 { import all; export none; };
}
protocol bgp ga from replica { neighbor ${OWN_A} as ${ASN}; }
protocol bgp gb from replica { neighbor ${OWN_B} as ${ASN}; }
`;
}

interface Stand {
  readonly t: HaTopology;
  /** The traffic helpers' view: HaTopology's namespaces plus the client's ('cl'). */
  readonly traffic: Topology;
  readonly router: ChildProcess;
  /** What the router's BIRD logged (sessions and BFD going down, with their reasons). */
  routerLog(): string;
}

async function build(opts: { v6?: boolean } = {}): Promise<Stand> {
  const t = await HaTopology.create({ sharedExt: true });
  const cl = `${t.prefix}cl`;
  const dir = mkdtempSync(join(tmpdir(), `natgw-${t.prefix}rtr-`));
  const children = new Set<ChildProcess>();
  const cleanup = async () => {
    for (const c of children) killTree(c);
    await runProcess(['ip', 'netns', 'del', cl], process.env, { reject: false }, new Set());
    await t.cleanup();
    rmSync(dir, { recursive: true, force: true });
  };
  live.push(cleanup);
  process.once('exit', () => spawnSync('ip', ['netns', 'del', cl], { stdio: 'ignore' }));
  const sh = (argv: readonly string[]) => runProcess(argv, process.env, {}, new Set());
  await sh(['ip', 'netns', 'add', cl]);
  await sh(['ip', '-n', cl, 'link', 'set', 'lo', 'up']);
  await sh(['ip', '-n', cl, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'e-cl', 'netns', t.ns.ext]);
  await sh(['ip', '-n', cl, 'addr', 'add', `${CLIENT.addr}/24`, 'dev', 'eth0']);
  await sh(['ip', '-n', cl, 'link', 'set', 'eth0', 'up']);
  await sh(['ip', '-n', cl, 'route', 'add', 'default', 'via', CLIENT.router]);
  await sh(['ip', '-n', t.ns.ext, 'addr', 'add', `${CLIENT.router}/24`, 'dev', 'e-cl']);
  await sh(['ip', '-n', t.ns.ext, 'link', 'set', 'e-cl', 'up']);
  await t.exec('ext', ['sysctl', '-q', '-w', 'net.ipv4.ip_forward=1']);
  await sh(['ip', '-n', t.ns.ga, 'addr', 'add', `${OWN_A}/24`, 'dev', 'net1']);
  await sh(['ip', '-n', t.ns.gb, 'addr', 'add', `${OWN_B}/24`, 'dev', 'net1']);

  if (opts.v6) {
    // HaTopology turns IPv6 off: back on for the router's segment and A's net1.
    await t.exec('ext', ['sysctl', '-q', '-w', 'net.ipv6.conf.all.disable_ipv6=0', 'net.ipv6.conf.br-ext.disable_ipv6=0', 'net.ipv6.conf.all.forwarding=1']);
    await t.exec('ga', ['sysctl', '-q', '-w', 'net.ipv6.conf.all.disable_ipv6=0', 'net.ipv6.conf.net1.disable_ipv6=0']);
    await sh(['ip', '-n', t.ns.ext, 'addr', 'add', `${V6.router}/64`, 'dev', 'br-ext', 'nodad']);
    await sh(['ip', '-n', t.ns.ga, 'addr', 'add', `${V6.ownA}/64`, 'dev', 'net1', 'nodad']);
  }
  const conf = join(dir, 'bird.conf');
  writeFileSync(conf, routerConf(opts.v6 === true));
  const router = t.spawn('ext', ['bird', '-f', '-c', conf, '-s', join(dir, 'bird.ctl')]);
  let routerLog = '';
  router.stderr?.setEncoding('utf8').on('data', (d: string) => (routerLog += d));
  await waitFor(async () => (await t.exec('ext', ['birdc', '-s', join(dir, 'bird.ctl'), 'show', 'status'], { reject: false })).exitCode === 0, {
    what: `the router's BIRD to answer (${routerLog})`,
    timeoutMs: 10_000,
  });

  const traffic: Topology = {
    ...(t.traffic as object),
    exec: (ns: string, argv: readonly string[], opts: ExecOptions = {}): Promise<ExecResult> =>
      ns === 'cl' ? runProcess(['ip', 'netns', 'exec', cl, ...argv], { ...process.env, LC_ALL: 'C' }, opts, children) : t.exec(ns, argv, opts),
    spawn: (ns: string, argv: readonly string[]): ChildProcess =>
      ns === 'cl' ? spawnTracked(['ip', 'netns', 'exec', cl, ...argv], { ...process.env, LC_ALL: 'C' }, children) : t.spawn(ns, argv),
  } as unknown as Topology;
  return { t, traffic, router, routerLog: () => routerLog };
}

/** The next hops the router's kernel FIB holds for `eip`/32 (none: no route). */
async function fibVia(t: HaTopology, eip: string): Promise<string[]> {
  const v6 = eip.includes(':');
  const r = await t.exec('ext', ['ip', v6 ? '-6' : '-4', '-j', 'route', 'show', `${eip}/${v6 ? 128 : 32}`]);
  const routes = JSON.parse(r.stdout || '[]') as Array<{ gateway?: string; nexthops?: Array<{ gateway?: string }> }>;
  return routes.flatMap((x) => (x.nexthops ? x.nexthops.map((n) => n.gateway ?? '') : [x.gateway ?? ''])).filter(Boolean);
}

/** How long after `t0` the route to `eip` left the router's FIB (polled as fast as `ip` runs). */
async function withdrawnAfter(t: HaTopology, eip: string, t0: number, what: string): Promise<number> {
  await waitFor(async () => (await fibVia(t, eip)).length === 0, {
    what: `${eip} withdrawn from the router's FIB (${what})`,
    timeoutMs: 10_000,
    intervalMs: 5,
  });
  return Date.now() - t0;
}

async function announcedVia(t: HaTopology, eip: string, via: string, what: string, timeoutMs = 30_000): Promise<void> {
  await waitFor(async () => (await fibVia(t, eip)).includes(via), { what: `${eip} via ${via} in the router's FIB (${what})`, timeoutMs });
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
async function bgpStatus(t: HaTopology): Promise<any> {
  return ok(await api(t.socket('ga'), 'GET', '/v1/bgp'), 'GET /v1/bgp').body;
}

function bgpEnv(b: { env: Readonly<Record<string, string>> }, extra: Record<string, string> = {}): Record<string, string> {
  return {
    ...b.env,
    NATGW_BGP_PEERS: ROUTER,
    NATGW_BGP_ASN: ASN,
    NATGW_BGP_PEER_ASN: ROUTER_ASN,
    NATGW_BFD_INTERVAL: '100ms',
    NATGW_BFD_MULTIPLIER: '3',
    NATGW_RESYNC_PERIOD: '5s',
    ...extra,
  };
}

/** What A sends onto the segment (ext's end of A's link, inbound), ARP only. */
async function captureArp(t: HaTopology): Promise<string[]> {
  const child = t.spawn('ext', ['tcpdump', '-i', 'e-a', '-Q', 'in', '-n', '-l', 'arp']);
  const lines: string[] = [];
  createInterface({ input: child.stdout! }).on('line', (l) => lines.push(l));
  let err = '';
  child.stderr?.setEncoding('utf8').on('data', (d: string) => (err += d));
  await waitFor(async () => err.includes('listening on'), { what: `tcpdump on e-a to listen (${err})`, timeoutMs: 10_000 });
  return lines;
}

const garpFor = (ip: string) => {
  const e = ip.replaceAll('.', '\\.');
  return new RegExp(`who-has ${e} (\\([^)]*\\) )?tell ${e},|Reply ${e} is-at`);
};

/**
 * A TCP request from the client through the routed EIP (DNAT to vpc1). On a machine this loaded
 * a BFD session at 100 ms × 3 can flap (a daemon starved for 300 ms): the request is retried
 * for a while, a retry is printed with the router's log, and a failure carries it.
 */
async function throughEip(st: Stand): Promise<string> {
  let tries = 0;
  let last = '';
  try {
    return await waitFor(
      async () => {
        tries++;
        try {
          return await request(st.traffic, 'cl', 'tcp', EIP, 8080);
        } catch (e) {
          last = (e as Error).message;
          if (tries === 2) console.log(`[bgp] TCP through the EIP retried (${last}); router's BIRD:\n${st.routerLog().slice(-1500)}`);
          throw e;
        }
      },
      { what: 'TCP through the routed EIP', timeoutMs: 10_000, intervalMs: 200 },
    );
  } catch (e) {
    throw new Error(`${(e as Error).message}: ${last}\nrouter FIB: ${(await fibVia(st.t, EIP)).join(',')}\nrouter's BIRD:\n${st.routerLog().slice(-3000)}`);
  }
}

async function rename(t: HaTopology, from: string, to: string, up: boolean): Promise<void> {
  await t.exec('ga', ['ip', 'link', 'set', from, 'down']);
  await t.exec('ga', ['ip', 'link', 'set', from, 'name', to]);
  if (up) await t.exec('ga', ['ip', 'link', 'set', to, 'up']);
}

describe.each(BACKENDS)('EIPs announced by BGP ($name)', (b) => {
  it('the router routes each EIP/32 to the ready replica and TCP reaches the VPC through it; no gratuitous ARP; withdrawn within 1 s of net1 down, readiness lost or natgw killed; a restart announces only once ready', async () => {
    const st = await build();
    const { t, traffic } = st;
    const arp = await captureArp(t);
    // The router's BIRD may have resolved A already (its first connect attempts): forgotten, so
    // the capture's control below (A's ARP on the way to its session) cannot have happened unseen.
    await t.exec('ext', ['ip', 'neigh', 'flush', 'dev', 'br-ext']);
    await t.exec('ga', ['ip', 'neigh', 'flush', 'dev', 'net1']);
    let a: Replicad = await startReplica(t, 'ga', bgpEnv(b));
    await legacy(t, 'ga', 'init');
    await legacy(t, 'ga', 'eip-add', `${EIP}/32`);
    await legacy(t, 'ga', 'eip-add', `${EIP_SEG}/24`);
    await legacy(t, 'ga', 'dnat-add', `${EIP},8080,tcp,${HA_ADDR.vpc1},80`);
    const started = Date.now();
    for (const eip of [EIP, EIP_SEG]) await announcedVia(t, eip, OWN_A, 'A ready');
    console.log(`[bgp] ${b.name}: EIPs in the router's FIB ${Date.now() - started} ms after the last command`);
    expect(await fibVia(t, EIP)).toEqual([OWN_A]);

    // BIRD asks for the BFD session once BGP is established: it comes up a moment later.
    const s = await waitFor(
      async () => {
        const x = await bgpStatus(t);
        return x.sessions[0]?.bfd === 'Up' ? x : undefined;
      },
      { what: 'the BFD session up', timeoutMs: 10_000 },
    );
    expect(s).toMatchObject({ enabled: true, announcing: true, reasons: [], routerId: OWN_A, bird: { state: 'running' } });
    expect(s.sessions).toEqual([expect.objectContaining({ peer: ROUTER, local: OWN_A, established: true, bfd: 'Up', exported: 2 })]);
    expect(s.eips).toEqual([
      { address: EIP_SEG, prefix: `${EIP_SEG}/32`, offered: true, advertised: true, peers: [ROUTER] },
      { address: EIP, prefix: `${EIP}/32`, offered: true, advertised: true, peers: [ROUTER] },
    ]);
    await waitFor(async () => (await metric(t, 'ga', 'natgw_bgp_eips_advertised')) === 2, { what: 'natgw_bgp_eips_advertised 2', timeoutMs: 5000 });
    expect(await metric(t, 'ga', 'natgw_bgp_sessions_up')).toBe(1);
    expect(await metric(t, 'ga', 'natgw_bgp_session_up', `peer="${ROUTER}"`)).toBe(1);
    expect(await metric(t, 'ga', 'natgw_bgp_announcing')).toBe(1);

    // Real TCP from the client behind the router, through the routed EIP, DNAT to vpc1.
    const echo = startEchoServer(traffic, 'vpc1', 80);
    await echo.ready;
    expect(await throughEip(st)).toMatch(new RegExp(`^peer=${CLIENT.addr.replaceAll('.', '\\.')}:`));

    // Routed EIPs are never ARPed by natgw: not at init, not at eip-add (arping would have sent by now).
    // The control: the capture does see A's ARP (for its own address, on the way to the BGP session).
    expect(
      arp.some((l) => l.includes(OWN_A)),
      arp.join('\n'),
    ).toBe(true);
    expect(arp.filter((l) => garpFor(EIP_SEG).test(l) || garpFor(EIP).test(l))).toEqual([]);
    if (!isOneBackend(b)) return;

    // net1 down: A's link is gone, the router's bridge stays up; BFD withdraws.
    let t0 = Date.now();
    await t.exec('ga', ['ip', 'link', 'set', 'net1', 'down']);
    const linkMs = await withdrawnAfter(t, EIP, t0, 'net1 down');
    await t.exec('ga', ['ip', 'link', 'set', 'net1', 'up']);
    await announcedVia(t, EIP, OWN_A, 'net1 up again');
    expect(await throughEip(st)).toMatch(/^peer=/);
    // A link coming up is the other moment a gateway would announce: still no ARP for routed EIPs.
    expect(arp.filter((l) => garpFor(EIP_SEG).test(l) || garpFor(EIP).test(l))).toEqual([]);

    // Readiness lost: the VPC interface disappears (renamed); the session stays, the routes go.
    t0 = Date.now();
    await rename(t, 'eth0', 'eth0x', false);
    const readyMs = await withdrawnAfter(t, EIP, t0, 'not ready');
    const down = await waitFor(
      async () => {
        const x = await bgpStatus(t);
        return x.announcing === false && x.eips.every((e: { advertised: boolean }) => !e.advertised) ? x : undefined;
      },
      { what: 'GET /v1/bgp to say the EIPs are withdrawn and advertised to no peer', timeoutMs: 5000 },
    );
    expect(down.reasons.join('\n')).toMatch(/not ready: waiting for interface\(s\) eth0/);
    expect(down.sessions[0]).toMatchObject({ established: true });
    await rename(t, 'eth0x', 'eth0', true);
    await announcedVia(t, EIP, OWN_A, 'ready again');

    // natgw SIGKILLed: its BIRD dies with it (pdeathsig), the session closes, the routes go.
    const birdPid = (await bgpStatus(t)).bird.pid as number;
    t0 = Date.now();
    process.kill(a.child.pid as number, 'SIGKILL');
    const killMs = await withdrawnAfter(t, EIP, t0, 'natgw SIGKILLed');
    await waitFor(async () => spawnSync('kill', ['-0', String(birdPid)]).status !== 0, { what: "natgw's BIRD gone with it", timeoutMs: 5000 });

    console.log(`[bgp] withdrawal after net1 down ${linkMs} ms, readiness lost ${readyMs} ms, natgw SIGKILLed ${killMs} ms (BFD detection 300 ms)`);
    expect(linkMs).toBeLessThan(WITHDRAW_MAX_MS);
    expect(readyMs).toBeLessThan(WITHDRAW_MAX_MS);
    expect(killMs).toBeLessThan(WITHDRAW_MAX_MS);

    // Restart while not ready (VPC interface missing): the session comes up, nothing is announced.
    await rename(t, 'eth0', 'eth0x', false);
    a = await startReplica(t, 'ga', bgpEnv(b, { NATGW_INTERFACE_WAIT_TIMEOUT: '1s' }));
    const up = await waitFor(
      async () => {
        const x = await bgpStatus(t);
        return x.sessions[0]?.established === true ? x : undefined;
      },
      { what: 'the restarted replica’s session established', timeoutMs: 30_000 },
    );
    expect(up.announcing).toBe(false);
    // Watched for a while with the session up: the router never learns the EIPs from a replica that is not ready.
    const until = Date.now() + 1500;
    while (Date.now() < until) expect(await fibVia(t, EIP)).toEqual([]);
    t0 = Date.now();
    await rename(t, 'eth0x', 'eth0', true);
    await announcedVia(t, EIP, OWN_A, 'the restarted replica ready');
    console.log(`[bgp] restarted replica announced ${Date.now() - t0} ms after it could become ready`);
    expect(await throughEip(st)).toMatch(/^peer=/);
    expect(a.logs()).not.toMatch(/"level":50/);
  });
});

describe.each(BACKENDS.filter(isOneBackend))('EIPs announced by two replicas ($name)', (b) => {
  it('the router spreads each EIP over both replicas (ECMP), keeps only the survivor within 1 s of the other being killed, and drops the survivor within 1 s of its stop', async () => {
    const { t } = await build();
    const replicas = { ga: await startReplica(t, 'ga', bgpEnv(b)), gb: await startReplica(t, 'gb', bgpEnv(b)) };
    for (const r of ['ga', 'gb'] as const) {
      await legacy(t, r, 'init');
      await legacy(t, r, 'eip-add', `${EIP}/32`);
    }
    await waitFor(async () => (await fibVia(t, EIP)).sort().join() === [OWN_A, OWN_B].join(), {
      what: `${EIP} via both replicas in the router's FIB`,
      timeoutMs: 30_000,
    });
    const t0 = Date.now();
    process.kill(replicas.ga.child.pid as number, 'SIGKILL');
    await waitFor(async () => (await fibVia(t, EIP)).join() === OWN_B, { what: `${EIP} via B only`, timeoutMs: 10_000, intervalMs: 5 });
    const ms = Date.now() - t0;
    console.log(`[bgp] ECMP: A SIGKILLed, the router's FIB kept only B after ${ms} ms`);
    expect(ms).toBeLessThan(WITHDRAW_MAX_MS);

    // B stopped the ordinary way (SIGTERM): BIRD tells the router it is going before natgw exits.
    const t1 = Date.now();
    process.kill(replicas.gb.child.pid as number, 'SIGTERM');
    const stopMs = await withdrawnAfter(t, EIP, t1, 'natgw stopped');
    console.log(`[bgp] B stopped (SIGTERM): withdrawn after ${stopMs} ms`);
    expect(stopMs).toBeLessThan(WITHDRAW_MAX_MS);
    await waitFor(async () => replicas.gb.child.exitCode !== null, { what: 'natgw on B to exit', timeoutMs: 10_000 });
    expect(replicas.gb.child.exitCode).toBe(0);
  });
});

describe.each(BACKENDS.filter(isOneBackend))('IPv6 EIPs announced by BGP ($name)', (b) => {
  it('an IPv6 EIP goes to the IPv6 peer as a /128 via A, beside the IPv4 one; deleting it withdraws it', async () => {
    const { t } = await build({ v6: true });
    await startReplica(t, 'ga', bgpEnv(b, { NATGW_BGP_PEERS: `${ROUTER},${V6.router}` }));
    await legacy(t, 'ga', 'init');
    await legacy(t, 'ga', 'eip-add', `${EIP}/32`);
    ok(await api(t.socket('ga'), 'PUT', `/v1/eips/${V6.eip}`, { prefixLength: 128 }), 'IPv6 EIP');
    await announcedVia(t, EIP, OWN_A, 'IPv4 session');
    await announcedVia(t, V6.eip, V6.ownA, 'IPv6 session');
    const s = await waitFor(
      async () => {
        const x = await bgpStatus(t);
        return x.eips.every((e: { advertised: boolean }) => e.advertised) ? x : undefined;
      },
      { what: 'both EIPs advertised in GET /v1/bgp', timeoutMs: 5000 },
    );
    expect(s.sessions.map((x: { peer: string; local: string; established: boolean }) => [x.peer, x.local, x.established])).toEqual([
      [ROUTER, OWN_A, true],
      [V6.router, V6.ownA, true],
    ]);
    expect(s.eips).toEqual([
      { address: EIP, prefix: `${EIP}/32`, offered: true, advertised: true, peers: [ROUTER] },
      { address: V6.eip, prefix: `${V6.eip}/128`, offered: true, advertised: true, peers: [V6.router] },
    ]);
    ok(await api(t.socket('ga'), 'DELETE', `/v1/eips/${V6.eip}`), 'delete the IPv6 EIP');
    await withdrawnAfter(t, V6.eip, Date.now(), 'IPv6 EIP deleted');
    expect(await fibVia(t, EIP)).toEqual([OWN_A]);
  });
});

describe.each(BACKENDS.filter(isOneBackend))('BGP in the takeover mode ($name)', (b) => {
  it('a standby keeps its session but announces nothing; a takeover announces at once', async () => {
    const { t } = await build();
    await startReplica(t, 'ga', bgpEnv(b, syncEnv('ga')));
    await legacy(t, 'ga', 'init');
    await legacy(t, 'ga', 'eip-add', `${EIP}/32`);
    const standby = await waitFor(
      async () => {
        const x = await bgpStatus(t);
        return x.sessions[0]?.established === true ? x : undefined;
      },
      { what: 'the standby’s session established', timeoutMs: 30_000 },
    );
    expect(standby.announcing).toBe(false);
    expect(standby.reasons.join('\n')).toMatch(/standby replica/);
    expect(await fibVia(t, EIP)).toEqual([]);
    const t0 = Date.now();
    ok(await api(t.socket('ga'), 'POST', '/v1/ha/takeover?reason=test'), 'takeover');
    await announcedVia(t, EIP, OWN_A, 'after the takeover', 10_000);
    const ms = Date.now() - t0;
    console.log(`[bgp] takeover: announced ${ms} ms after the call`);
    // Not the status poll's period (2 s): the takeover itself reloads BIRD.
    expect(ms).toBeLessThan(WITHDRAW_MAX_MS);
  });
});
