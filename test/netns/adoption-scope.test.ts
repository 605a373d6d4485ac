/**
 * Adoption takes only what natgw owns (issue 12). With the state dir lost (a container
 * restart without a volume), an address on net1 is an EIP only when a hairpin rule names it —
 * the pod's own address from its network attachment is not — and a route on the VPC side is
 * natgw's only when `ip route replace` could have made it (protocol boot), not a static or
 * a routing daemon's route. What was not adopted is left exactly as it was.
 */
import { rmSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

describe.each(BACKENDS)('adoption scope ($name)', (b: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, b.env, { GATEWAY_V4: ADDR.extGateway, NATGW_RESYNC_PERIOD: '1h' });
    sock = socketOf(topo);
    // The pod's own address and a static route, there before natgw.
    await topo.exec('gw', ['ip', 'addr', 'add', '172.20.0.2/24', 'dev', 'net1']);
    await topo.exec('gw', ['ip', 'route', 'add', '10.0.9.0/24', 'via', ADDR.rtr, 'dev', 'eth0', 'proto', 'static']);
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    for (const [command, rule] of [
      ['init', ''],
      ['eip-add', '172.20.0.10/24'],
      ['subnet-route-add', `10.0.2.0/24,${ADDR.rtr}`],
    ] as const) {
      const r = ok(await api(sock, 'POST', '/v1/legacy', { command, rules: rule ? [rule] : [] }), command);
      expect(r.body.status, r.text).toBe(0);
    }
  }, 120_000);

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
  });

  it("adopts the EIP and natgw's route, not the pod's own address or the static route", async () => {
    await stopDaemon(daemon!, 'SIGKILL');
    daemon = undefined;
    for (const f of ['state.json', 'state.journal', 'owned.json', 'backend.json']) rmSync(`${topo.stateDir}/${f}`, { force: true });
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    const desired = (await api(sock, 'GET', '/v1/state')).body.desired;
    expect(desired.eips).toEqual([{ address: '172.20.0.10', prefixLength: 24 }]);
    expect(desired.routes).toEqual([{ cidr: '10.0.2.0/24', nexthop: ADDR.rtr }]);
    // A later delete of everything natgw holds leaves the others' objects in place.
    for (const [command, rule] of [
      ['eip-del', '172.20.0.10/24'],
      ['subnet-route-del', '10.0.2.0/24'],
    ] as const) {
      const r = ok(await api(sock, 'POST', '/v1/legacy', { command, rules: [rule] }), command);
      expect(r.body.status, r.text).toBe(0);
    }
    const addrs = (await topo.exec('gw', ['ip', '-o', '-4', 'addr', 'show', 'dev', 'net1'])).stdout;
    expect(addrs).toContain('172.20.0.2/24');
    expect(addrs).not.toContain('172.20.0.10/');
    const routes = (await topo.exec('gw', ['ip', 'route', 'show', 'dev', 'eth0'])).stdout;
    expect(routes).toContain('10.0.9.0/24 via 10.0.1.254 proto static');
    expect(routes).not.toContain('10.0.2.0/24');
  }, 60_000);
});
