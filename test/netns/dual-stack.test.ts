/**
 * SPEC §3.5: through the HTTP API, EIPs, SNAT, DNAT and floating IPs may be IPv6 — for every
 * backend, with real TCP through the gateway (nft family ip6, or ip6tables) — and so are
 * hairpin, port-range DNAT and SNAT pools, as for IPv4.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { manyConnections, parseLocal, parsePeer, request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const VPC6 = { gw: 'fd00:1::1', vpc1: 'fd00:1::6', vpc2: 'fd00:1::7' };
const EIP6 = 'fd00:20::10';
const FIP6 = 'fd00:20::11';
const EXT_HOST6 = 'fd00:20::100';
const POOL6 = 'fd00:20::12';
const RANGE_PORTS = [9100, 9150, 9200] as const;

describe.each(BACKENDS)('IPv6 through the API on $name', (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  const servers: ServerHandle[] = [];
  let sock: string;

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env, { GATEWAY_V6: ADDR.extGatewayV6 });
    sock = socketOf(topo);
    // The VPC side gets IPv6 too; forwarding is the pod's business (like ip_forward for v4).
    await topo.exec('gw', ['sysctl', '-qw', 'net.ipv6.conf.all.forwarding=1']);
    await topo.exec('gw', ['ip', '-6', 'addr', 'add', `${VPC6.gw}/64`, 'dev', 'eth0', 'nodad']);
    for (const h of ['vpc1', 'vpc2'] as const) {
      await topo.exec(h, ['ip', '-6', 'addr', 'add', `${VPC6[h]}/64`, 'dev', 'eth0', 'nodad']);
      await topo.exec(h, ['ip', '-6', 'route', 'replace', 'default', 'via', VPC6.gw]);
    }
    await topo.exec('ext', ['ip', '-6', 'addr', 'add', `${EXT_HOST6}/64`, 'dev', 'e0', 'nodad']);
    for (const [ns, port] of [['vpc1', 80], ['vpc2', 9000], ['ext', 7001], ...RANGE_PORTS.map((p) => ['vpc1', p] as const)] as const) {
      const s = startServer(topo, ns, 'tcp', port, '::', { reportLocal: true });
      servers.push(s);
      await s.ready;
    }
    await topo.natgwOk('init');
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
  });

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon).catch(() => undefined);
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  });

  it('puts IPv6 EIPs, SNAT, DNAT and a floating IP in place, and traffic flows', async () => {
    ok(await api(sock, 'PUT', `/v1/eips/${EIP6}`, { prefixLength: 64 }), 'eip');
    ok(await api(sock, 'PUT', `/v1/eips/${FIP6}`, { prefixLength: 64 }), 'fip eip');
    ok(await api(sock, 'PUT', `/v1/snats/${EIP6},${encodeURIComponent('fd00:1::/64')}`, {}), 'snat');
    ok(await api(sock, 'PUT', `/v1/dnats/${EIP6},8080,tcp`, { internalIp: VPC6.vpc1, internalPort: 80 }), 'dnat');
    ok(await api(sock, 'PUT', `/v1/fips/${FIP6}`, { internalIp: VPC6.vpc2 }), 'fip');

    expect(parsePeer(await request(topo, 'vpc1', 'tcp', EXT_HOST6, 7001)).ip).toBe(EIP6);
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP6, 8080, { localAddress: EXT_HOST6 })).ip).toBe(EXT_HOST6);
    expect(parsePeer(await request(topo, 'ext', 'tcp', FIP6, 9000, { localAddress: EXT_HOST6 })).ip).toBe(EXT_HOST6);
    expect(parsePeer(await request(topo, 'vpc2', 'tcp', EXT_HOST6, 7001)).ip).toBe(FIP6);

    const route = await topo.exec('gw', ['ip', '-6', 'route', 'show', 'default']);
    expect(route.stdout).toContain(`default via ${ADDR.extGatewayV6} dev net1`);
    if (backend.iptablesVariant) {
      const save = await topo.exec('gw', [`ip6tables-${backend.iptablesVariant}-save`, '-t', 'nat']);
      expect(save.stdout).toContain(`-A SHARED_DNAT -d ${EIP6}/128 -p tcp -m tcp --dport 8080 -j DNAT --to-destination [${VPC6.vpc1}]:80`);
    } else {
      expect((await topo.exec('gw', ['nft', 'list', 'table', 'ip6', 'natgw'])).stdout).toContain(EIP6);
    }
    // IPv4 commands through the shim work beside the IPv6 objects.
    await topo.natgwOk('eip-add', '172.20.0.10/24');
    await topo.natgwOk('snat-add', `172.20.0.10,${ADDR.vpcCidr}`);
    expect(parsePeer(await request(topo, 'vpc1', 'tcp', ADDR.extHost, 7001)).ip).toBe('172.20.0.10');
  });

  it('hairpin, a port range and a two-EIP SNAT pool work in IPv6 as in IPv4', async () => {
    // Hairpin: a VPC host reaching another through the EIP is seen as the EIP.
    ok(await api(sock, 'PUT', `/v1/dnats/${EIP6},8082,tcp`, { internalIp: VPC6.vpc2, internalPort: 9000 }), 'hairpin dnat');
    expect(parsePeer(await request(topo, 'vpc1', 'tcp', EIP6, 8082)).ip).toBe(EIP6);

    // A port range: each of its ports reaches the same port inside.
    ok(await api(sock, 'PUT', `/v1/dnats/${EIP6},9100-9200,tcp`, { internalIp: VPC6.vpc1, internalPort: 9100 }), 'range dnat');
    for (const port of RANGE_PORTS) {
      const answer = await request(topo, 'ext', 'tcp', EIP6, port, { localAddress: EXT_HOST6 });
      expect(parsePeer(answer).ip).toBe(EXT_HOST6);
      expect(parseLocal(answer)).toEqual({ ip: VPC6.vpc1, port });
    }

    // A pool: many short connections all succeed, and the server sees both EIPs.
    ok(await api(sock, 'PUT', `/v1/eips/${POOL6}`, { prefixLength: 64 }), 'pool eip');
    // The SNAT exists (one EIP): another pool for the same identity is a replace, as in IPv4.
    const pool = ok(
      await api(sock, 'PUT', `/v1/snats/${EIP6},${encodeURIComponent('fd00:1::/64')}?replace=true`, { eips: [EIP6, POOL6], randomFully: true }),
      'pool',
    );
    expect(pool.body.eips).toEqual([EIP6, POOL6]);
    const result = await manyConnections(topo, 'vpc1', EXT_HOST6, 7001, 400);
    expect(result.errors).toEqual([]);
    expect(result.failures).toBe(0);
    expect(Object.keys(result.sources).sort()).toEqual([EIP6, POOL6].sort());
    expect((result.sources[EIP6] ?? 0) + (result.sources[POOL6] ?? 0)).toBe(400);

    for (const path of [`/v1/dnats/${EIP6},8082,tcp`, `/v1/dnats/${EIP6},9100-9200,tcp`]) expect((await api(sock, 'DELETE', path)).status, path).toBe(204);
    ok(await api(sock, 'PUT', `/v1/snats/${EIP6},${encodeURIComponent('fd00:1::/64')}?replace=true`, {}), 'back to one EIP');
    expect((await api(sock, 'DELETE', `/v1/eips/${POOL6}`)).status).toBe(204);
  }, 120_000);

  it('removing the last IPv6 object removes the IPv6 skeleton', async () => {
    for (const path of [
      `/v1/fips/${FIP6}`,
      `/v1/dnats/${EIP6},8080,tcp`,
      `/v1/snats/${EIP6},${encodeURIComponent('fd00:1::/64')}`,
      `/v1/eips/${FIP6}`,
      `/v1/eips/${EIP6}`,
    ]) {
      expect((await api(sock, 'DELETE', path)).status, path).toBe(204);
    }
    if (backend.iptablesVariant) {
      const save = await topo.exec('gw', [`ip6tables-${backend.iptablesVariant}-save`, '-t', 'nat'], { reject: false });
      expect(save.stdout).not.toContain('SHARED_DNAT');
    } else {
      expect((await topo.exec('gw', ['nft', 'list', 'table', 'ip6', 'natgw'], { reject: false })).exitCode).not.toBe(0);
    }
  });
});
