/**
 * The bulk path on the real kernel, for every backend: a fresh daemon (a gateway never
 * initialised), then ONE PUT /v1/state with the whole state. The daemon's start (a full sync)
 * looked at natgw's tables, so the bulk change is planned against what it saw and reads
 * nothing back: counted in the tool runs the daemon logs at debug level. Then traffic proves
 * the rules and the per-EIP accounting that rode along; a change made by hand between two
 * commands stays until a full sync repairs it.
 */
import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { parsePeer, request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { waitFor } from '../helpers/poll.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';
const FIP = '172.20.0.11';
const PORTS = Array.from({ length: 200 }, (_, i) => 9000 + i);

/** The tool runs the daemon logged (debug level) in its log text. */
function toolRuns(logText: string): string[] {
  const out: string[] = [];
  for (const line of logText.split('\n')) {
    if (!line.startsWith('{')) continue;
    const j = JSON.parse(line) as { msg?: string; cmd?: string };
    if (j.msg === 'exec' && j.cmd) out.push(j.cmd);
  }
  return out;
}

/** The digest's definition, independent of natgw's code: sha256 of the JSON with every object's keys sorted. */
function sortedJson(v: unknown): string {
  if (v === null || typeof v !== 'object') return JSON.stringify(v) ?? 'null';
  if (Array.isArray(v)) return `[${v.map(sortedJson).join(',')}]`;
  const o = v as Record<string, unknown>;
  const keys = Object.keys(o)
    .filter((k) => o[k] !== undefined)
    .sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${sortedJson(o[k])}`).join(',')}}`;
}
const digestOfDoc = (desired: unknown): string => `sha256:${createHash('sha256').update(sortedJson(desired)).digest('hex')}`;

const isListing = (c: string): boolean => / (list|show)\b|-save\b| -j /.test(c);

function metric(text: string, name: string, eip: string, direction: 'rx' | 'tx'): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes(`eip="${eip}"`) && l.includes(`direction="${direction}"`));
  return line ? Number(line.split(' ').at(-1)) : Number.NaN;
}

/** natgw's DNAT ports as the kernel lists them, by its own tools. */
async function kernelPorts(topo: Topology, b: BackendCase): Promise<number[]> {
  if (b.iptablesVariant) {
    const save = await topo.iptablesSave('nat', b.iptablesVariant);
    return [...save.matchAll(/^-A SHARED_DNAT -d \S+ -p tcp -m tcp --dport (\d+) /gm)].map((m) => Number(m[1])).sort((x, y) => x - y);
  }
  const r = await topo.exec('gw', ['nft', '-j', 'list', 'map', 'ip', 'natgw', 'port_dnat']);
  const doc = JSON.parse(r.stdout) as { nftables: Array<{ map?: { elem?: Array<[{ concat: [string, string, number] }, unknown]> } }> };
  return (doc.nftables.find((x) => x.map)?.map?.elem ?? []).map(([k]) => k.concat[2]).sort((x, y) => x - y);
}

async function removeByHand(topo: Topology, b: BackendCase, port: number): Promise<void> {
  if (b.iptablesVariant) {
    await topo.exec('gw', [
      `iptables-${b.iptablesVariant}`,
      ...['-t', 'nat', '-D', 'SHARED_DNAT', '-d', `${EIP}/32`, '-p', 'tcp', '-m', 'tcp', '--dport', String(port)],
      ...['-j', 'DNAT', '--to-destination', `${ADDR.vpc1}:80`],
    ]);
  } else {
    await topo.exec('gw', ['nft', 'delete', 'element', 'ip', 'natgw', 'port_dnat', `{ ${EIP} . tcp . ${port} }`]);
  }
}

describe.each(BACKENDS)('bulk PUT /v1/state into a fresh gateway ($name)', (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let server: ServerHandle | undefined;
  let sock: string;

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env, { NATGW_RESYNC_PERIOD: '1h', NATGW_LOG_LEVEL: 'debug' });
    sock = socketOf(topo);
    server = startServer(topo, 'vpc1', 'tcp', 80);
    await server.ready;
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    // The start-up's last tool run, after the first sync and readiness: the link monitor's first
    // listing of the links. The bulk change's window below must not catch it.
    await waitFor(async () => toolRuns(daemon!.logs()).includes('ip -o link show') || undefined, { what: "the link monitor's first listing" });
  });
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await server?.stop().catch(() => undefined);
    await topo?.cleanup();
  });

  it('applies the whole state reading no NAT table back, and it carries traffic and accounting', async () => {
    const { desired } = ok(await api(sock, 'GET', '/v1/state'), 'GET /v1/state').body;
    expect(desired.initialized).toBe(false);
    const doc = {
      ...desired,
      initialized: true,
      eips: [EIP, FIP].map((address) => ({ address, prefixLength: 24 })),
      snats: [{ eip: EIP, cidr: ADDR.vpcCidr, randomFully: false }],
      dnats: PORTS.map((port) => ({ eip: EIP, port, protocol: 'tcp', internalIp: ADDR.vpc1, internalPort: 80 })),
      fips: [{ eip: FIP, internalIp: ADDR.vpc1 }],
    };
    const logged = daemon!.logs().length;
    const put = ok(await api(sock, 'PUT', '/v1/state', doc), 'PUT /v1/state');
    // The request's own tool runs (its log lines may reach this process just after the answer).
    const runs = await waitFor(
      async () => {
        const r = toolRuns(daemon!.logs().slice(logged));
        return r.includes('ip -batch -') ? r : undefined;
      },
      { what: 'the bulk change logged its ip -batch', timeoutMs: 5_000 },
    );
    // No NAT table is read back; the small ones (addresses and routes, accounting) are, at every change.
    expect(runs.filter(isListing).filter((c) => !/^ip (-6 )?-j -batch -$| inet natgw_acct$/.test(c))).toEqual([]);
    if (!backend.iptablesVariant) expect(runs.filter((c) => c.startsWith('nft ') && !isListing(c))).toEqual(['nft -f -']);
    expect(runs).toContain('ip -batch -');

    expect(await kernelPorts(topo, backend)).toEqual(PORTS);
    // The answer's digest (hashed while the kernel applied) is the state's: as GET reads it, by the definition.
    const after = ok(await api(sock, 'GET', '/v1/state'), 'GET /v1/state after');
    expect(put.body.digest).toBe(digestOfDoc(after.body.desired));
    expect(put.headers.etag).toBe(`"${put.body.digest}"`);
    expect(after.body.digest).toBe(put.body.digest);
    for (const [ip, port] of [
      [EIP, PORTS[0]!],
      [EIP, PORTS.at(-1)!],
      [FIP, 80],
    ] as const) {
      expect(parsePeer(await request(topo, 'ext', 'tcp', ip, port, { localAddress: ADDR.extHost })).ip, `${ip}:${port}`).toBe(ADDR.extHost);
    }
    await waitFor(
      async () => {
        const t = (await api(sock, 'GET', '/metrics')).text;
        return metric(t, 'natgw_eip_packets', EIP, 'rx') > 0 && metric(t, 'natgw_eip_packets', FIP, 'rx') > 0;
      },
      { what: 'rx packets counted for both EIPs', timeoutMs: 10_000 },
    );
  });

  it('a change by hand between two commands stays until a full sync repairs it', async () => {
    await removeByHand(topo, backend, PORTS[1]!);
    const { desired } = ok(await api(sock, 'GET', '/v1/state'), 'GET /v1/state').body;
    ok(await api(sock, 'PUT', '/v1/state', { ...desired, dnats: desired.dnats.slice(2) }), 'PUT /v1/state without the first two');
    expect(await kernelPorts(topo, backend)).toEqual(PORTS.slice(2));
    ok(await api(sock, 'PUT', '/v1/state', desired), 'PUT /v1/state with them again');
    // Planned against what natgw applied: the port removed by hand was never re-added by the partial syncs...
    expect(await kernelPorts(topo, backend)).toEqual(PORTS);
    await removeByHand(topo, backend, PORTS[5]!);
    ok(await api(sock, 'PUT', `/v1/dnats/${EIP},8999,tcp`, { internalIp: ADDR.vpc1, internalPort: 80 }), 'dnat 8999');
    expect(await kernelPorts(topo, backend)).not.toContain(PORTS[5]);
    // ...until a full sync (a link event: an address of natgw's deleted by hand) repairs it.
    await topo.exec('gw', ['ip', 'addr', 'del', `${FIP}/24`, 'dev', 'net1']);
    await waitFor(async () => (await kernelPorts(topo, backend)).includes(PORTS[5]!), { what: 'the DNAT removed by hand repaired', timeoutMs: 20_000 });
    expect(await kernelPorts(topo, backend)).toEqual([8999, ...PORTS].sort((x, y) => x - y));
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP, PORTS[5]!, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
  });
});
