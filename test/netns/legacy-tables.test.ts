/**
 * iptables-legacy instantiates a table on first access, listing included. natgw asks the
 * kernel which legacy tables exist (/proc/net/ip*_tables_names) before listing one: a v4-only
 * gateway must not leave empty IPv6 nat and mangle tables behind (creating them is most of a
 * bulk apply's read-back), and a table that does exist is still read and repaired.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { parsePeer, request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';
const LEGACY = { GATEWAY_NETFILTER_MODE: 'iptables', NATGW_IPTABLES_VARIANT: 'legacy' };

const tableNames = async (topo: Topology, family: 4 | 6): Promise<string[]> =>
  (await topo.exec('gw', ['cat', `/proc/net/ip${family === 6 ? '6' : ''}_tables_names`])).stdout.split('\n').filter(Boolean);

describe('iptables-legacy: tables natgw does not need are not created', () => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let server: ServerHandle;

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, LEGACY);
    server = startServer(topo, 'vpc1', 'tcp', 80);
    await server.ready;
  });
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await server?.stop().catch(() => undefined);
    await topo?.cleanup();
  });

  it('a v4-only state is applied (real traffic) without creating IPv6 tables', async () => {
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    const sock = socketOf(topo);
    ok(
      await api(sock, 'PUT', '/v1/state', {
        initialized: true,
        interfaces: { vpc: 'eth0', ext: 'net1' },
        eips: [{ address: EIP, prefixLength: 24 }],
        dnats: [{ eip: EIP, port: 8080, protocol: 'tcp', internalIp: ADDR.vpc1, internalPort: 80 }],
      }),
      'PUT /v1/state',
    );
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    expect(await tableNames(topo, 4)).toEqual(expect.arrayContaining(['nat', 'mangle']));
    expect(await tableNames(topo, 6)).not.toContain('nat');
    expect(await tableNames(topo, 6)).not.toContain('mangle');
  });

  it('an IPv6 table that exists is still read: a leftover natgw chain in it is removed at the next start', async () => {
    if (daemon) await stopDaemon(daemon);
    daemon = undefined;
    await topo.exec('gw', ['ip6tables-legacy', '-t', 'nat', '-N', 'SHARED_SNAT']);
    expect(await tableNames(topo, 6)).toContain('nat');
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    const save = await topo.exec('gw', ['ip6tables-legacy-save', '-t', 'nat']);
    expect(save.stdout).not.toContain('SHARED_SNAT');
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
  });
});
