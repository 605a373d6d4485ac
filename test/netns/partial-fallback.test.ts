/**
 * The daemon's partial sync on the real kernel, for every backend: a command after a change
 * made by hand. When that change makes the command's partial transaction fail (the rule it
 * deletes is already gone), the command is retried once as a full sync and succeeds; when it
 * does not (a neighbour removed by hand), the next full sync repairs it. Checked with the
 * kernel's own listing and with traffic, not with natgw's read-back.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { parsePeer, request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { waitFor } from '../helpers/poll.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';

/** natgw's DNAT identities as the kernel lists them (nft map elements or iptables rules): `port/proto`. */
async function kernelDnats(topo: Topology, b: BackendCase): Promise<string[]> {
  if (b.iptablesVariant) {
    const save = await topo.iptablesSave('nat', b.iptablesVariant);
    return [...save.matchAll(/^-A SHARED_DNAT -d \S+ -p (\w+) -m \w+ --dport (\d+) /gm)].map((m) => `${m[2]}/${m[1]}`).sort();
  }
  const r = await topo.exec('gw', ['nft', '-j', 'list', 'map', 'ip', 'natgw', 'port_dnat']);
  const doc = JSON.parse(r.stdout) as { nftables: Array<{ map?: { elem?: Array<[{ concat: [string, string, number] }, unknown]> } }> };
  const elems = doc.nftables.find((x) => x.map)?.map?.elem ?? [];
  return elems.map(([k]) => `${k.concat[2]}/${k.concat[1]}`).sort();
}

/** Remove one DNAT behind natgw's back. */
async function removeByHand(topo: Topology, b: BackendCase, port: number): Promise<void> {
  if (b.iptablesVariant) {
    const tool = `iptables-${b.iptablesVariant}`;
    await topo.exec('gw', [
      tool,
      '-t',
      'nat',
      '-D',
      'SHARED_DNAT',
      '-d',
      `${EIP}/32`,
      '-p',
      'tcp',
      '-m',
      'tcp',
      '--dport',
      String(port),
      '-j',
      'DNAT',
      '--to-destination',
      `${ADDR.vpc1}:80`,
    ]);
  } else {
    await topo.exec('gw', ['nft', 'delete', 'element', 'ip', 'natgw', 'port_dnat', `{ ${EIP} . tcp . ${port} }`]);
  }
}

const syncs = (metrics: string, kind: string, outcome: string): number =>
  Number(new RegExp(`^natgw_syncs_total\\{kind="${kind}",outcome="${outcome}"\\} (\\d+)`, 'm').exec(metrics)?.[1] ?? Number.NaN);

describe.each(BACKENDS)('partial sync after a change by hand ($name)', (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let server: ServerHandle | undefined;
  let sock: string;

  beforeAll(async () => {
    topo = await createTopology();
    // The timer stays out of the way: every full sync here is one the command asked for.
    Object.assign(topo.env, backend.env, { NATGW_RESYNC_PERIOD: '1h' });
    sock = socketOf(topo);
    server = startServer(topo, 'vpc1', 'tcp', 80);
    await server.ready;
    daemon = await startDaemon(topo);
    expect((await topo.natgw('init')).exitCode).toBe(0);
    await waitReady(topo, daemon);
    ok(await api(sock, 'PUT', `/v1/eips/${EIP}`, { prefixLength: 24 }), 'eip');
    for (const port of [8081, 8082, 8083])
      ok(await api(sock, 'PUT', `/v1/dnats/${EIP},${port},tcp`, { internalIp: ADDR.vpc1, internalPort: 80 }), `dnat ${port}`);
  });
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await server?.stop().catch(() => undefined);
    await topo?.cleanup();
  });

  it('a refused partial transaction is retried as a full sync, and the command succeeds', async () => {
    expect(await kernelDnats(topo, backend)).toEqual(['8081/tcp', '8082/tcp', '8083/tcp']);
    await removeByHand(topo, backend, 8081);
    const before = (await api(sock, 'GET', '/metrics')).text;
    const r = await api(sock, 'DELETE', `/v1/dnats/${EIP},8081,tcp`);
    expect(r.status).toBe(204);
    const after = (await api(sock, 'GET', '/metrics')).text;
    expect(syncs(after, 'partial', 'failure')).toBe(syncs(before, 'partial', 'failure') + 1);
    expect(syncs(after, 'full', 'success')).toBe(syncs(before, 'full', 'success') + 1);
    expect(await kernelDnats(topo, backend)).toEqual(['8082/tcp', '8083/tcp']);
    // And the next command is partial again.
    ok(await api(sock, 'PUT', `/v1/dnats/${EIP},8084,tcp`, { internalIp: ADDR.vpc1, internalPort: 80 }), 'dnat 8084');
    const later = (await api(sock, 'GET', '/metrics')).text;
    expect(syncs(later, 'partial', 'success')).toBe(syncs(after, 'partial', 'success') + 1);
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP, 8084, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
  });

  it('a neighbour removed by hand between two commands is put back by the next full sync', async () => {
    await removeByHand(topo, backend, 8082);
    ok(await api(sock, 'PUT', `/v1/dnats/${EIP},8085,tcp`, { internalIp: ADDR.vpc1, internalPort: 80 }), 'dnat 8085');
    // The partial sync trusted what it applied: 8082 is still missing in the kernel...
    expect(await kernelDnats(topo, backend)).toEqual(['8083/tcp', '8084/tcp', '8085/tcp']);
    // ...until a full sync (here a link event: an address of natgw's deleted by hand) repairs it.
    await topo.exec('gw', ['ip', 'addr', 'del', `${EIP}/24`, 'dev', 'net1']);
    await waitFor(async () => (await kernelDnats(topo, backend)).includes('8082/tcp'), { what: 'DNAT 8082 repaired', timeoutMs: 20_000 });
    expect(await kernelDnats(topo, backend)).toEqual(['8082/tcp', '8083/tcp', '8084/tcp', '8085/tcp']);
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP, 8082, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
  });
});
