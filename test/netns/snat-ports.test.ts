/**
 * SNAT port exhaustion seen before users feel it (issue 31), with real traffic on every backend:
 * one VPC host sends UDP flows to one server port through a one-EIP SNAT narrowed to ten source
 * ports until the kernel refuses. natgw's share of the range rises to 100 %, the status names the
 * destination, and the failure counter counts exactly the flows the client saw fail.
 *
 * natgw renders no port range on its SNAT rules, so the test narrows the kernel's choice itself:
 * a nat table of its own (not natgw's) translates vpc1's UDP to the EIP's ports 20000-20009 one
 * priority before natgw's SNAT (the first NAT chain to bind a connection wins), and the daemon
 * is told the range through NATGW_SNAT_PORT_RANGE, the denominator of the share.
 *
 * UDP first, where counts match flow for flow: each flow is one datagram from its own socket,
 * sent once. Then TCP, where a failed connect sends its SYN and retransmits it, each refused and
 * counted: the count matches the SYNs the client sent beyond one per connection that succeeded.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { startEchoServer, startServer, type ServerHandle } from '../helpers/traffic.js';
import { waitFor } from '../helpers/poll.js';
import { api, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';
const PORTS = { min: 20000, max: 20009 };
const RANGE = PORTS.max - PORTS.min + 1;
/** Flows beyond the range: each must fail. */
const EXTRA = 4;
const SERVER_PORT = 7002;
const OTHER_PORT = 7003;
const TCP_PORT = 7001;

/**
 * One client process: one UDP socket per flow, from its own source port, one datagram each, an
 * answer awaited up to `waitMs`, one flow after the other. Prints a JSON array: the server's
 * view of each flow's translated source (`peer=ip:port`), or null for no answer.
 */
const FLOWS_CLIENT = `
const dgram = require('node:dgram');
const [host, port, firstPort, count, waitMs] = process.argv.slice(1).map((v, i) => (i === 0 ? v : Number(v)));
const one = (localPort) => new Promise((resolve) => {
  const s = dgram.createSocket('udp4');
  const t = setTimeout(() => { s.close(); resolve(null); }, waitMs);
  s.on('message', (m) => { clearTimeout(t); s.close(); resolve(String(m).split('\\n')[0]); });
  s.on('error', (e) => { clearTimeout(t); process.stderr.write(String(e.code || e.message) + '\\n'); process.exit(1); });
  s.bind(localPort, () => s.send('hello\\n', port, host));
});
(async () => {
  const out = [];
  for (let i = 0; i < count; i++) out.push(await one(firstPort + i));
  process.stdout.write(JSON.stringify(out) + '\\n');
})();`;

/**
 * One client process: TCP connects one after the other to host:port, each kept open, each given
 * up by the kernel's own SYN retries (ETIMEDOUT). Prints a JSON array: the server's
 * `peer=ip:port` line per connection, or null for a connect that failed.
 */
const CONNECTS_CLIENT = `
const net = require('node:net');
const [host, port, count] = process.argv.slice(1).map((v, i) => (i === 0 ? v : Number(v)));
const held = [];
const one = () => new Promise((resolve) => {
  const s = net.connect({ host, port });
  let buf = '';
  s.setEncoding('utf8');
  s.on('data', (d) => { buf += d; const i = buf.indexOf('\\n'); if (i >= 0) { held.push(s); resolve(buf.slice(0, i)); } });
  s.on('error', (e) => resolve(e.code === 'ETIMEDOUT' ? null : 'error ' + e.code));
});
(async () => {
  const out = [];
  for (let i = 0; i < count; i++) out.push(await one());
  process.stdout.write(JSON.stringify(out) + '\\n');
  for (const s of held) s.destroy();
})();`;

async function udpFlows(topo: Topology, port: number, firstPort: number, count: number): Promise<(string | null)[]> {
  const r = await topo.exec('vpc1', [process.execPath, '-e', FLOWS_CLIENT, '--', ADDR.extHost, String(port), String(firstPort), String(count), '1500'], {
    timeoutMs: count * 1500 + 15_000,
  });
  return JSON.parse(r.stdout) as (string | null)[];
}

async function tcpConnects(topo: Topology, count: number): Promise<(string | null)[]> {
  const r = await topo.exec('vpc1', [process.execPath, '-e', CONNECTS_CLIENT, '--', ADDR.extHost, String(TCP_PORT), String(count)], { timeoutMs: 120_000 });
  return JSON.parse(r.stdout) as (string | null)[];
}

/** SYNs vpc1 sent to the TCP server: the counter of the test's own table in vpc1. */
async function synsSent(topo: Topology): Promise<number> {
  const r = await topo.exec('vpc1', ['nft', 'list', 'table', 'ip', 'natgw_test_syn']);
  return Number(/counter packets (\d+)/.exec(r.stdout)?.[1] ?? Number.NaN);
}

const metricsText = async (topo: Topology): Promise<string> => (await api(socketOf(topo), 'GET', '/metrics')).text;

function sample(text: string, name: string, labels: Record<string, string> = {}): number {
  const want = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  const line = text.split('\n').find((l) => (l.startsWith(`${name}{`) || l.startsWith(`${name} `)) && want.every((w) => l.includes(w)));
  return line ? Number(line.split(' ').at(-1)) : Number.NaN;
}

/** The kernel's own count, beside natgw's: `conntrack -S` insert_failed summed over CPUs. */
async function kernelInsertFailed(topo: Topology): Promise<number> {
  const r = await topo.exec('gw', ['conntrack', '-S']);
  return [...r.stdout.matchAll(/insert_failed=(\d+)/g)].reduce((n, m) => n + Number(m[1]), 0);
}

describe.each(BACKENDS)('SNAT port exhaustion on $name', (backend: BackendCase) => {
  let topo: Topology;
  let servers: ServerHandle[] = [];
  let daemon: Daemon | undefined;

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env);
    // Entries must outlive the test: the share is of connections still tracked.
    for (const k of ['udp_timeout', 'udp_timeout_stream']) await topo.exec('gw', ['sysctl', '-qw', `net.netfilter.nf_conntrack_${k}=600`]);
    servers = [
      startServer(topo, 'ext', 'udp', SERVER_PORT, ADDR.extHost),
      startServer(topo, 'ext', 'udp', OTHER_PORT, ADDR.extHost),
      // Answers at once and keeps the connection open: a closed one's port could be taken again.
      startEchoServer(topo, 'ext', TCP_PORT),
    ];
    await Promise.all(servers.map((s) => s.ready));
    await topo.natgwOk('init');
    await topo.natgwOk('eip-add', `${EIP}/24`);
    await topo.natgwOk('snat-add', `${EIP},${ADDR.vpcCidr}`);
    // The narrowed range: a table natgw does not own, in the gw namespace only (see above).
    await topo.exec('gw', ['nft', '-f', '-'], {
      input: [
        'table ip natgw_test_narrow {',
        '  chain postrouting {',
        '    type nat hook postrouting priority srcnat - 1; policy accept;',
        `    oifname "net1" ip saddr ${ADDR.vpc1} meta l4proto { tcp, udp } snat ip to ${EIP}:${PORTS.min}-${PORTS.max}`,
        '  }',
        '}',
        '',
      ].join('\n'),
    });
    daemon = await startDaemon(topo, { NATGW_SNAT_PORT_RANGE: `${PORTS.min}-${PORTS.max}` });
    await waitReady(topo, daemon);
    await waitFor(async () => sample(await metricsText(topo), 'natgw_conntrack_events_up') === 1, { what: 'the conntrack event follower to run' });
  });

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon).catch(() => undefined);
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  });

  it('the share rises to 100 %, the status names the destination, and the failures counted are the flows that failed', async () => {
    const before = await metricsText(topo);
    expect(sample(before, 'natgw_snat_port_range_size')).toBe(RANGE);
    const failuresBefore = sample(before, 'natgw_snat_port_allocation_failures_total');
    const kernelBefore = await kernelInsertFailed(topo);
    expect(failuresBefore).toBe(kernelBefore);

    // Half the range.
    const half = await udpFlows(topo, SERVER_PORT, 41000, RANGE / 2);
    expect(half.every((a) => a !== null)).toBe(true);
    await waitFor(async () => (await share(topo)) === 0.5, { what: `a share of 0.5 on ${EIP}`, timeoutMs: 15_000 });

    // The rest of the range, and beyond: the kernel refuses once no port is left.
    const rest = await udpFlows(topo, SERVER_PORT, 41000 + RANGE / 2, RANGE / 2 + EXTRA);
    const answers = [...half, ...rest];
    const ok = answers.filter((a): a is string => a !== null);
    const failed = answers.length - ok.length;
    expect(ok).toHaveLength(RANGE);
    expect(failed).toBe(EXTRA);
    // Every answered flow left from the EIP, each from its own port of the range.
    const ports = ok.map((a) => /^peer=([\d.]+):(\d+)$/.exec(a)!).map((m) => ({ ip: m[1], port: Number(m[2]) }));
    expect(new Set(ports.map((p) => p.ip))).toEqual(new Set([EIP]));
    expect(new Set(ports.map((p) => p.port)).size).toBe(RANGE);
    expect(ports.every((p) => p.port >= PORTS.min && p.port <= PORTS.max)).toBe(true);

    const text = await waitFor(
      async () => {
        const t = await metricsText(topo);
        return sample(t, 'natgw_snat_port_usage_ratio', { eip: EIP }) === 1 ? t : undefined;
      },
      { what: `a share of 1 on ${EIP}`, timeoutMs: 15_000 },
    );
    expect(sample(text, 'natgw_snat_ports_in_use_max', { eip: EIP })).toBe(RANGE);
    expect(sample(text, 'natgw_snat_destinations', { eip: EIP })).toBe(1);
    // Tolerance 0: each refused flow is one datagram, sent once, refused once at conntrack
    // confirmation; nothing else in the gateway's namespace fails to insert.
    const failures = sample(text, 'natgw_snat_port_allocation_failures_total') - failuresBefore;
    expect(failures).toBe(failed);
    expect((await kernelInsertFailed(topo)) - kernelBefore).toBe(failed);

    const status = await api(socketOf(topo), 'GET', '/v1/status');
    expect(status.status).toBe(200);
    const mine = (status.body.snatPorts as { eip: string }[]).find((u) => u.eip === EIP);
    expect(mine).toEqual({
      eip: EIP,
      destinations: 1,
      maxPorts: RANGE,
      maxShare: 1,
      top: [{ ip: ADDR.extHost, port: SERVER_PORT, protocol: 'udp', ports: RANGE, share: 1 }],
    });
  });

  it('ports are per destination: another server port still gets through, and freed ports are usable again', async () => {
    const [other] = await udpFlows(topo, OTHER_PORT, 42000, 1);
    expect(other).toMatch(new RegExp(`^peer=${EIP.replaceAll('.', '\\.')}:\\d+$`));
    const two = await waitFor(
      async () => {
        const t = await metricsText(topo);
        return sample(t, 'natgw_snat_destinations', { eip: EIP }) === 2 ? t : undefined;
      },
      { what: `two destinations on ${EIP}` },
    );
    expect(sample(two, 'natgw_snat_port_usage_ratio', { eip: EIP })).toBe(1);

    // The flows to the exhausted port end: the share falls and a new flow passes.
    await topo.exec('gw', ['conntrack', '-D', '-p', 'udp', '--orig-port-dst', String(SERVER_PORT)], { reject: false });
    await waitFor(async () => (await share(topo)) === 0.1, { what: `the share of the one flow left on ${EIP}`, timeoutMs: 15_000 });
    const [again] = await udpFlows(topo, SERVER_PORT, 43000, 1);
    expect(again).not.toBeNull();
  });

  it('TCP: connects beyond the range time out, and every SYN the kernel refused is counted', async () => {
    // Each failed connect sends a SYN and retransmits it (the kernel's tcp_syn_retries, kept
    // short here); every one is refused and counted. vpc1's own table counts the SYNs it sent.
    await topo.exec('vpc1', ['sysctl', '-qw', 'net.ipv4.tcp_syn_retries=1']);
    await topo.exec('vpc1', ['nft', '-f', '-'], {
      input: [
        'table ip natgw_test_syn {',
        '  chain output {',
        '    type filter hook output priority 0; policy accept;',
        `    ip daddr ${ADDR.extHost} tcp dport ${TCP_PORT} tcp flags & (syn | ack) == syn counter`,
        '  }',
        '}',
        '',
      ].join('\n'),
    });
    const failuresBefore = sample(await metricsText(topo), 'natgw_snat_port_allocation_failures_total');
    const answers = await tcpConnects(topo, RANGE + 2);
    const ok = answers.filter((a) => a?.startsWith('peer='));
    expect(ok).toHaveLength(RANGE);
    expect(answers.filter((a) => a === null)).toHaveLength(2);
    // A connect that succeeded sent one SYN; the rest went out for the two that failed.
    const refusedSyns = (await synsSent(topo)) - ok.length;
    expect(refusedSyns).toBeGreaterThanOrEqual(2 * 2);
    const text = await waitFor(
      async () => {
        const t = await metricsText(topo);
        return sample(t, 'natgw_snat_port_allocation_failures_total') - failuresBefore === refusedSyns ? t : undefined;
      },
      { what: `${refusedSyns} refused SYNs counted`, timeoutMs: 15_000 },
    );
    expect(sample(text, 'natgw_snat_port_usage_ratio', { eip: EIP })).toBe(1);
    console.log(`SNAT exhaustion over TCP on ${backend.name}: 2 connects failed, ${refusedSyns} SYNs refused and counted`);
    const status = await api(socketOf(topo), 'GET', '/v1/status');
    const mine = (status.body.snatPorts as { eip: string; top: { protocol: string; port: number }[] }[]).find((u) => u.eip === EIP)!;
    expect(mine.top.find((t) => t.protocol === 'tcp' && t.port === TCP_PORT)).toEqual({
      ip: ADDR.extHost,
      port: TCP_PORT,
      protocol: 'tcp',
      ports: RANGE,
      share: 1,
    });
  });
});

const share = async (topo: Topology) => sample(await metricsText(topo), 'natgw_snat_port_usage_ratio', { eip: EIP });
