/**
 * The shim's own loopback connections kept out of conntrack (src/dataplane/netfilter/notrack.ts),
 * on a real kernel and every backend: the daemon runs in the gateway namespace with NAT rules
 * loaded, the shim reaches it through bash's /dev/tcp (PATH holds bash and ip only, so no other
 * path could answer), and the namespace's conntrack table keeps no entry of those connections,
 * while other processes' loopback connections and a real TCP flow through a DNAT are tracked as
 * ever. With the table small, a following DNAT delete runs no conntrack process
 * (natgw_conntrack_flushes_total{outcome="skipped_no_entries"}). The rule deleted by hand comes
 * back with the next full sync; a switch to another backend leaves no notrack chain behind.
 */
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { waitFor } from '../helpers/poll.js';
import { request, startEchoServer, startLongFlow, type ServerHandle } from '../helpers/traffic.js';
import { api, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';
import { pathWith, requestsVia, shim, text } from './shim-util.js';

const EIP = '172.20.0.10';
const SHIM_ADDRESS = '127.78.71.87';
const LOOPBACK_PORT = 9099;
const CALLS = 30;
/** Full syncs every second: a repair is seen within the test's patience. */
const DAEMON_ENV = { NATGW_RESYNC_PERIOD: '1s' };

/** Where each backend keeps the rule, and how a person would delete it. */
function rulesOf(b: BackendCase): { list: (topo: Topology) => Promise<string>; deleteByHand: readonly string[] } {
  if (b.iptablesVariant) {
    const v = b.iptablesVariant;
    return {
      list: (topo) => topo.iptablesSave('raw', v),
      deleteByHand: [`iptables-${v}`, '-t', 'raw', '-D', 'NATGW_NOTRACK', '-d', `${SHIM_ADDRESS}/32`, '-j', 'CT', '--notrack'],
    };
  }
  return {
    list: async (topo) => (await topo.exec('gw', ['nft', 'list', 'chain', 'ip', 'natgw', 'shim_notrack'], { reject: false })).stdout,
    deleteByHand: ['nft', 'flush', 'chain', 'ip', 'natgw', 'shim_notrack'],
  };
}

const NOTRACK_RULES = (b: BackendCase): string[] =>
  b.iptablesVariant
    ? ['-A OUTPUT -j NATGW_NOTRACK', `-A NATGW_NOTRACK -d ${SHIM_ADDRESS}/32 -j CT --notrack`, `-A NATGW_NOTRACK -s ${SHIM_ADDRESS}/32 -j CT --notrack`]
    : [`ip daddr ${SHIM_ADDRESS} notrack`, `ip saddr ${SHIM_ADDRESS} notrack`];

const hasAll = (listing: string, rules: readonly string[]) => rules.every((r) => listing.includes(r));

async function conntrackLines(topo: Topology): Promise<string[]> {
  const r = await topo.exec('gw', ['cat', '/proc/net/nf_conntrack']);
  return r.stdout.split('\n').filter((l) => l.trim() !== '');
}

/** A counter of the daemon's /metrics (0 while it has no sample). */
async function metric(topo: Topology, name: string): Promise<number> {
  const r = await api(socketOf(topo), 'GET', '/metrics');
  const m = new RegExp(`^${name.replace(/[{}]/g, '\\$&')} (\\d+)$`, 'm').exec(r.text);
  return m ? Number(m[1]) : 0;
}

const flushes = (topo: Topology, outcome: string) => metric(topo, `natgw_conntrack_flushes_total{outcome="${outcome}"}`);

describe.each(BACKENDS)("the shim's loopback connections on $name", (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  /** A PATH with ip and bash only: a shim call that succeeds there took the /dev/tcp path. */
  let bashOnly: string;
  const servers: ServerHandle[] = [];
  const rules = rulesOf(backend);

  async function shimOk(...argv: string[]): Promise<void> {
    const r = await shim(topo, argv, { PATH: bashOnly });
    expect({ argv: argv.join(' '), status: r.status, stderr: text(r.stderr) }).toEqual({ argv: argv.join(' '), status: 0, stderr: '' });
  }

  async function restart(env: Record<string, string> = {}): Promise<void> {
    if (daemon) await stopDaemon(daemon);
    daemon = await startDaemon(topo, { ...DAEMON_ENV, ...env });
    await waitReady(topo, daemon);
    await waitFor(async () => existsSync(`${socketOf(topo)}.tcp`) && readFileSync(`${socketOf(topo)}.tcp`, 'utf8').includes(SHIM_ADDRESS), {
      what: "the daemon's shim file naming its loopback address",
      timeoutMs: 10_000,
      intervalMs: 20,
    });
  }

  beforeAll(async () => {
    bashOnly = pathWith(['ip', 'bash'], 'this test');
    topo = await createTopology();
    Object.assign(topo.env, { GATEWAY_V4: ADDR.extGateway, ...backend.env });
    servers.push(startEchoServer(topo, 'vpc1', 80), startEchoServer(topo, 'gw', LOOPBACK_PORT, '127.0.0.1'));
    await Promise.all(servers.map((s) => s.ready));
    await restart();
    await shimOk('init');
    await shimOk('eip-add', `${EIP}/24`);
    await shimOk('snat-add', `${EIP},${ADDR.vpcCidr}`);
    await shimOk('dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`, `${EIP},8081,tcp,${ADDR.vpc1},80`);
  }, 90_000);

  afterAll(async () => {
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
    if (bashOnly) rmSync(bashOnly, { recursive: true, force: true });
  }, 60_000);

  it('30 shim calls leave no conntrack entry, other loopback traffic and a DNAT flow are tracked, and a DNAT delete runs no conntrack', async () => {
    // A restart: natgw's rules come back through the start's own path (a replay, or adoption of
    // what the kernel holds), and on nftables no hit witness can vouch for 8081 any more, so the
    // kernel's conntrack table decides the delete below.
    await restart();
    expect(hasAll(await rules.list(topo), NOTRACK_RULES(backend))).toBe(true);
    const before = await requestsVia(socketOf(topo), daemon!, '/v1/legacy', 'shim-tcp');
    for (let i = 0; i < CALLS / 2; i++) {
      await shimOk('snat-add', `${EIP},10.9.${i}.0/24`);
      await shimOk('snat-del', `${EIP},10.9.${i}.0/24`);
    }
    expect(await requestsVia(socketOf(topo), daemon!, '/v1/legacy', 'shim-tcp')).toBe(before + CALLS);

    // Another process's loopback connection in the same namespace: tracked as before.
    expect(await request(topo, 'gw', 'tcp', '127.0.0.1', LOOPBACK_PORT)).toContain('peer=');
    // A real TCP flow through the DNAT: translated and tracked.
    const flow = await startLongFlow(topo, 'ext', EIP, 8080, { localAddress: ADDR.extHost });
    try {
      expect(await flow.check()).toBe(true);
      const lines = await conntrackLines(topo);
      expect(lines.filter((l) => l.includes(`dst=${EIP}`) && l.includes('dport=8080') && l.includes(`src=${ADDR.vpc1}`))).toHaveLength(1);
      expect(lines.filter((l) => l.includes('dst=127.0.0.1') && l.includes(`dport=${LOOPBACK_PORT}`))).toHaveLength(1);
      expect(lines.filter((l) => l.includes(SHIM_ADDRESS))).toEqual([]);

      const ran = await flushes(topo, 'ran');
      const noEntries = await flushes(topo, 'skipped_no_entries');
      await shimOk('dnat-del', `${EIP},8081,tcp`);
      expect(await flushes(topo, 'skipped_no_entries')).toBe(noEntries + 1);
      expect(await flushes(topo, 'ran')).toBe(ran);
      expect(await flow.check()).toBe(true);
    } finally {
      await flow.close();
    }
    // The shim's delete itself left no entry either.
    expect((await conntrackLines(topo)).filter((l) => l.includes(SHIM_ADDRESS))).toEqual([]);
  }, 120_000);

  it('a notrack rule deleted by hand is back after the next full sync, and only it', async () => {
    const repairs = await metric(topo, 'natgw_drift_repairs_total');
    // The by-hand delete fails (and with it the test) unless the rule was there.
    await topo.exec('gw', rules.deleteByHand);
    // natgw put it back, counting a repair: not a delete that never happened.
    const repaired = await waitFor(
      async () => {
        const listing = await rules.list(topo);
        return hasAll(listing, NOTRACK_RULES(backend)) && (await metric(topo, 'natgw_drift_repairs_total')) > repairs && listing;
      },
      { what: 'the notrack rule back, by a repair', timeoutMs: 15_000, intervalMs: 100 },
    );
    // Exactly once each: a repair adds what is missing, it does not append a second copy.
    for (const r of NOTRACK_RULES(backend)) expect(repaired.split(r).length - 1, r).toBe(1);
    await shimOk('snat-add', `${EIP},10.8.0.0/24`);
    expect((await conntrackLines(topo)).filter((l) => l.includes(SHIM_ADDRESS))).toEqual([]);
  }, 60_000);

  it('a switch to another backend leaves no notrack chain in the old one, and the new one carries it', async () => {
    const other: BackendCase = backend.iptablesVariant
      ? { name: 'nftables', env: { GATEWAY_NETFILTER_MODE: 'nftables' } }
      : { name: 'iptables-legacy', env: { GATEWAY_NETFILTER_MODE: 'iptables', NATGW_IPTABLES_VARIANT: 'legacy' }, iptablesVariant: 'legacy' };
    await restart(other.env);
    await waitFor(async () => !(await rules.list(topo)).includes('notrack'), { what: 'no notrack rule left in the old backend', timeoutMs: 15_000 });
    if (backend.iptablesVariant) expect(await topo.iptablesSave('raw', backend.iptablesVariant)).not.toContain('NATGW_NOTRACK');
    else expect((await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'natgw'], { reject: false })).exitCode).not.toBe(0);
    expect(hasAll(await rulesOf(other).list(topo), NOTRACK_RULES(other))).toBe(true);
    await shimOk('snat-del', `${EIP},10.8.0.0/24`);
    expect((await conntrackLines(topo)).filter((l) => l.includes(SHIM_ADDRESS))).toEqual([]);
  }, 60_000);
});

describe("the shim's listener where lo holds 127.0.0.1/32 only", () => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let bashOnly: string;

  beforeAll(async () => {
    bashOnly = pathWith(['ip', 'bash'], 'this test');
    topo = await createTopology();
    Object.assign(topo.env, { GATEWAY_V4: ADDR.extGateway });
    // No 127.0.0.0/8 on lo: natgw's own address cannot be bound.
    await topo.exec('gw', ['ip', 'addr', 'add', '127.0.0.1/32', 'dev', 'lo']);
    await topo.exec('gw', ['ip', 'addr', 'del', '127.0.0.1/8', 'dev', 'lo']);
  }, 60_000);

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
    if (bashOnly) rmSync(bashOnly, { recursive: true, force: true });
  }, 60_000);

  it('listens on 127.0.0.1 instead, says why, and the shim still takes the fast path', async () => {
    daemon = await startDaemon(topo);
    const file = `${socketOf(topo)}.tcp`;
    const line = await waitFor(async () => existsSync(file) && readFileSync(file, 'utf8'), {
      what: "the daemon's shim file",
      timeoutMs: 10_000,
      intervalMs: 20,
    });
    expect(line).toMatch(/^\d{1,5} [0-9a-f]{64} [0-9a-f]{64} 127\.0\.0\.1\n$/);
    expect(daemon.logs()).toContain("natgw's loopback address cannot be bound");
    const r = await shim(topo, ['init'], { PATH: bashOnly });
    expect({ status: r.status, stderr: text(r.stderr) }).toEqual({ status: 0, stderr: '' });
    expect(await requestsVia(socketOf(topo), daemon, '/v1/legacy', 'shim-tcp')).toBe(1);
  }, 60_000);
});
