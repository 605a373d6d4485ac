/**
 * Proves the netns harness itself: the topology comes up as documented, plain routed
 * and bridged traffic works without natgw, the traffic tools measure what they claim,
 * and cleanup leaves nothing behind, even when a test throws.
 */
import { existsSync, readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, listNamespaces, normalizeIptablesSave, withTopology, type Topology } from '../helpers/netns.js';
import { waitFor } from '../helpers/poll.js';
import {
  bulkTransfer,
  conntrackCount,
  parsePeer,
  ping,
  request,
  startEchoServer,
  startLongFlow,
  startServer,
  startSinkServer,
  tryRequest,
} from '../helpers/traffic.js';

const HOOK_TIMEOUT = 30_000;

/** Alive and not a zombie (an orphan's zombie may linger until the container's init reaps it). */
function isAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}

describe('netns topology', () => {
  let topo: Topology;
  beforeAll(async () => {
    topo = await createTopology();
  }, HOOK_TIMEOUT);
  afterAll(() => topo?.cleanup(), HOOK_TIMEOUT);

  it('creates every namespace under a unique prefix', async () => {
    expect(topo.prefix).toMatch(/^ng[0-9a-f]{5}-$/);
    expect((await listNamespaces(topo.prefix)).sort()).toEqual(Object.values(topo.ns).sort());
  });

  it('refuses to run anything outside its own namespaces', async () => {
    await expect(topo.exec('not-ours', ['true'])).rejects.toThrow(/does not belong/);
  });

  it('configures gw: eth0 addressed, net1 up without IPv4, forwarding on', async () => {
    expect(await topo.addresses('gw', 'eth0', 4)).toEqual([`${ADDR.gw}/24`]);
    expect(await topo.addresses('gw', 'net1', 4)).toEqual([]);
    const link = await topo.exec('gw', ['ip', '-j', 'link', 'show', 'dev', 'net1']);
    expect(JSON.parse(link.stdout)[0].flags).toContain('UP');
    const fwd = await topo.exec('gw', ['sysctl', '-n', 'net.ipv4.ip_forward']);
    expect(fwd.stdout.trim()).toBe('1');
  });

  it('puts the upstream gateway, the external host and the v6 gateway on ext', async () => {
    expect(await topo.addresses('ext', 'e0')).toEqual(expect.arrayContaining([`${ADDR.extGateway}/24`, `${ADDR.extHost}/24`, `${ADDR.extGatewayV6}/64`]));
    for (const addr of [ADDR.extGateway, ADDR.extHost, ADDR.extGatewayV6]) {
      expect(await ping(topo, 'ext', addr), addr).toBe(true);
    }
  });

  it('lets gw reach the VPC hosts over the bridge', async () => {
    expect(await ping(topo, 'gw', ADDR.vpc1)).toBe(true);
    expect(await ping(topo, 'gw', ADDR.vpc2)).toBe(true);
    expect(await ping(topo, 'vpc1', ADDR.gw)).toBe(true);
  });

  it('carries TCP and UDP between VPC hosts, and the server sees the real source', async () => {
    const tcp = startServer(topo, 'vpc2', 'tcp', 8080);
    const udp = startServer(topo, 'vpc2', 'udp', 5353);
    await Promise.all([tcp.ready, udp.ready]);
    try {
      expect(parsePeer(await request(topo, 'vpc1', 'tcp', ADDR.vpc2, 8080)).ip).toBe(ADDR.vpc1);
      expect(parsePeer(await request(topo, 'vpc1', 'udp', ADDR.vpc2, 5353)).ip).toBe(ADDR.vpc1);
      const pinned = await request(topo, 'vpc1', 'tcp', ADDR.vpc2, 8080, { localPort: 40123 });
      expect(parsePeer(pinned)).toEqual({ ip: ADDR.vpc1, port: 40123 });
    } finally {
      await Promise.all([tcp.stop(), udp.stop()]);
    }
    // Refused (TCP) and unanswered (UDP: the port-unreachable is not a reply) are "blocked"...
    expect(await tryRequest(topo, 'vpc1', 'tcp', ADDR.vpc2, 8080, { timeoutMs: 1000 })).toBeNull();
    expect(await tryRequest(topo, 'vpc1', 'udp', ADDR.vpc2, 5353, { timeoutMs: 1000 })).toBeNull();
    // ...a client that fails by itself (here: a source address that is not vpc1's) is not.
    await expect(tryRequest(topo, 'vpc1', 'tcp', ADDR.vpc2, 8080, { timeoutMs: 1000, localAddress: ADDR.vpc2 })).rejects.toThrow(
      /failed by itself.*EADDRNOTAVAIL/,
    );
  });

  it('routes the second subnet through rtr once gw has a route', async () => {
    expect(await ping(topo, 'sub2', ADDR.rtrSub2)).toBe(true);
    expect(await ping(topo, 'rtr', ADDR.gw)).toBe(true);
    // Without natgw's subnet-route-add, gw cannot answer sub2.
    expect(await ping(topo, 'gw', ADDR.sub2)).toBe(false);
    await topo.exec('gw', ['ip', 'route', 'add', ADDR.sub2Cidr, 'via', ADDR.rtr]);
    try {
      expect(await ping(topo, 'gw', ADDR.sub2)).toBe(true);
      expect(await ping(topo, 'sub2', ADDR.gw)).toBe(true);
    } finally {
      await topo.exec('gw', ['ip', 'route', 'del', ADDR.sub2Cidr, 'via', ADDR.rtr]);
    }
  });

  it('keeps the external network unreachable from the VPC until natgw sets it up', async () => {
    expect(await ping(topo, 'vpc1', ADDR.extHost)).toBe(false);
  });

  it('keeps a long-lived TCP flow open and echoes through the same connection', async () => {
    const echo = startEchoServer(topo, 'vpc2', 9000);
    await echo.ready;
    const flow = await startLongFlow(topo, 'vpc1', ADDR.vpc2, 9000);
    try {
      expect(parsePeer(flow.peer).ip).toBe(ADDR.vpc1);
      expect(await flow.check()).toBe(true);
      expect(await flow.check()).toBe(true);
      await echo.stop();
      // The server process is gone, so the kernel resets the connection.
      expect(await flow.check(1000)).toBe(false);
    } finally {
      await flow.close();
      await echo.stop();
    }
  });

  it('counts conntrack entries in gw', async () => {
    // Conntrack only tracks a namespace once some rule uses it: load one, scoped to this test.
    await topo.exec('gw', ['nft', '-f', '-'], {
      input: ['table inet harness {', '  chain input {', '    type filter hook input priority 0;', '    ct state new counter', '  }', '}', ''].join('\n'),
    });
    const server = startServer(topo, 'gw', 'tcp', 7070);
    try {
      await server.ready;
      expect(await conntrackCount(topo, ['-p', 'tcp', '--dport', '7070'])).toBe(0);
      await request(topo, 'vpc1', 'tcp', ADDR.gw, 7070);
      await waitFor(async () => (await conntrackCount(topo, ['-p', 'tcp', '--dport', '7070'])) >= 1, {
        what: 'a conntrack entry for the request',
        timeoutMs: 5000,
      });
    } finally {
      await server.stop();
      await topo.exec('gw', ['nft', 'delete', 'table', 'inet', 'harness']);
      await topo.exec('gw', ['conntrack', '-F'], { reject: false });
    }
  });

  it('measures bulk throughput at the sink', async () => {
    const sink = startSinkServer(topo, 'vpc2', 9100);
    await sink.ready;
    try {
      const r = await bulkTransfer(topo, 'vpc1', ADDR.vpc2, 9100, 4 * 1024 * 1024);
      expect(r.bytes).toBe(4 * 1024 * 1024);
      expect(r.elapsedMs).toBeGreaterThan(0);
      expect(r.bitsPerSecond).toBeGreaterThan(1_000_000);
    } finally {
      await sink.stop();
    }
  });

  it('dumps iptables without creating tables and normalises dumps', async () => {
    expect(await topo.iptablesSave('nat', 'legacy')).toBe('');
    const names = await topo.exec('gw', ['cat', '/proc/net/ip_tables_names']);
    expect(names.stdout).not.toMatch(/\bnat\b/);
    expect(await topo.iptablesSave('mangle', 'nft')).toBe('');

    await topo.exec('gw', ['iptables-nft', '-t', 'nat', '-A', 'POSTROUTING', '-s', ADDR.vpcCidr, '-j', 'MASQUERADE']);
    try {
      const dump = await topo.iptablesSave('nat', 'nft');
      expect(dump).toContain(`-A POSTROUTING -s ${ADDR.vpcCidr} -j MASQUERADE`);
      expect(dump).toContain(':POSTROUTING ACCEPT');
      expect(dump).not.toMatch(/^#|\[\d+:\d+\]/m);
    } finally {
      await topo.exec('gw', ['iptables-nft', '-t', 'nat', '-F']);
      await topo.exec('gw', ['nft', 'delete', 'table', 'ip', 'nat']);
    }
    expect(normalizeIptablesSave('# Generated\n*nat\n:INPUT ACCEPT [3:120]\n-A X -j Y\nCOMMIT\n# Completed\n')).toBe('*nat\n:INPUT ACCEPT\n-A X -j Y\nCOMMIT');
  });

  it('gives natgw an isolated environment with test overrides', () => {
    topo.env.GATEWAY_V4 = ADDR.extGateway;
    const env = topo.natgwEnv();
    expect(env.NATGW_STATE_DIR).toBe(topo.stateDir);
    expect(env.NATGW_ENV_FILE).toBe(`${topo.stateDir}/nat-gateway.env`);
    expect(env.NATGW_SOCKET).toBe(`${topo.stateDir}/natgw.sock`);
    expect(env.NATGW_AUTOSTART).toBe('false');
    expect(env.GATEWAY_V4).toBe(ADDR.extGateway);
    delete topo.env.GATEWAY_V4;
    expect(topo.natgwEnv().GATEWAY_V4).toBeUndefined();
    expect(existsSync(topo.stateDir)).toBe(true);
  });
});

describe('late external network', () => {
  let topo: Topology;
  beforeAll(async () => {
    topo = await createTopology({ lateExternal: true });
  }, HOOK_TIMEOUT);
  afterAll(() => topo?.cleanup(), HOOK_TIMEOUT);

  it('starts without net1 and attaches it on demand', async () => {
    expect(await topo.addresses('gw', 'net1')).toBeNull();
    expect(await topo.addresses('ext', 'e0')).toBeNull();
    await topo.attachExternal();
    expect(await topo.addresses('gw', 'net1', 4)).toEqual([]);
    expect(await topo.addresses('ext', 'e0', 4)).toEqual([`${ADDR.extGateway}/24`, `${ADDR.extHost}/24`]);
  });

  it('recreates net1 as a fresh link without addresses', async () => {
    await topo.exec('gw', ['ip', 'addr', 'add', '172.20.0.50/24', 'dev', 'net1']);
    expect(await ping(topo, 'gw', ADDR.extHost)).toBe(true);
    await topo.recreateExternal();
    expect(await topo.addresses('gw', 'net1', 4)).toEqual([]);
    expect(await ping(topo, 'gw', ADDR.extHost)).toBe(false);
    expect(await ping(topo, 'ext', ADDR.extGateway)).toBe(true);
  });
});

describe('cleanup', () => {
  it('removes every namespace, process and the state dir even when the test throws', async () => {
    let prefix = '';
    let stateDir = '';
    let orphanPid = 0;
    await expect(
      withTopology(async (topo) => {
        prefix = topo.prefix;
        stateDir = topo.stateDir;
        await startServer(topo, 'gw', 'tcp', 8080).ready;
        // A background process the harness never tracked (like a daemon natgw starts itself).
        const r = await topo.exec('vpc1', ['sh', '-c', 'sleep 1000 >/dev/null 2>&1 & echo $!']);
        orphanPid = Number(r.stdout.trim());
        expect(isAlive(orphanPid)).toBe(true);
        throw new Error('boom');
      }),
    ).rejects.toThrow('boom');

    expect(await listNamespaces(prefix)).toEqual([]);
    expect(existsSync(stateDir)).toBe(false);
    await waitFor(async () => !isAlive(orphanPid), { what: `untracked pid ${orphanPid} to die`, timeoutMs: 5000 });
  });

  it('is idempotent and makes the topology unusable', async () => {
    const topo = await createTopology({ lateExternal: true });
    await topo.cleanup();
    await topo.cleanup();
    expect(await listNamespaces(topo.prefix)).toEqual([]);
    await expect(topo.exec('gw', ['true'])).rejects.toThrow(/cleaned up/);
  });
});
