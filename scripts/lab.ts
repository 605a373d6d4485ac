/**
 * The lab: natgw's main job, for real. Builds gateway, VPC and external network namespaces
 * joined by veths, programs the gateway through the command shim (exactly as the Kube-OVN
 * controller does), sends real TCP, UDP and ICMP through it, prints what was verified, and
 * cleans up — for each backend. Run as root: `npm run lab`.
 */
import { pathToFileURL } from 'node:url';
import { ADDR, createTopology, type ExecResult, type Topology } from '../test/helpers/netns.js';
import { parsePeer, ping, request, startServer, type ServerHandle } from '../test/helpers/traffic.js';

const EIP = '172.20.0.10';
const FIP = '172.20.0.11';

/**
 * How the lab runs `nat-gateway.sh <command> [rule]` in the gateway namespace: the checkout's
 * shim by default; the image lab (scripts/imageLab.ts) runs the image's own.
 */
export interface NatgwRunner {
  /** Called once the topology exists, before the first command. */
  setup?(topo: Topology): Promise<void>;
  run(topo: Topology, command: string, ...rules: string[]): Promise<ExecResult>;
  /** Called before the topology is removed, whether the lab passed or not. */
  teardown?(topo: Topology): Promise<void>;
}

const checkoutShim: NatgwRunner = { run: (topo, command, ...rules) => topo.natgw(command, ...rules) };

export interface Check {
  readonly what: string;
  readonly ok: boolean;
  readonly detail: string;
}

export async function labFor(mode: 'iptables' | 'nftables', runner: NatgwRunner = checkoutShim): Promise<Check[]> {
  const topo: Topology = await createTopology({ lateExternal: true });
  const servers: ServerHandle[] = [];
  const checks: Check[] = [];
  const check = (what: string, ok: boolean, detail: string) => checks.push({ what, ok, detail });
  try {
    Object.assign(topo.env, { GATEWAY_NETFILTER_MODE: mode, GATEWAY_V4: ADDR.extGateway });
    await runner.setup?.(topo);
    // Multus attaches net1 late: init starts first and waits for it.
    const init = runner.run(topo, 'init');
    setTimeout(() => void topo.attachExternal(), 1000);
    const r = await init;
    check('init waits for a late net1', r.exitCode === 0 && r.stderr === '', r.stdout.trim().split('\n').join(' | '));

    for (const [cmd, rule] of [
      ['eip-add', `${EIP}/24`],
      ['eip-add', `${FIP}/24`],
      ['snat-add', `${EIP},${ADDR.vpcCidr}`],
      ['dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`],
      ['dnat-add', `${EIP},5353,udp,${ADDR.vpc1},53`],
      ['dnat-add', `${EIP},8082,tcp,${ADDR.vpc2},9000`],
      ['floating-ip-add', `${FIP},${ADDR.vpc2}`],
      ['subnet-route-add', `${ADDR.sub2Cidr},${ADDR.rtr}`],
      ['snat-add', `${EIP},${ADDR.sub2Cidr}`],
      ['nft-dnat-map-add', `${EIP},9090,tcp,${ADDR.vpc1}:81@${ADDR.vpc2}:81`],
    ] as const) {
      const res = await runner.run(topo, cmd, rule);
      check(`${cmd} ${rule}`, res.exitCode === 0 && res.stderr === '', `exit ${res.exitCode}${res.stderr ? `, stderr: ${res.stderr.trim()}` : ''}`);
    }

    for (const [ns, proto, port] of [
      ['ext', 'tcp', 7001],
      ['vpc1', 'tcp', 80],
      ['vpc1', 'udp', 53],
      ['vpc2', 'tcp', 9000],
      ['vpc1', 'tcp', 81],
      ['vpc2', 'tcp', 81],
      ['sub2', 'tcp', 7002],
    ] as const) {
      const s = startServer(topo, ns, proto, port);
      servers.push(s);
      await s.ready;
    }
    const seen = async (fn: () => Promise<string>) =>
      fn().then(
        (l) => parsePeer(l).ip,
        (e: Error) => `failed: ${e.message}`,
      );

    let ip = await seen(() => request(topo, 'vpc1', 'tcp', ADDR.extHost, 7001));
    check('SNAT (TCP): the external host sees vpc1 as the EIP', ip === EIP, `source seen: ${ip}`);
    check('SNAT (ICMP): vpc1 pings the external host', await ping(topo, 'vpc1', ADDR.extHost), 'ping -c 1');
    ip = await seen(() => request(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost }));
    check(`DNAT (TCP): external → ${EIP}:8080 reaches vpc1:80`, ip === ADDR.extHost, `server saw ${ip}`);
    ip = await seen(() => request(topo, 'ext', 'udp', EIP, 5353, { localAddress: ADDR.extHost }));
    check(`DNAT (UDP): external → ${EIP}:5353 reaches vpc1:53`, ip === ADDR.extHost, `server saw ${ip}`);
    ip = await seen(() => request(topo, 'ext', 'tcp', FIP, 9000, { localAddress: ADDR.extHost }));
    check(`FIP inbound: external → ${FIP} reaches vpc2`, ip === ADDR.extHost, `server saw ${ip}`);
    ip = await seen(() => request(topo, 'vpc2', 'tcp', ADDR.extHost, 7001));
    check('FIP outbound: vpc2 is seen as its floating IP', ip === FIP, `source seen: ${ip}`);
    // vpc1 has no floating IP of its own (vpc2's would take precedence, as in the script).
    ip = await seen(() => request(topo, 'vpc1', 'tcp', EIP, 8082));
    check('hairpin: vpc1 → EIP:8082 → vpc2 sees the EIP', ip === EIP, `server saw ${ip}`);
    ip = await seen(() => request(topo, 'sub2', 'tcp', ADDR.extHost, 7001));
    check('subnet route: the second VPC subnet reaches out through SNAT', ip === EIP, `source seen: ${ip}`);
    let answered = 0;
    for (let i = 0; i < 20; i++) {
      if (
        await request(topo, 'ext', 'tcp', EIP, 9090, { localAddress: ADDR.extHost }).then(
          () => true,
          () => false,
        )
      )
        answered++;
    }
    // Which backend took each connection: the reply source of its conntrack entry.
    const ct = await topo.exec('gw', ['conntrack', '-L', '-p', 'tcp', '--orig-dst', EIP, '--orig-port-dst', '9090'], { reject: false });
    const backends = new Map<string, number>();
    for (const line of ct.stdout.split('\n')) {
      const reply = [...line.matchAll(/src=(\S+)/g)][1]?.[1];
      if (reply) backends.set(reply, (backends.get(reply) ?? 0) + 1);
    }
    const spread = [...backends].map(([b, n]) => `${b}: ${n}`).join(', ');
    check('share DNAT: 20 connections to EIP:9090 spread over both backends', answered === 20 && backends.size === 2, `${answered}/20 answered; ${spread}`);
  } finally {
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await runner.teardown?.(topo).catch((e: unknown) => check('runner teardown', false, String(e)));
    await topo.cleanup();
  }
  return checks;
}

/** Both backends through `runner`; prints every check and returns how many failed. */
export async function runLab(runner: NatgwRunner = checkoutShim, title = 'natgw lab'): Promise<number> {
  let failed = 0;
  for (const mode of ['iptables', 'nftables'] as const) {
    console.log(`\n${title} — backend: ${mode}`);
    for (const c of await labFor(mode, runner)) {
      console.log(`  ${c.ok ? '✓' : '✗'} ${c.what}  (${c.detail})`);
      if (!c.ok) failed++;
    }
  }
  return failed;
}

async function main(): Promise<number> {
  const failed = await runLab();
  console.log(failed === 0 ? '\nall checks passed; namespaces removed' : `\n${failed} check(s) FAILED; namespaces removed`);
  return failed === 0 ? 0 : 1;
}

// Imported by the image lab, run by `npm run lab`.
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href)
  main().then(
    (code) => process.exit(code),
    (e: unknown) => {
      console.error(e);
      process.exit(1);
    },
  );
