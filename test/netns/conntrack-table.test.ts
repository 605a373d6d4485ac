/**
 * A delete's conntrack flush on a real kernel and every backend (src/dataplane/conntrack.ts): a
 * DNAT, floating IP or port range whose delete finds a tracked connection runs `conntrack -D`
 * (a range: for the ports one listing shows) and the entry goes, while other connections stay;
 * a namespace that tracks nothing runs no conntrack process at all. The engine runs in this
 * process over the production executor one namespace over (every tool counted); the entry
 * count is read by the production reader, through a process that lives in the gateway
 * namespace. Traffic is real TCP.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PROC_CONNTRACK_STAT, parseConntrackEntries } from '../../src/dataplane/conntrack.js';
import type { FlushCount } from '../../src/engine/engine.js';
import { SystemExecutor } from '../../src/system/exec.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { RecordedExecutor } from '../helpers/execCalls.js';
import { countingEngine, type CountingEngine } from '../helpers/countingEngine.js';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { NetnsExecutor } from '../helpers/netnsExecutor.js';
import { waitFor } from '../helpers/poll.js';
import { conntrackCount, startEchoServer, startLongFlow, type ServerHandle } from '../helpers/traffic.js';
import { readFileSync } from 'node:fs';

const EIP = '172.20.0.10';
const EIP2 = '172.20.0.11';
const FROM_EXT = { localAddress: ADDR.extHost } as const;
const RANGE_PORT = 8050;

describe.each(BACKENDS)('the conntrack count deciding a flush on $name', (backend: BackendCase) => {
  let topo: Topology;
  const servers: ServerHandle[] = [];
  let exec: RecordedExecutor<NetnsExecutor>;
  let w: CountingEngine;
  /** A process in the gateway namespace: its /proc/<pid>/net is that namespace's /proc/net. */
  let holder: number;
  /** Every read of the kernel's entry count, and what it said. */
  const reads: string[] = [];

  /** The engine, in this process over the recorded production executor. */
  async function start(): Promise<void> {
    const system = new SystemExecutor();
    exec = Object.assign(new RecordedExecutor(new NetnsExecutor(topo.ns.gw)), {
      readKernelFile: async (p: string) => {
        const text = await system.readKernelFile(p.replace(/^\/proc\/net\//, `/proc/${holder}/net/`));
        if (p === PROC_CONNTRACK_STAT) reads.push(`count ${text === undefined ? 'unread' : parseConntrackEntries(text) === 0 ? 'zero' : 'some'}`);
        return text;
      },
    });
    w = await countingEngine(topo, exec, backend.env);
  }

  const natgw = (command: string, ...args: string[]): Promise<void> => w.natgw(command, ...args);

  /** A delete, with the conntrack runs it made, the flushes it counted and what the count said. */
  async function counted(command: string, ...args: string[]): Promise<{ conntrack: string[]; flushes: FlushCount | undefined; answered: string[] }> {
    reads.length = 0;
    return { ...(await w.counted(command, ...args)), answered: [...reads] };
  }

  /**
   * A killed client's socket sends its FIN to the address after the delete: an entry of its own,
   * untranslated, that a later delete of a mapping there would rightly flush. Gone before those.
   */
  async function forget(filter: string[]): Promise<void> {
    await waitFor(
      async () => {
        await topo.exec('gw', ['conntrack', '-D', ...filter], { reject: false });
        return (await conntrackCount(topo, filter)) === 0;
      },
      { what: `no entry left for ${filter.join(' ')}`, timeoutMs: 10_000 },
    );
  }

  beforeAll(async () => {
    topo = await createTopology();
    servers.push(startEchoServer(topo, 'vpc1', 80), startEchoServer(topo, 'vpc1', RANGE_PORT), startEchoServer(topo, 'vpc2', 80));
    await Promise.all(servers.map((s) => s.ready));
    const child = topo.spawn('gw', ['sleep', 'infinity']);
    holder = child.pid as number;
    // `ip netns exec` enters the namespace before it becomes sleep.
    await waitFor(async () => readFileSync(`/proc/${holder}/comm`, 'utf8').trim() === 'sleep', {
      what: 'a process in the gateway namespace',
      timeoutMs: 10_000,
    });
    await start();
    await natgw('init');
    await natgw('eip-add', `${EIP}/24`, `${EIP2}/24`);
  }, 60_000);

  afterAll(async () => {
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  }, 60_000);

  it('a namespace that tracks nothing at all: its entry count answers, the table is not walked, no conntrack', async () => {
    await natgw('dnat-add', `${EIP},8090,tcp,${ADDR.vpc1},80`);
    // First, before any flow: a server's retransmissions after a test's flush would be tracked anew.
    await waitFor(
      async () => {
        await topo.exec('gw', ['conntrack', '-F'], { reject: false });
        return parseConntrackEntries(readFileSync(`/proc/${holder}/net/stat/nf_conntrack`, 'utf8')) === 0;
      },
      { what: 'an empty conntrack table in the gateway namespace', timeoutMs: 10_000 },
    );
    const r = await counted('dnat-del', `${EIP},8090,tcp`);
    expect(r.answered).toEqual(['count zero']);
    expect(r.conntrack).toEqual([]);
    expect(r.flushes).toEqual({ ran: 0, noEntries: 1 });
  }, 60_000);

  it('a DNAT that carries a live connection: conntrack -D runs and the entry is gone', async () => {
    await natgw('dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`);
    const flow = await startLongFlow(topo, 'ext', EIP, 8080, FROM_EXT);
    try {
      expect(await flow.check()).toBe(true);
      expect(await conntrackCount(topo, ['-p', 'tcp', '--orig-dst', EIP, '--orig-port-dst', '8080'])).toBeGreaterThan(0);
      const r = await counted('dnat-del', `${EIP},8080,tcp`);
      expect(r.answered).toEqual(['count some']);
      expect(r.conntrack).toEqual([`-D --orig-dst ${EIP} -p tcp --orig-port-dst 8080`]);
      expect(r.flushes).toEqual({ ran: 1, noEntries: 0 });
      expect(await conntrackCount(topo, ['-p', 'tcp', '--orig-dst', EIP, '--orig-port-dst', '8080'])).toBe(0);
    } finally {
      await flow.close();
    }
  }, 60_000);

  it('a DNAT that never carried one: its flush deletes nothing, beside a live connection to another DNAT', async () => {
    await natgw('dnat-add', `${EIP},8081,tcp,${ADDR.vpc1},80`, `${EIP},8082,tcp,${ADDR.vpc1},80`);
    const flow = await startLongFlow(topo, 'ext', EIP, 8081, FROM_EXT);
    try {
      expect(await flow.check()).toBe(true);
      const r = await counted('dnat-del', `${EIP},8082,tcp`);
      expect(r.answered).toEqual(['count some']);
      expect(r.conntrack).toEqual([`-D --orig-dst ${EIP} -p tcp --orig-port-dst 8082`]);
      expect(r.flushes).toEqual({ ran: 1, noEntries: 0 });
      // The other connection and its entry are untouched.
      expect(await flow.check()).toBe(true);
      expect(await conntrackCount(topo, ['-p', 'tcp', '--orig-dst', EIP, '--orig-port-dst', '8081'])).toBeGreaterThan(0);
      expect((await counted('dnat-del', `${EIP},8081,tcp`)).conntrack).toEqual([`-D --orig-dst ${EIP} -p tcp --orig-port-dst 8081`]);
      expect(await conntrackCount(topo, ['-p', 'tcp', '--orig-dst', EIP, '--orig-port-dst', '8081'])).toBe(0);
    } finally {
      await flow.close();
    }
  }, 60_000);

  it('a floating IP: flushed after a connection, no conntrack without one', async () => {
    await natgw('floating-ip-add', `${EIP2},${ADDR.vpc2}`);
    const flow = await startLongFlow(topo, 'ext', EIP2, 80, FROM_EXT);
    try {
      expect(await flow.check()).toBe(true);
      const r = await counted('floating-ip-del', EIP2);
      expect(r.conntrack).toEqual([`-D --orig-dst ${EIP2}`]);
      expect(await conntrackCount(topo, ['--orig-dst', EIP2])).toBe(0);
    } finally {
      await flow.close();
    }
    await forget(['--orig-dst', EIP2]);
    await natgw('floating-ip-add', `${EIP2},${ADDR.vpc2}`);
    const r = await counted('floating-ip-del', EIP2);
    // Entries other tests left (TIME_WAIT) may still be counted: then the flush runs, and finds nothing of its own.
    if (r.answered[0] === 'count zero') {
      expect(r.conntrack).toEqual([]);
      expect(r.flushes).toEqual({ ran: 0, noEntries: 1 });
    } else expect(r.conntrack).toEqual([`-D --orig-dst ${EIP2}`]);
    expect(await conntrackCount(topo, ['--orig-dst', EIP2])).toBe(0);
  }, 60_000);

  it('a port range: a live flow is flushed by its port (from one listing); without one nothing is deleted', async () => {
    const range = `${EIP},8040-8060,tcp,${ADDR.vpc1},8040-8060`;
    await natgw('dnat-add', range);
    const flow = await startLongFlow(topo, 'ext', EIP, RANGE_PORT, FROM_EXT);
    try {
      expect(await flow.check()).toBe(true);
      const r = await counted('dnat-del', `${EIP},8040-8060,tcp`);
      expect(r.answered).toEqual(['count some']);
      expect(r.conntrack).toEqual(['-L -f ipv4 -o extended', `-D --orig-dst ${EIP} -p tcp --orig-port-dst ${RANGE_PORT}`]);
      expect(r.flushes).toEqual({ ran: 1, noEntries: 0 });
      expect(await conntrackCount(topo, ['-p', 'tcp', '--orig-dst', EIP, '--orig-port-dst', String(RANGE_PORT)])).toBe(0);
    } finally {
      await flow.close();
    }
    await forget(['-p', 'tcp', '--orig-dst', EIP, '--orig-port-dst', String(RANGE_PORT)]);
    await natgw('dnat-add', range);
    const r = await counted('dnat-del', `${EIP},8040-8060,tcp`);
    expect(r.conntrack.filter((c) => c.startsWith('-D'))).toEqual([]);
    expect(r.flushes).toEqual({ ran: 0, noEntries: 1 });
  }, 60_000);
});
