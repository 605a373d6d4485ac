/**
 * `natgw serve` on the real kernel, for every backend: it serves at once, reconciles, and
 * keeps what it acknowledged — across kill -9 and restart, with or without its state file —
 * and repairs drift on its own: flushed NAT rules within one resync period, addresses and
 * default routes of a recreated external interface on the link event.
 */
import { existsSync, promises as fs, statSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, ownedNetfilter, type BackendCase } from '../helpers/backends.js';
import { parsePeer, request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { waitFor } from '../helpers/poll.js';
import { api, ok, savedState, socketOf, startDaemon, stopDaemon, waitForLog, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';

/** Remove natgw's NAT rules behind its back. */
async function flushNat(topo: Topology, b: BackendCase): Promise<void> {
  if (b.iptablesVariant) await topo.exec('gw', [`iptables-${b.iptablesVariant}`, '-t', 'nat', '-F', 'SHARED_DNAT']);
  else await topo.exec('gw', ['nft', 'flush', 'table', 'ip', 'natgw']);
}

async function defaultRoute(topo: Topology): Promise<string> {
  return (await topo.exec('gw', ['ip', '-4', 'route', 'show', 'default', 'dev', 'net1'])).stdout.trim();
}

describe.each(BACKENDS)('natgw serve on $name', (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  const servers: ServerHandle[] = [];
  let sock: string;

  const reach = (port: number) => request(topo, 'ext', 'tcp', EIP, port, { localAddress: ADDR.extHost });

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env, { GATEWAY_V4: ADDR.extGateway, NATGW_RESYNC_PERIOD: '1s' });
    sock = socketOf(topo);
    for (const ns of ['vpc1', 'vpc2'] as const) {
      const s = startServer(topo, ns, 'tcp', 80);
      servers.push(s);
      await s.ready;
    }
  });
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  });

  it("serves at once on a 0600 socket, takes the shim's commands and reports ready", async () => {
    daemon = await startDaemon(topo);
    expect(statSync(sock).mode & 0o777).toBe(0o600);
    // With the daemon up (and autostart off) the shim forwards: its log line shows where it ran.
    const init = await topo.natgw('init');
    expect(init.exitCode).toBe(0);
    expect(init.stderr).toBe('');
    await waitReady(topo, daemon);
    await waitForLog(daemon, '"command":"init"');

    ok(await api(sock, 'PUT', `/v1/eips/${EIP}`, { prefixLength: 24 }), 'eip');
    ok(await api(sock, 'PUT', `/v1/dnats/${EIP},8080,tcp`, { internalIp: ADDR.vpc1, internalPort: 80 }), 'dnat');
    expect(parsePeer(await reach(8080)).ip).toBe(ADDR.extHost);
    expect(await defaultRoute(topo)).toContain(`via ${ADDR.extGateway}`);
  });

  it('repairs NAT rules flushed behind its back within one resync period', async () => {
    const repairs = async () => Number(/^natgw_drift_repairs_total (\d+)/m.exec((await api(sock, 'GET', '/metrics')).text)?.[1]);
    const repairsBefore = await repairs();
    const want = await ownedNetfilter(topo, backend);
    await flushNat(topo, backend);
    const flushedAt = Date.now();
    await waitFor(async () => (await ownedNetfilter(topo, backend)) === want, { what: 'the flushed rules to come back', timeoutMs: 5000, intervalMs: 50 });
    // How fast is a figure for `node dist/bench/repair.js`; the test checks that it happens.
    const repairMs = Date.now() - flushedAt;
    expect(parsePeer(await reach(8080)).ip).toBe(ADDR.extHost);
    const state = ok(await api(sock, 'GET', '/v1/state'), 'state').body;
    expect(state.backend.kind).toBe(backend.iptablesVariant ? 'iptables' : 'nftables');
    expect(await repairs()).toBeGreaterThan(repairsBefore);
    expect(state.drift.lastRepair).toMatchObject({ repaired: true });
    expect(state.drift.lastRepair.changes.netfilter).toBeGreaterThan(0);
    console.info(`[${backend.name}] flushed NAT rules repaired after ${repairMs} ms`);
  });

  it('puts EIPs and the default route back on a recreated net1 without any command', async () => {
    await topo.recreateExternal();
    const recreatedAt = Date.now();
    await waitFor(async () => (await topo.addresses('gw', 'net1', 4))?.includes(`${EIP}/24`), {
      what: 'the EIP back on net1',
      timeoutMs: 5000,
      intervalMs: 50,
    });
    await waitFor(async () => (await defaultRoute(topo)).includes(`via ${ADDR.extGateway}`), {
      what: 'the default route back',
      timeoutMs: 5000,
      intervalMs: 50,
    });
    console.info(`[${backend.name}] recreated net1 repaired after ${Date.now() - recreatedAt} ms`);
    expect(parsePeer(await reach(8080)).ip).toBe(ADDR.extHost);
    await waitReady(topo, daemon);
  });

  it('keeps an acknowledged change across kill -9 and restart, and repairs what changed meanwhile', async () => {
    ok(await api(sock, 'PUT', `/v1/dnats/${EIP},8081,tcp`, { internalIp: ADDR.vpc2, internalPort: 80 }), 'dnat 8081');
    await stopDaemon(daemon!, 'SIGKILL');
    const saved = await savedState(topo);
    expect(saved.dnats).toContainEqual({ eip: EIP, port: 8081, protocol: 'tcp', internalIp: ADDR.vpc2, internalPort: 80 });
    // While no agent runs, the rules go away; the socket file stays behind, stale.
    await flushNat(topo, backend);
    expect(existsSync(sock)).toBe(true);

    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    expect(parsePeer(await reach(8081)).ip).toBe(ADDR.extHost);
    expect(parsePeer(await reach(8080)).ip).toBe(ADDR.extHost);
    // Putting the state back at start is a restore: it is no drift repair in the status or the metric.
    const drift = ok(await api(sock, 'GET', '/v1/state'), 'state').body.drift;
    expect(drift).toMatchObject({ repairs: 0, lastRepair: null });
    await waitForLog(daemon, 'start: the persisted state restored into the kernel');
    expect((await api(sock, 'GET', '/metrics')).text).toMatch(/^natgw_drift_repairs_total 0$/m);
  });

  it('adopts from the kernel when the state file is gone too, losing nothing', async () => {
    const before = ok(await api(sock, 'GET', '/v1/state'), 'state').body.desired;
    await stopDaemon(daemon!, 'SIGKILL');
    await fs.rm(join(topo.stateDir, 'state.json'));
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    const after = ok(await api(sock, 'GET', '/v1/state'), 'state').body.desired;
    for (const kind of ['eips', 'dnats', 'snats', 'fips', 'routes', 'shareDnats'] as const) {
      expect(new Set(after[kind].map((x: unknown) => JSON.stringify(x))), kind).toEqual(new Set(before[kind].map((x: unknown) => JSON.stringify(x))));
    }
    expect(after.initialized).toBe(true);
    expect(after.interfaces).toEqual(before.interfaces);
    expect(existsSync(join(topo.stateDir, 'state.json'))).toBe(true);
    expect(parsePeer(await reach(8081)).ip).toBe(ADDR.extHost);
  });

  it('exits 0 on SIGTERM, removing its socket', async () => {
    expect(await stopDaemon(daemon!, 'SIGTERM')).toBe(0);
    daemon = undefined;
    expect(existsSync(sock)).toBe(false);
  });
});
