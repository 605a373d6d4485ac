/**
 * Per-EIP packet/byte counters (SPEC §4.2 /metrics): real traffic through the gateway shows up
 * per EIP and direction, for every backend (the accounting table is nftables in both modes).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { waitFor } from '../helpers/poll.js';
import { api, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';
const IDLE = '172.20.0.11';

function metric(text: string, name: string, eip: string, direction: 'rx' | 'tx'): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes(`eip="${eip}"`) && l.includes(`direction="${direction}"`));
  return line ? Number(line.split(' ').at(-1)) : NaN;
}

describe.each(BACKENDS)('per-EIP counters on $name', (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  const servers: ServerHandle[] = [];

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env);
    for (const [ns, port] of [
      ['vpc1', 80],
      ['ext', 7001],
    ] as const) {
      const s = startServer(topo, ns, 'tcp', port);
      servers.push(s);
      await s.ready;
    }
    await topo.natgwOk('init');
    await topo.natgwOk('eip-add', `${EIP}/24`, `${IDLE}/24`);
    await topo.natgwOk('snat-add', `${EIP},${ADDR.vpcCidr}`);
    await topo.natgwOk('dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`);
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
  });

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon).catch(() => undefined);
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  });

  it('counts traffic to and from each EIP, and nothing for an idle one', async () => {
    await request(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost });
    await request(topo, 'vpc1', 'tcp', ADDR.extHost, 7001);
    const text = await waitFor(
      async () => {
        const t = (await api(socketOf(topo), 'GET', '/metrics')).text;
        return metric(t, 'natgw_eip_bytes', EIP, 'rx') > 0 && metric(t, 'natgw_eip_bytes', EIP, 'tx') > 0 ? t : undefined;
      },
      { what: 'rx and tx bytes for the busy EIP in /metrics', timeoutMs: 10_000 },
    );
    expect(metric(text, 'natgw_eip_packets', EIP, 'rx')).toBeGreaterThan(0);
    expect(metric(text, 'natgw_eip_packets', EIP, 'tx')).toBeGreaterThan(0);
    expect(metric(text, 'natgw_eip_packets', IDLE, 'rx')).toBe(0);
  });

  it('follows the EIPs: a deleted EIP is no longer counted', async () => {
    await topo.natgwOk('eip-del', `${IDLE}/24`);
    const text = (await api(socketOf(topo), 'GET', '/metrics')).text;
    expect(metric(text, 'natgw_eip_packets', IDLE, 'rx')).toBeNaN();
    expect(metric(text, 'natgw_eip_packets', EIP, 'rx')).toBeGreaterThan(0);
  });
});
