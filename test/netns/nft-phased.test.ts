/**
 * A bulk PUT /v1/state into a gateway whose nft tables are absent goes through the phased apply
 * (nft/phases.ts: create and declare, element groups by several `nft` at once, hooks last), on
 * the real kernel: TCP, UDP and ICMP through port DNAT, FIP and SNAT afterwards, and natgw's table
 * exactly what ONE `nft -f` of the dry-run script makes (modulo the order nft lists chains in).
 * A group the kernel refuses leaves no natgw table behind and the PUT answers the tool's error;
 * the same PUT then applies. A table someone created after natgw last looked makes the first
 * phase's `create table` fail, and that table is left as it was.
 *
 * nftables only: the iptables backend has no phased path.
 */
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { sortNftBlocks } from '../helpers/backends.js';
import { makeWrappers } from '../helpers/faults.js';
import { parsePeer, ping, request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { NetnsExecutor } from '../helpers/netnsExecutor.js';
import { NftBackend } from '../../src/dataplane/netfilter/nft/backend.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';
const FIP = '172.20.0.11';
/** Enough elements for the phased path (PHASING.minElements) beside the few that carry traffic. */
const FILL = 5000;

function bulkDoc(desired: Record<string, unknown>): Record<string, unknown> {
  const fillFip = (i: number) => ({
    eip: `172.21.${1 + Math.floor(i / 250)}.${1 + (i % 250)}`,
    internalIp: `10.3.${1 + Math.floor(i / 250)}.${1 + (i % 250)}`,
  });
  return {
    ...desired,
    initialized: true,
    eips: [EIP, FIP].map((address) => ({ address, prefixLength: 24 })),
    snats: [{ eip: EIP, cidr: ADDR.vpcCidr, randomFully: false }],
    dnats: [
      { eip: EIP, port: 8080, protocol: 'tcp', internalIp: ADDR.vpc1, internalPort: 80 },
      { eip: EIP, port: 5353, protocol: 'udp', internalIp: ADDR.vpc1, internalPort: 5353 },
      ...Array.from({ length: FILL }, (_, i) => ({ eip: EIP, port: 20000 + i, protocol: 'tcp', internalIp: '10.0.1.200', internalPort: 80 })),
    ],
    fips: [{ eip: FIP, internalIp: ADDR.vpc1 }, ...Array.from({ length: FILL }, (_, i) => fillFip(i))],
  };
}

async function natgwTable(topo: Topology): Promise<string | null> {
  const r = await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'natgw'], { reject: false });
  return r.exitCode === 0 ? sortNftBlocks(r.stdout) : null;
}

/** What one raw `nft -f` of `script` makes of natgw's table, in a namespace of its own (removed after). */
async function appliedAtOnce(script: string): Promise<string> {
  const ns = `natgw-phx-${randomBytes(4).toString('hex')}`;
  const add = spawnSync('ip', ['netns', 'add', ns], { encoding: 'utf8' });
  if (add.status !== 0) throw new Error(`ip netns add ${ns}: ${add.stderr}`);
  try {
    const exec = new NetnsExecutor(ns);
    // The dry run's script is every part's: nft's statements only (not the address and route lines).
    const nft = script.split('\n').filter((l) => /^(add|delete|flush|insert) (table|chain|map|set|element|rule) /.test(l));
    const r = await exec.run({ file: 'nft', args: ['-f', '-'], input: `${nft.join('\n')}\n` });
    if (r.exitCode !== 0) throw new Error(`nft -f - of the dry run's script: ${r.stderr}`);
    const listed = await exec.run({ file: 'nft', args: ['list', 'table', 'ip', 'natgw'] });
    if (listed.exitCode !== 0) throw new Error(`nft list table ip natgw: ${listed.stderr}`);
    return sortNftBlocks(listed.stdout);
  } finally {
    spawnSync('ip', ['netns', 'del', ns]);
  }
}

/** The daemon's debug lines with this message. */
function logged(text: string, msg: string): Array<Record<string, unknown>> {
  return text
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((j) => j.msg === msg);
}

/**
 * A gateway (nftables, debug log) whose servers are up and whose daemon is ready, for the
 * describe block that calls this; torn down after it. Read its fields inside the tests.
 */
function liveGateway(serversOf: (topo: Topology) => ServerHandle[]): { topo: Topology; daemon: Daemon; sock: string } {
  const g = {} as { topo: Topology; daemon: Daemon; sock: string };
  let servers: ServerHandle[] = [];
  beforeAll(async () => {
    g.topo = await createTopology();
    Object.assign(g.topo.env, { GATEWAY_NETFILTER_MODE: 'nftables', NATGW_RESYNC_PERIOD: '1h', NATGW_LOG_LEVEL: 'debug' });
    g.sock = socketOf(g.topo);
    servers = serversOf(g.topo);
    await Promise.all(servers.map((s) => s.ready));
    g.daemon = await startDaemon(g.topo);
    await waitReady(g.topo, g.daemon);
  }, 60_000);
  afterAll(async () => {
    if (g.daemon) await stopDaemon(g.daemon, 'SIGKILL');
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await g.topo?.cleanup();
  });
  return g;
}

describe('bulk PUT /v1/state into absent nft tables, applied in phases', () => {
  const g = liveGateway((topo) => [
    startServer(topo, 'vpc1', 'tcp', 80),
    startServer(topo, 'vpc1', 'udp', 5353),
    startServer(topo, 'ext', 'tcp', 9000, ADDR.extHost),
  ]);

  it('carries TCP, UDP and ICMP through DNAT, FIP and SNAT, and equals one nft -f of the dry run', async () => {
    const { desired } = ok(await api(g.sock, 'GET', '/v1/state'), 'GET /v1/state').body;
    expect(desired.initialized).toBe(false);
    const doc = bulkDoc(desired);
    const dry = ok(await api(g.sock, 'PUT', '/v1/state?dryRun=true', doc), 'dry run').body;
    const at = g.daemon.logs().length;
    ok(await api(g.sock, 'PUT', '/v1/state', doc), 'PUT /v1/state');
    const phased = logged(g.daemon.logs().slice(at), 'nft: absent tables applied in phases');
    expect(phased).toHaveLength(1);
    expect(phased[0]).toMatchObject({ path: 'phased' });
    expect(phased[0]?.elements).toBeGreaterThan(3 * FILL);
    expect(phased[0]?.groups).toBeGreaterThanOrEqual(2);

    expect(parsePeer(await request(g.topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    expect(parsePeer(await request(g.topo, 'ext', 'udp', EIP, 5353, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    expect(parsePeer(await request(g.topo, 'ext', 'tcp', FIP, 80, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    expect(await ping(g.topo, 'ext', FIP)).toBe(true);
    // vpc1 leaves as its FIP, vpc2 through the shared SNAT.
    expect(parsePeer(await request(g.topo, 'vpc1', 'tcp', ADDR.extHost, 9000)).ip).toBe(FIP);
    expect(parsePeer(await request(g.topo, 'vpc2', 'tcp', ADDR.extHost, 9000)).ip).toBe(EIP);

    const once = await appliedAtOnce(String(dry.script));
    expect(once).toContain('fip_dnat');
    expect(await natgwTable(g.topo)).toBe(once);
  }, 60_000);
});

describe('a phase the kernel refuses', () => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;
  let faults: ReturnType<typeof makeWrappers>;

  beforeAll(async () => {
    faults = makeWrappers();
    topo = await createTopology();
    Object.assign(topo.env, { GATEWAY_NETFILTER_MODE: 'nftables', NATGW_RESYNC_PERIOD: '1h', NATGW_LOG_LEVEL: 'debug' });
    sock = socketOf(topo);
    daemon = await startDaemon(topo, {
      PATH: `${faults.dir}:${process.env.PATH ?? ''}`,
      // The faults are injected into the nft tool: the daemon runs it instead of its libnftables helper.
      NATGW_LIBNFTABLES: 'off',
    });
    await waitReady(topo, daemon);
  }, 60_000);

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
    faults?.remove();
  });

  it('a refused group: no natgw table stays, the PUT answers the error; the same PUT then applies', async () => {
    const before = ok(await api(sock, 'GET', '/v1/state'), 'GET /v1/state').body;
    const doc = bulkDoc(before.desired);
    const at = daemon!.logs().length;
    // The element groups count 1 and 2 (one of them is refused), the full sync's retry from 3 on
    // (refused too); the first phase (no elements) and the delete that undoes it do not match.
    faults.arm('nft', 2, 'fail', '-f', '^add element ip natgw ');
    let r: Awaited<ReturnType<typeof api>>;
    try {
      r = await api(sock, 'PUT', '/v1/state', doc);
    } finally {
      faults.disarm();
    }
    expect(r.status, r.text).toBe(500);
    expect(r.body.message).toMatch(/injected fault/);
    expect(faults.fired().trim().split('\n').length).toBeGreaterThanOrEqual(2);
    expect(daemon!.logs().slice(at)).toMatch(/"msg":"partial sync refused; retrying once as a full sync"/);
    expect(await natgwTable(topo)).toBeNull();
    expect(ok(await api(sock, 'GET', '/v1/state'), 'GET /v1/state').body.digest).toBe(before.digest);

    ok(await api(sock, 'PUT', '/v1/state', doc), 'PUT /v1/state after the fault');
    expect(await natgwTable(topo)).toContain('172.21.20.250 : 10.3.20.250');
  }, 60_000);
});

describe('an accounting table someone created since natgw last changed anything (the daemon on the kernel)', () => {
  const g = liveGateway((topo) => [startServer(topo, 'vpc1', 'tcp', 80)]);

  it("the bulk change reads the accounting table, takes it over, and the table is natgw's", async () => {
    const { desired } = ok(await api(g.sock, 'GET', '/v1/state'), 'GET /v1/state').body;
    // natgw holds no accounting table; someone creates one with a chain of their own.
    expect((await g.topo.exec('gw', ['nft', 'list', 'table', 'inet', 'natgw_acct'], { reject: false })).exitCode).not.toBe(0);
    await g.topo.exec('gw', ['nft', '-f', '-'], { input: 'add table inet natgw_acct\nadd chain inet natgw_acct theirs\n' });
    const at = g.daemon.logs().length;
    ok(await api(g.sock, 'PUT', '/v1/state', bulkDoc(desired)), 'PUT /v1/state');
    // The accounting part reads its table at every change: the bulk change plans against it, not
    // against an earlier look, and is not refused.
    const logs = g.daemon.logs().slice(at);
    expect(logs).toMatch(/"cmd":"nft -j list table inet natgw_acct"[^\n]*"exitCode":0/);
    expect(logs).not.toMatch(/partial sync refused/);
    const acct = (await g.topo.exec('gw', ['nft', 'list', 'table', 'inet', 'natgw_acct'])).stdout;
    expect(acct).not.toContain('theirs');
    expect(acct).toMatch(new RegExp(`set eip_rx4 \\{[^}]*elements = \\{[^}]*${EIP.replace(/\./g, '\\.')}`));
    expect(parsePeer(await request(g.topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
  }, 60_000);
});

describe('a table someone created after natgw looked (the backend on the kernel)', () => {
  let topo: Topology;

  beforeAll(async () => {
    topo = await createTopology();
  }, 60_000);

  afterAll(async () => {
    await topo?.cleanup();
  });

  it('create table is refused and that table is left exactly as it was', async () => {
    const nft = new NftBackend(new NetnsExecutor(topo.ns.gw));
    await nft.observe();
    await topo.exec('gw', ['nft', '-f', '-'], { input: 'add table ip natgw\nadd chain ip natgw theirs\nadd rule ip natgw theirs counter\n' });
    const theirs = await natgwTable(topo);
    const fips = Array.from({ length: 2 * FILL }, (_, i) => ({
      eip: `172.21.${1 + Math.floor(i / 250)}.${1 + (i % 250)}`,
      internalIp: `10.3.${1 + Math.floor(i / 250)}.${1 + (i % 250)}`,
    }));
    await expect(nft.sync({ vpcIf: 'eth0', extIf: 'net1', eips: [EIP], snats: [], dnats: [], fips }, { mode: 'partial' })).rejects.toThrow(
      /first phase.*File exists/,
    );
    expect(await natgwTable(topo)).toBe(theirs);
  }, 60_000);
});
