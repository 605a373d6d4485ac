/**
 * A command's journal line is written before its iptables-restore runs, and synced while it
 * runs (StateStore.begin). This proves the order keeps both promises of the journal, on
 * the real kernel: a change the kernel refuses (the partial transaction and its full retry both
 * fail, injected on PATH) leaves no line that a restart replays — after kill -9 and a restart
 * the state and the kernel are without it, and traffic to it finds nothing — and a change that
 * was acknowledged survives a kill -9 that follows the answer at once, traffic included.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { makeWrappers, type Faults, type Tool } from '../helpers/faults.js';
import { parsePeer, request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { api, ok, savedState, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';

/** natgw's DNAT ports in the kernel's own listing. */
async function kernelDnatPorts(topo: Topology, b: BackendCase): Promise<number[]> {
  const save = await topo.iptablesSave('nat', b.iptablesVariant);
  return [...save.matchAll(/^-A SHARED_DNAT -d \S+ -p tcp -m tcp --dport (\d+) /gm)].map((m) => Number(m[1])).sort((a, c) => a - c);
}

const statePorts = (s: { dnats: Array<{ port: number }> } | undefined): number[] => (s?.dnats ?? []).map((d) => d.port).sort((a, c) => a - c);

const IPTABLES = BACKENDS.filter((b) => b.iptablesVariant);
// NATGW_TEST_BACKENDS may leave no iptables backend: the file then holds a skipped suite, not none.
describe.skipIf(IPTABLES.length > 0)('journal line ahead of the kernel (no iptables backend selected)', () => {
  it.skip('runs on the iptables backends only', () => undefined);
});

describe.each(IPTABLES)('journal line ahead of the kernel ($name)', (b: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let server: ServerHandle | undefined;
  let faults: Faults;
  let sock: string;
  const tool = `iptables-${b.iptablesVariant}-restore` as Tool;

  const start = async () => {
    daemon = await startDaemon(topo, { PATH: `${faults.dir}:${process.env.PATH ?? ''}` });
    await waitReady(topo, daemon);
  };
  const journal = () => {
    const f = join(topo.stateDir, 'state.journal');
    return existsSync(f) ? readFileSync(f, 'utf8') : '';
  };

  beforeAll(async () => {
    faults = makeWrappers();
    topo = await createTopology();
    Object.assign(topo.env, b.env, { NATGW_RESYNC_PERIOD: '1h' });
    sock = socketOf(topo);
    server = startServer(topo, 'vpc1', 'tcp', 80);
    await server.ready;
    await start();
    expect((await topo.natgw('init')).exitCode).toBe(0);
    ok(await api(sock, 'PUT', `/v1/eips/${EIP}`, { prefixLength: 24 }), 'eip');
    ok(await api(sock, 'PUT', `/v1/dnats/${EIP},8081,tcp`, { internalIp: ADDR.vpc1, internalPort: 80 }), 'dnat 8081');
  });
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    faults?.remove();
    await server?.stop().catch(() => undefined);
    await topo?.cleanup();
  });

  it('a change the kernel refused leaves no journal line: after kill -9 and a restart it is nowhere', async () => {
    const before = journal();
    // Every restore that adds port 8082 fails: the partial transaction and its full retry.
    faults.arm(tool, 1, 'fail', '--noflush', '--dport 8082 ');
    const r = await api(sock, 'PUT', `/v1/dnats/${EIP},8082,tcp`, { internalIp: ADDR.vpc1, internalPort: 80 });
    faults.disarm();
    expect(r.status).toBe(500);
    expect(faults.fired().split('\n').filter(Boolean).length).toBeGreaterThanOrEqual(2);
    expect(journal()).toBe(before);
    expect(statePorts(await savedState(topo))).toEqual([8081]);

    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await start();
    expect(statePorts((await api(sock, 'GET', '/v1/state')).body?.desired)).toEqual([8081]);
    expect(await kernelDnatPorts(topo, b)).toEqual([8081]);
    await expect(request(topo, 'ext', 'tcp', EIP, 8082, { localAddress: ADDR.extHost, timeoutMs: 1500 })).rejects.toThrow();
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP, 8081, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
  });

  it('an acknowledged change survives a kill -9 right after the answer', async () => {
    ok(await api(sock, 'PUT', `/v1/dnats/${EIP},8083,tcp`, { internalIp: ADDR.vpc1, internalPort: 80 }), 'dnat 8083');
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    daemon = undefined;
    expect(statePorts(await savedState(topo))).toEqual([8081, 8083]);
    await start();
    expect(statePorts((await api(sock, 'GET', '/v1/state')).body?.desired)).toEqual([8081, 8083]);
    expect(await kernelDnatPorts(topo, b)).toEqual([8081, 8083]);
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP, 8083, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
  });
});
