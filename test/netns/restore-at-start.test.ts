/**
 * Restore at start, on every backend: a daemon given a state and stopped leaves it in its
 * state dir; a daemon started with that state dir in a FRESH set of namespaces loads it and
 * applies it through the engine's full sync. Real traffic proves the rules: TCP through a
 * DNAT, UDP through a SNAT, ICMP through a FIP. A journal entry after the snapshot is restored
 * too, and a changed GATEWAY_NETFILTER_MODE restores into the other backend.
 */
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, ownedNetfilter, type BackendCase } from '../helpers/backends.js';
import { parsePeer, ping, request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { api, copyStateDir, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';
const FIP_EIP = '172.20.0.11';
const EXTRA_DNATS = 300;

/** The backend env that contradicts `b` (a restart with the mode changed). */
const otherBackend = (b: BackendCase): BackendCase =>
  b.iptablesVariant
    ? { name: 'nftables', env: { GATEWAY_NETFILTER_MODE: 'nftables' } }
    : { name: 'iptables-legacy', env: { GATEWAY_NETFILTER_MODE: 'iptables', NATGW_IPTABLES_VARIANT: 'legacy' }, iptablesVariant: 'legacy' };

describe.each(BACKENDS)('restore at start ($name)', (b: BackendCase) => {
  const topos: Topology[] = [];
  const daemons: Daemon[] = [];
  const servers: ServerHandle[] = [];
  const dirs: string[] = [];
  /** The state dir after the PUT (a snapshot), and after one more per-command change (+ journal). */
  let clean: string;
  let journaled: string;
  let wantKernel: string;

  const topology = async (env: Record<string, string>): Promise<Topology> => {
    const t = await createTopology();
    topos.push(t);
    Object.assign(t.env, env, { GATEWAY_V4: ADDR.extGateway, NATGW_RESYNC_PERIOD: '1h' });
    return t;
  };
  const daemonIn = async (t: Topology): Promise<Daemon> => {
    const d = await startDaemon(t);
    daemons.push(d);
    await waitReady(t, d, 60_000);
    return d;
  };
  const saveDir = (from: Topology): string => {
    const d = mkdtempSync(join(tmpdir(), 'natgw-restore-test-'));
    dirs.push(d);
    copyStateDir(from.stateDir, d);
    return d;
  };
  /** TCP and UDP through DNATs, TCP through the SNAT, ICMP through the FIP: each fails without its rule. */
  const traffic = async (t: Topology, extraPort?: number) => {
    for (const [ns, proto, port] of [
      ['vpc1', 'tcp', 80],
      ['vpc1', 'udp', 1000 + EXTRA_DNATS - 1],
      ['ext', 'tcp', 7001],
    ] as const) {
      const s = startServer(t, ns, proto, port);
      servers.push(s);
      await s.ready;
    }
    expect(parsePeer(await request(t, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    if (extraPort !== undefined) expect(parsePeer(await request(t, 'ext', 'tcp', EIP, extraPort, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    expect(parsePeer(await request(t, 'ext', 'udp', EIP, 20000 + EXTRA_DNATS - 1, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    expect(parsePeer(await request(t, 'vpc1', 'tcp', ADDR.extHost, 7001)).ip).toBe(EIP);
    expect(await ping(t, 'vpc2', ADDR.extHost)).toBe(true);
  };
  /** A read-back now finds nothing to repair: what the start applied is what the kernel holds. */
  const noDrift = async (t: Topology) => {
    const s = ok(await api(socketOf(t), 'GET', '/v1/status?check=true'), 'status check').body;
    expect(s.drift.check.drifted, JSON.stringify(s.drift.check)).toBe(false);
  };

  beforeAll(async () => {
    const src = await topology(b.env);
    const sock = socketOf(src);
    const d = await daemonIn(src);
    expect(ok(await api(sock, 'POST', '/v1/legacy', { command: 'init', rules: [] }), 'init').body.status).toBe(0);
    const base = (await api(sock, 'GET', '/v1/state')).body.desired;
    const dnats = [
      { eip: EIP, port: 8080, protocol: 'tcp', internalIp: ADDR.vpc1, internalPort: 80 },
      ...Array.from({ length: EXTRA_DNATS }, (_, i) => ({ eip: EIP, port: 20000 + i, protocol: 'udp', internalIp: ADDR.vpc1, internalPort: 1000 + i })),
    ];
    const desired = {
      ...base,
      eips: [
        { address: EIP, prefixLength: 24 },
        { address: FIP_EIP, prefixLength: 24 },
      ],
      snats: [{ eip: EIP, cidr: ADDR.vpcCidr }],
      dnats,
      fips: [{ eip: FIP_EIP, internalIp: ADDR.vpc2 }],
    };
    ok(await api(sock, 'PUT', '/v1/state', { desired }), 'PUT /v1/state');
    wantKernel = await ownedNetfilter(src, b);
    expect(await stopDaemon(d)).toBe(0);
    clean = saveDir(src);
    // One per-command change after the snapshot: a journal entry.
    await daemonIn(src).then(async (d2) => {
      // A restart over natgw's own rules changes nothing of them.
      expect(await ownedNetfilter(src, b)).toBe(wantKernel);
      ok(await api(sock, 'PUT', `/v1/dnats/${EIP},8081,tcp`, { internalIp: ADDR.vpc1, internalPort: 80 }), 'dnat 8081');
      expect(await stopDaemon(d2)).toBe(0);
    });
    journaled = saveDir(src);
    expect(statSync(join(journaled, 'state.journal')).size).toBeGreaterThan(0);
  }, 180_000);

  afterAll(async () => {
    for (const d of daemons) await stopDaemon(d, 'SIGKILL').catch(() => undefined);
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    for (const t of topos) await t.cleanup();
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  it('restores the state in a fresh namespace: the rules are there and traffic passes', async () => {
    const t = await topology(b.env);
    copyStateDir(clean, t.stateDir);
    await daemonIn(t);
    expect(await ownedNetfilter(t, b)).toBe(wantKernel);
    await traffic(t);
    // The accounting table came with the restore: it counts the traffic above.
    const metrics = (await api(socketOf(t), 'GET', '/metrics')).text;
    expect(Number(/natgw_eip_packets\{eip="172\.20\.0\.10",direction="rx"\} (\d+)/.exec(metrics)?.[1] ?? 0)).toBeGreaterThan(0);
    expect(Number(/natgw_eip_packets\{eip="172\.20\.0\.11",direction="tx"\} (\d+)/.exec(metrics)?.[1] ?? 0)).toBeGreaterThan(0);
    await noDrift(t);
    // A command after the start plans against what the start applied (a partial sync).
    ok(await api(socketOf(t), 'PUT', `/v1/dnats/${EIP},8082,tcp`, { internalIp: ADDR.vpc1, internalPort: 80 }), 'dnat 8082');
    expect(parsePeer(await request(t, 'ext', 'tcp', EIP, 8082, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    await noDrift(t);
  }, 120_000);

  it('restores a journal entry after the snapshot too', async () => {
    const t = await topology(b.env);
    copyStateDir(journaled, t.stateDir);
    await daemonIn(t);
    await traffic(t, 8081);
    await noDrift(t);
  }, 120_000);

  it('restores into the other backend when GATEWAY_NETFILTER_MODE changed', async () => {
    const other = otherBackend(b);
    const t = await topology(other.env);
    copyStateDir(clean, t.stateDir);
    await daemonIn(t);
    // Switched: the other backend holds the rules, and the cached backend's are nowhere.
    expect((await api(socketOf(t), 'GET', '/v1/state')).body.backend.kind).toBe(other.iptablesVariant ? 'iptables' : 'nftables');
    expect(await ownedNetfilter(t, b)).not.toContain(EIP);
    expect(await ownedNetfilter(t, other)).toContain(EIP);
    await traffic(t);
    await noDrift(t);
  }, 120_000);
});
