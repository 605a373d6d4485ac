/**
 * A replica taken from active-active back to takeover (keepalived) keeps no rule of the mode it
 * left: the drop of invalid packets in forward and input goes with the restart, on every backend,
 * and the NAT carries traffic throughout.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { parsePeer, request, startEchoServer, startLongFlow, startServer, type ServerHandle } from '../helpers/traffic.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';

describe.each(BACKENDS)('replica mode switch on $name', (b: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  const servers: ServerHandle[] = [];

  /** natgw's drop of invalid packets as the kernel holds it: its iptables chain and jumps, or nft's forward/input chains. */
  const dropInvalid = async (): Promise<string[]> => {
    if (b.iptablesVariant) {
      const save = await topo.iptablesSave('mangle', b.iptablesVariant);
      return save.split('\n').filter((l) => /NATGW_(DROP|INPUT)_INVALID/.test(l));
    }
    const r = await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'natgw'], { reject: false });
    return r.stdout.split('\n').filter((l) => /ct state invalid|hook (forward|input)/.test(l));
  };
  const snatWorks = async () => expect(parsePeer(await request(topo, 'vpc1', 'tcp', ADDR.extHost, 7001)).ip).toBe(EIP);

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, b.env, { GATEWAY_V4: ADDR.extGateway, NATGW_RESYNC_PERIOD: '1h' });
    servers.push(startServer(topo, 'ext', 'tcp', 7001), startEchoServer(topo, 'ext', 7002));
    await Promise.all(servers.map((s) => s.ready));
  });
  afterEach(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    daemon = undefined;
  });
  afterAll(async () => {
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  });

  it('drops invalid packets while active-active, and no longer once back to takeover', async () => {
    // A peer that never answers: the NAT does not depend on replica sync.
    const activeActive = { NATGW_HA_MODE: 'active-active', NATGW_HA_PEERS: '10.99.0.2', NATGW_HA_SYNC_INTERFACE: 'eth0' };
    daemon = await startDaemon(topo, activeActive);
    const sock = socketOf(topo);
    const legacy = async (command: string, ...rules: string[]) => ok(await api(sock, 'POST', '/v1/legacy', { command, rules }), command);
    await legacy('init');
    await legacy('eip-add', `${EIP}/24`);
    await legacy('snat-add', `${EIP},${ADDR.vpcCidr}`);
    expect((await dropInvalid()).length, 'the drop of invalid packets while active-active').toBeGreaterThan(0);
    await snatWorks();

    // The replica's own connection (as BGP's, or a peer's API call) outlives the loss of its
    // conntrack entry (a peer's resend replaces entries): with loose pick-up off, each of its
    // later packets is invalid, and only those toward the replica's own sockets may pass.
    const loose = await topo.exec('gw', ['sysctl', '-n', 'net.netfilter.nf_conntrack_tcp_loose']);
    expect(loose.stdout.trim(), 'loose pick-up off (active-active)').toBe('0');
    const own = await startLongFlow(topo, 'gw', ADDR.extHost, 7002);
    try {
      expect(await own.check()).toBe(true);
      const del = await topo.exec('gw', ['conntrack', '-D', '-p', 'tcp', '--dport', '7002'], { reject: false });
      expect(del.stderr, 'the entry deleted').toMatch(/1 flow entries have been deleted/);
      expect(await own.check(), "the replica's own connection after its entry is gone").toBe(true);
    } finally {
      await own.close();
    }
    await stopDaemon(daemon, 'SIGTERM');

    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    expect(await dropInvalid()).toEqual([]);
    await snatWorks();
  });
});
