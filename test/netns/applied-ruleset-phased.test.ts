/**
 * A large applied-ruleset replay in phases (nftables; README "Restore at start"): a cache whose
 * nft part loads enough elements is cut like a bulk change into absent tables (nft/phases.ts).
 * In a FRESH namespace the loader applies the phases — the element lists by several nft at
 * once, nothing hooked until the last — and the start trusts it; real TCP, UDP and ICMP pass.
 * Over natgw's own tables (a restart in the same namespace) the first phase's `create table` is
 * refused and the prelude plus every phase run as the one replacing transaction: trusted too.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { ownedNetfilter, type BackendCase } from '../helpers/backends.js';
import { parsePeer, ping, request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { api, copyStateDir, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';
const FIP_EIP = '172.20.0.11';
/** Enough map elements for the phased cut (PHASING.minElements is 10,000). */
const EXTRA_DNATS = 10_000;
const NFT: BackendCase = { name: 'nftables', env: { GATEWAY_NETFILTER_MODE: 'nftables' } };

/** The cache's nft steps, by phase, from its header line. */
function cachedPhases(dir: string): string[] {
  const file = readFileSync(join(dir, 'applied-ruleset'));
  const header = JSON.parse(
    file
      .subarray(0, file.indexOf(10))
      .toString('utf8')
      .replace(/^# natgw applied-ruleset /, ''),
  );
  return (header.steps as { tool: string; phase?: string }[]).filter((s) => s.tool === 'nft').map((s) => s.phase ?? 'none');
}

// One core: nothing is cut (PHASING.groups), the replay is one transaction as ever.
describe.skipIf(availableParallelism() < 2)('a large applied-ruleset replayed in phases (nftables)', () => {
  const topos: Topology[] = [];
  const daemons: Daemon[] = [];
  const servers: ServerHandle[] = [];
  let saved: string;
  let wantKernel: string;

  const topology = async (): Promise<Topology> => {
    const t = await createTopology();
    topos.push(t);
    Object.assign(t.env, NFT.env, { GATEWAY_V4: ADDR.extGateway, NATGW_RESYNC_PERIOD: '1h' });
    return t;
  };
  const daemonIn = async (t: Topology): Promise<Daemon> => {
    const d = await startDaemon(t);
    daemons.push(d);
    await waitReady(t, d, 60_000);
    return d;
  };

  beforeAll(async () => {
    const src = await topology();
    const sock = socketOf(src);
    const d = await daemonIn(src);
    expect(ok(await api(sock, 'POST', '/v1/legacy', { command: 'init', rules: [] }), 'init').body.status).toBe(0);
    const base = (await api(sock, 'GET', '/v1/state')).body.desired;
    const desired = {
      ...base,
      eips: [
        { address: EIP, prefixLength: 24 },
        { address: FIP_EIP, prefixLength: 24 },
      ],
      snats: [{ eip: EIP, cidr: ADDR.vpcCidr }],
      dnats: [
        { eip: EIP, port: 8080, protocol: 'tcp', internalIp: ADDR.vpc1, internalPort: 80 },
        ...Array.from({ length: EXTRA_DNATS }, (_, i) => ({
          eip: EIP,
          port: 20000 + i,
          protocol: 'udp',
          internalIp: ADDR.vpc1,
          internalPort: 1000 + (i % 100),
        })),
      ],
      fips: [{ eip: FIP_EIP, internalIp: ADDR.vpc2 }],
    };
    ok(await api(sock, 'PUT', '/v1/state', { desired }), 'PUT /v1/state');
    wantKernel = await ownedNetfilter(src, NFT);
    expect(await stopDaemon(d)).toBe(0);
    saved = mkdtempSync(join(tmpdir(), 'natgw-replay-phased-'));
    copyStateDir(src.stateDir, saved);
  }, 180_000);

  afterAll(async () => {
    for (const d of daemons) await stopDaemon(d, 'SIGKILL').catch(() => undefined);
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    for (const t of topos) await t.cleanup();
    if (saved) rmSync(saved, { recursive: true, force: true });
  });

  it('the cache holds the phases: prelude, first, the groups, last', () => {
    const phases = cachedPhases(saved);
    expect(phases[0]).toBe('prelude');
    expect(phases[1]).toBe('first');
    expect(phases.filter((p) => p === 'group').length).toBeGreaterThanOrEqual(2);
    expect(phases.at(-1)).toBe('last');
  });

  it('in a fresh namespace the phases are applied and trusted; traffic passes; a restart over them replaces them whole', async () => {
    const t = await topology();
    copyStateDir(saved, t.stateDir);
    const d = await daemonIn(t);
    expect(d.logs()).toContain('"replay":"trusted"');
    expect(d.logs()).toContain('nft in phases');
    expect(await ownedNetfilter(t, NFT)).toBe(wantKernel);
    for (const [ns, proto, port] of [
      ['vpc1', 'tcp', 80],
      ['vpc1', 'udp', 1000 + ((EXTRA_DNATS - 1) % 100)],
      ['ext', 'tcp', 7001],
    ] as const) {
      const s = startServer(t, ns, proto, port);
      servers.push(s);
      await s.ready;
    }
    expect(parsePeer(await request(t, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    expect(parsePeer(await request(t, 'ext', 'udp', EIP, 20000 + EXTRA_DNATS - 1, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    expect(parsePeer(await request(t, 'vpc1', 'tcp', ADDR.extHost, 7001)).ip).toBe(EIP);
    expect(await ping(t, 'vpc2', ADDR.extHost)).toBe(true);
    const check = ok(await api(socketOf(t), 'GET', '/v1/status?check=true'), 'status check').body;
    expect(check.drift.check.drifted, JSON.stringify(check.drift.check)).toBe(false);

    // Same namespace, natgw's tables in place: `create table` is refused, the whole transaction runs.
    expect(await stopDaemon(d)).toBe(0);
    const again = await daemonIn(t);
    expect(again.logs()).toContain('"replay":"trusted"');
    expect(again.logs()).toContain('nft as one replacing transaction');
    expect(await ownedNetfilter(t, NFT)).toBe(wantKernel);
    expect(parsePeer(await request(t, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
  }, 180_000);
});
