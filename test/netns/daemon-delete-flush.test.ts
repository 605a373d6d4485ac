/**
 * A delete through a running daemon (a partial sync) has flushed the old translation's
 * conntrack entries by the time the command answers, on every backend.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { conntrackCount, parsePeer, request, startServer, tryRequest, type ServerHandle } from '../helpers/traffic.js';
import { startDaemon, stopDaemon, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';
const EIP2 = '172.20.0.11';

describe.each(BACKENDS)('delete through the daemon on $name', (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  const servers: ServerHandle[] = [];

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env, { GATEWAY_V4: ADDR.extGateway });
    daemon = await startDaemon(topo);
    for (const [ns, proto, port] of [
      ['vpc1', 'udp', 53],
      ['vpc2', 'udp', 54],
    ] as const) {
      const s = startServer(topo, ns, proto, port);
      servers.push(s);
      await s.ready;
    }
  }, 60_000);

  afterAll(async () => {
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    if (daemon) await stopDaemon(daemon).catch(() => undefined);
    await topo?.cleanup();
  }, 60_000);

  it('dnat-del and floating-ip-del answer with the old translations flushed', async () => {
    await topo.natgwOk('init');
    await topo.natgwOk('eip-add', `${EIP}/24`, `${EIP2}/24`);
    // Both after the daemon's first command: partial syncs.
    await topo.natgwOk('dnat-add', `${EIP},5353,udp,${ADDR.vpc1},53`);
    await topo.natgwOk('floating-ip-add', `${EIP2},${ADDR.vpc2}`);
    expect(parsePeer(await request(topo, 'ext', 'udp', EIP, 5353, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    expect(parsePeer(await request(topo, 'ext', 'udp', EIP2, 54, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    expect(await conntrackCount(topo, ['-p', 'udp', '--orig-dst', EIP, '--orig-port-dst', '5353'])).toBeGreaterThan(0);
    expect(await conntrackCount(topo, ['--orig-dst', EIP2])).toBeGreaterThan(0);

    await topo.natgwOk('dnat-del', `${EIP},5353,udp`);
    // No polling: the command's answer comes after the flush.
    expect(await conntrackCount(topo, ['-p', 'udp', '--orig-dst', EIP, '--orig-port-dst', '5353'])).toBe(0);
    await topo.natgwOk('floating-ip-del', EIP2);
    expect(await conntrackCount(topo, ['--orig-dst', EIP2])).toBe(0);
    expect(await tryRequest(topo, 'ext', 'udp', EIP, 5353, { localAddress: ADDR.extHost, timeoutMs: 1000 })).toBeNull();
    expect(await tryRequest(topo, 'ext', 'udp', EIP2, 54, { localAddress: ADDR.extHost, timeoutMs: 1000 })).toBeNull();
  }, 60_000);
});
