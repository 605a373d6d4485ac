/**
 * Hit witnesses on a real kernel (nftables; src/dataplane/netfilter/nft/witness.ts): a DNAT or
 * floating IP deleted after it translated a connection is flushed as ever; one that never did
 * costs no conntrack run; one natgw cannot vouch for (created before a restart or a full sync
 * that rewrote the table) is flushed. The engine runs in this process over the production
 * executor one namespace over, so every tool it runs is counted; traffic is real TCP through
 * the gateway.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Engine } from '../../src/engine/engine.js';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { NetnsExecutor } from '../helpers/netnsExecutor.js';
import { RecordedExecutor } from '../helpers/execCalls.js';
import { witnessEngine, type WitnessEngine } from '../helpers/witnessEngine.js';
import { conntrackCount, startEchoServer, startLongFlow, type ServerHandle } from '../helpers/traffic.js';

const EIP = '172.20.0.10';
const EIP2 = '172.20.0.11';
const EIP3 = '172.20.0.12';
const FROM_EXT = { localAddress: ADDR.extHost } as const;

/** The production executor in the gateway namespace, remembering every run (sessions pass through). */
type Recording = RecordedExecutor<NetnsExecutor>;

describe('hit witnesses (nftables, real kernel)', () => {
  let topo: Topology;
  const servers: ServerHandle[] = [];
  const execs: Recording[] = [];
  let exec: Recording;
  let engine: Engine;
  let w: WitnessEngine;

  /** A new engine on the same state and kernel: what a daemon restart is. */
  async function start(): Promise<void> {
    exec = new RecordedExecutor(new NetnsExecutor(topo.ns.gw));
    execs.push(exec);
    w = await witnessEngine(topo, exec, { GATEWAY_NETFILTER_MODE: 'nftables' });
    engine = w.engine;
  }

  const natgw = (command: string, ...args: string[]): Promise<void> => w.natgw(command, ...args);
  const counted = (command: string, ...args: string[]) => w.counted(command, ...args);

  const hits = async (set: 'dnat_hit' | 'fip_hit'): Promise<string> => (await topo.exec('gw', ['nft', 'list', 'set', 'ip', 'natgw', set])).stdout;

  beforeAll(async () => {
    topo = await createTopology();
    servers.push(startEchoServer(topo, 'vpc1', 80), startEchoServer(topo, 'vpc2', 80));
    await Promise.all(servers.map((s) => s.ready));
    await start();
    await natgw('init');
    await natgw('eip-add', `${EIP}/24`, `${EIP2}/24`, `${EIP3}/24`);
  }, 60_000);

  afterAll(async () => {
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  }, 60_000);

  it('a DNAT that carried a connection: its delete flushes, and the flow loses the old translation', async () => {
    await natgw('dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`);
    const flow = await startLongFlow(topo, 'ext', EIP, 8080, FROM_EXT);
    try {
      expect(await flow.check()).toBe(true);
      expect(await hits('dnat_hit')).toContain(`${EIP} . tcp . 8080`);
      expect(await conntrackCount(topo, ['-p', 'tcp', '--orig-dst', EIP, '--orig-port-dst', '8080'])).toBeGreaterThan(0);
      const r = await counted('dnat-del', `${EIP},8080,tcp`);
      expect(r.conntrack).toEqual([`-D --orig-dst ${EIP} -p tcp --orig-port-dst 8080`]);
      expect(r.flushes).toEqual({ ran: 1, skipped: 0 });
      expect(await conntrackCount(topo, ['-p', 'tcp', '--orig-dst', EIP, '--orig-port-dst', '8080'])).toBe(0);
      // The witness went with the mapping: a DNAT of the same key later starts clean.
      expect(await hits('dnat_hit')).not.toContain(`${EIP} . tcp . 8080`);
    } finally {
      await flow.close();
    }
  }, 60_000);

  it('a DNAT that never carried a connection: its delete runs no conntrack at all', async () => {
    await natgw('dnat-add', `${EIP},8081,tcp,${ADDR.vpc1},80`);
    const r = await counted('dnat-del', `${EIP},8081,tcp`);
    expect(r.conntrack).toEqual([]);
    expect(r.flushes).toEqual({ ran: 0, skipped: 1 });
    const table = (await topo.exec('gw', ['nft', 'list', 'map', 'ip', 'natgw', 'port_dnat'])).stdout;
    expect(table).not.toContain('8081');
    // The same key again, now with a connection: the witness saw it.
    await natgw('dnat-add', `${EIP},8081,tcp,${ADDR.vpc1},80`);
    const flow = await startLongFlow(topo, 'ext', EIP, 8081, FROM_EXT);
    try {
      expect(await flow.check()).toBe(true);
      expect((await counted('dnat-del', `${EIP},8081,tcp`)).conntrack).toEqual([`-D --orig-dst ${EIP} -p tcp --orig-port-dst 8081`]);
      expect(await conntrackCount(topo, ['-p', 'tcp', '--orig-dst', EIP, '--orig-port-dst', '8081'])).toBe(0);
    } finally {
      await flow.close();
    }
  }, 60_000);

  it('a full sync that changes nothing keeps the trust; a DNAT made before a restart is flushed', async () => {
    // The first full sync since the applies above records the hit sets it found; the next,
    // finding the same sets and nothing to change, leaves the mappings made between them trusted.
    await engine.resync('test');
    await natgw('dnat-add', `${EIP},8082,tcp,${ADDR.vpc1},80`);
    await engine.resync('test');
    expect((await counted('dnat-del', `${EIP},8082,tcp`)).conntrack).toEqual([]);

    await natgw('dnat-add', `${EIP},8083,tcp,${ADDR.vpc1},80`);
    await start();
    const r = await counted('dnat-del', `${EIP},8083,tcp`);
    expect(r.conntrack).toEqual([`-D --orig-dst ${EIP} -p tcp --orig-port-dst 8083`]);
    expect(r.flushes).toEqual({ ran: 1, skipped: 0 });
  }, 60_000);

  it('a full sync empties the hit sets, and the mappings it found hit keep their flush', async () => {
    await engine.resync('test');
    await natgw('dnat-add', `${EIP},8087,tcp,${ADDR.vpc1},80`);
    const flow = await startLongFlow(topo, 'ext', EIP, 8087, FROM_EXT);
    try {
      expect(await flow.check()).toBe(true);
      expect(await hits('dnat_hit')).toContain(`${EIP} . tcp . 8087`);
      await engine.resync('test');
      expect(await hits('dnat_hit')).not.toContain('8087');
      expect((await counted('dnat-del', `${EIP},8087,tcp`)).conntrack).toEqual([`-D --orig-dst ${EIP} -p tcp --orig-port-dst 8087`]);
      expect(await conntrackCount(topo, ['-p', 'tcp', '--orig-dst', EIP, '--orig-port-dst', '8087'])).toBe(0);
    } finally {
      await flow.close();
    }
  }, 60_000);

  it('a full sync that rewrote the table: a DNAT made before it is flushed', async () => {
    await natgw('dnat-add', `${EIP},8084,tcp,${ADDR.vpc1},80`);
    // Someone deletes the table; the next full sync recreates it (its hit sets empty, while
    // connections translated before may live on).
    await topo.exec('gw', ['nft', 'delete', 'table', 'ip', 'natgw']);
    await engine.resync('test');
    expect((await counted('dnat-del', `${EIP},8084,tcp`)).conntrack).toEqual([`-D --orig-dst ${EIP} -p tcp --orig-port-dst 8084`]);
  }, 60_000);

  it('floating IPs: flushed after a connection, not without one, flushed when made before a restart', async () => {
    await natgw('floating-ip-add', `${EIP2},${ADDR.vpc2}`);
    const flow = await startLongFlow(topo, 'ext', EIP2, 80, FROM_EXT);
    try {
      expect(await flow.check()).toBe(true);
      expect(await conntrackCount(topo, ['--orig-dst', EIP2])).toBeGreaterThan(0);
      expect((await counted('floating-ip-del', EIP2)).conntrack).toEqual([`-D --orig-dst ${EIP2}`]);
      expect(await conntrackCount(topo, ['--orig-dst', EIP2])).toBe(0);
    } finally {
      await flow.close();
    }

    await natgw('floating-ip-add', `${EIP2},${ADDR.vpc2}`);
    // Traffic from the internal address out (fip_snat) leaves no hit: its flows' original
    // destination is never the EIP, so `--orig-dst <eip>` never flushed them.
    const r = await counted('floating-ip-del', EIP2);
    expect(r.conntrack).toEqual([]);
    expect(r.flushes).toEqual({ ran: 0, skipped: 1 });

    await natgw('floating-ip-add', `${EIP2},${ADDR.vpc2}`);
    await start();
    expect((await counted('floating-ip-del', EIP2)).conntrack).toEqual([`-D --orig-dst ${EIP2}`]);
  }, 60_000);

  it('a floating IP sharing its address with a DNAT keeps the flush (the DNAT translated to that address)', async () => {
    await natgw('dnat-add', `${EIP3},9000,tcp,${ADDR.vpc1},80`);
    await natgw('floating-ip-add', `${EIP3},${ADDR.vpc2}`);
    expect((await counted('floating-ip-del', EIP3)).conntrack).toEqual([`-D --orig-dst ${EIP3}`]);
    expect((await counted('dnat-del', `${EIP3},9000,tcp`)).conntrack).toEqual([]);
  }, 60_000);

  it('a table written by an older natgw (no witnesses) is repaired by a full sync', async () => {
    await natgw('dnat-add', `${EIP},8085,tcp,${ADDR.vpc1},80`);
    const listed = (await topo.exec('gw', ['nft', '-a', 'list', 'chain', 'ip', 'natgw', 'prerouting'])).stdout;
    const witnessRules = [...listed.matchAll(/add @(?:dnat|fip)_hit .*# handle (\d+)/g)].map((m) => m[1] as string);
    expect(witnessRules).toHaveLength(2);
    const old = witnessRules.map((h) => `delete rule ip natgw prerouting handle ${h}`).concat(['delete set ip natgw dnat_hit', 'delete set ip natgw fip_hit']);
    await topo.exec('gw', ['nft', '-f', '-'], { input: `${old.join('\n')}\n` });
    expect((await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'natgw'])).stdout).not.toContain('_hit');

    await start();
    await engine.resync('start');
    const table = (await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'natgw'])).stdout;
    expect(table).toContain('add @dnat_hit');
    expect(table).toContain('add @fip_hit');
    expect(table).toMatch(/set dnat_hit \{/);
    // Repaired whole: a second full sync finds nothing to change, and the DNAT made before is flushed.
    expect((await engine.resync('test')).netfilterChanges).toBe(0);
    expect((await counted('dnat-del', `${EIP},8085,tcp`)).conntrack).toEqual([`-D --orig-dst ${EIP} -p tcp --orig-port-dst 8085`]);
    // New mappings are witnessed again.
    await natgw('dnat-add', `${EIP},8086,tcp,${ADDR.vpc1},80`);
    expect((await counted('dnat-del', `${EIP},8086,tcp`)).conntrack).toEqual([]);
  }, 60_000);
});
