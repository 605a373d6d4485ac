/**
 * Active-active replicas as Kube-OVN runs them (issue 30), for real: two natgw replicas with the
 * same rules behind ECMP on both sides (the VPC's default route over their eth0, an upstream
 * router's static ECMP route for the EIPs over their net1, standing in for BGP), conntrackd
 * committing each replica's flows straight into the other's kernel, each replica SNATing into
 * its own port slice.
 *
 * - No gratuitous ARP for the EIPs (a resent eip-add, a link flag change): they are routed.
 * - Failover: long-lived TCP flows through SNAT, DNAT and FIP and UDP sessions through SNAT,
 *   spread over both replicas; one replica is killed (SIGKILL, links down) and, as BFD would,
 *   its next hop leaves both ECMP routes. Every flow survives; the largest gap per flow is
 *   printed. The killed replica then comes back with an empty conntrack table: it reports ready
 *   only once the survivor resent its flows, and once its next hop is back every flow still
 *   answers.
 * - Port slices: many short flows through both replicas with the sync slowed down (so that each
 *   replica picks ports the other does not know yet): with disjoint slices none fails; with
 *   one overlapping range (the control) two replicas give one EIP port to two flows toward the
 *   same server, and flows fail.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { ECMP_ADDR, EcmpTopology } from '../helpers/ecmpTopology.js';
import { percentile, shortFlows, startLongFlows, type FlowRecord, type LongFlows } from '../helpers/ecmpFlows.js';
import { waitFor } from '../helpers/poll.js';
import { parsePeer, request, startEchoServer, startServer, type ServerHandle } from '../helpers/traffic.js';
import { api, ok } from './daemon-util.js';

const EIP_SNAT = '172.20.0.10';
const EIP_DNAT = '172.20.0.11';
const EIP_FIP = '172.20.0.12';
const SLICES = ['0/2', '1/2'];

let topo: EcmpTopology | undefined;
const stoppers: Array<() => void | Promise<void>> = [];
afterEach(async () => {
  for (const s of stoppers.splice(0)) await s();
  await topo?.cleanup();
  topo = undefined;
});

interface Replica {
  readonly i: number;
  logs(): string;
}

async function startReplica(t: EcmpTopology, i: number, env: Record<string, string>): Promise<Replica> {
  const child = t.spawnNatgw(i, env, 'serve');
  let out = '';
  child.stdout?.setEncoding('utf8').on('data', (d: string) => (out += d));
  child.stderr?.setEncoding('utf8').on('data', (d: string) => (out += d));
  let gone = false;
  child.once('exit', () => (gone = true));
  await waitFor(
    async () => {
      if (gone) throw new Error(`natgw serve in g${i} exited: ${out}`);
      return (await api(t.socket(i), 'GET', '/healthz', undefined, {}, 1000)).status === 200;
    },
    { what: `natgw serve in g${i} to answer`, timeoutMs: 20_000, intervalMs: 50 },
  );
  return { i, logs: () => out };
}

async function legacy(t: EcmpTopology, i: number, command: string, ...rules: string[]): Promise<void> {
  const res = ok(await api(t.socket(i), 'POST', '/v1/legacy', { command, rules }), `${command} on g${i}`);
  if (res.body.status !== 0) throw new Error(`${command} ${rules.join(' ')} on g${i}: ${JSON.stringify(res.body)}`);
}

async function configure(t: EcmpTopology, i: number): Promise<void> {
  await legacy(t, i, 'init');
  await legacy(t, i, 'eip-add', `${EIP_SNAT}/24`, `${EIP_DNAT}/24`, `${EIP_FIP}/24`);
  await legacy(t, i, 'snat-add', `${EIP_SNAT},${ECMP_ADDR.vpcCidr},--random-fully`);
  await legacy(t, i, 'dnat-add', `${EIP_DNAT},8080,tcp,${ECMP_ADDR.vpc1},80`);
  await legacy(t, i, 'floating-ip-add', `${EIP_FIP},${ECMP_ADDR.vpc2}`);
}

const ready = async (t: EcmpTopology, i: number): Promise<boolean> => (await api(t.socket(i), 'GET', '/readyz', undefined, {}, 2000)).status === 200;
// eslint-disable-next-line @typescript-eslint/no-explicit-any
const haStatus = async (t: EcmpTopology, i: number): Promise<any> => ok(await api(t.socket(i), 'GET', '/v1/ha'), `GET /v1/ha on g${i}`).body;

async function pair(b: BackendCase, envOf: (i: number) => Record<string, string>): Promise<{ t: EcmpTopology; replicas: Replica[]; logs: () => string }> {
  const t = await EcmpTopology.create(2);
  topo = t;
  const replicas: Replica[] = [];
  for (const i of [0, 1]) replicas.push(await startReplica(t, i, { ...b.env, ...envOf(i) }));
  const logs = () => replicas.map((r) => `--- g${r.i}\n${r.logs()}`).join('\n');
  for (const i of [0, 1]) await configure(t, i);
  await t.routeEips([EIP_SNAT, EIP_DNAT, EIP_FIP]);
  for (const i of [0, 1]) {
    await waitFor(async () => (await ready(t, i)) && (await haStatus(t, i)).health.healthy === true, {
      what: `g${i} ready with sync healthy`,
      timeoutMs: 30_000,
    }).catch(async (e: unknown) => {
      throw new Error(`${(e as Error).message}\n${JSON.stringify(await haStatus(t, i))}\n${logs()}`);
    });
  }
  return { t, replicas, logs };
}

function serve(h: ServerHandle): ServerHandle {
  stoppers.push(() => h.stop());
  return h;
}

function gapSummary(flows: readonly FlowRecord[]): string {
  const gaps = flows.map((f) => f.maxGapMs);
  const worst = [...flows].sort((a, b) => b.maxGapMs - a.maxGapMs).slice(0, 3);
  return `p50 ${percentile(gaps, 50)} ms, p99 ${percentile(gaps, 99)} ms, max ${percentile(gaps, 100)} ms (worst: ${worst.map((f) => `${f.id} ${f.maxGapMs} ms`).join(', ')})`;
}

const sliceOf = (port: number): number => (port >= 33280 ? 1 : 0);

/**
 * A slow sync (this kernel has no netem): both conntrackds paused 150 ms of every 200, so each
 * replica picks ports the other learns of up to 150 ms later.
 */
function stutterSync(t: EcmpTopology): { stop(): Promise<void> } {
  const pids = t.stateDir.map((d) => Number(readFileSync(join(d, 'conntrackd', 'conntrackd.pid'), 'utf8').trim()));
  const signal = (sig: NodeJS.Signals) => {
    for (const p of pids) process.kill(p, sig);
  };
  let running = true;
  const loop = (async () => {
    while (running) {
      signal('SIGSTOP');
      await new Promise((r) => setTimeout(r, 150));
      signal('SIGCONT');
      await new Promise((r) => setTimeout(r, 50));
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
      signal('SIGCONT');
    },
  };
}

describe.each(BACKENDS)('active-active replicas ($name)', (b) => {
  it('every flow survives the loss of one replica; the replica that comes back is ready only once it holds the flows', async () => {
    const { t, logs } = await pair(b, (i) => ({ NATGW_SNAT_PORT_SLICE: SLICES[i] as string }));
    for (const i of [0, 1]) {
      const st = await haStatus(t, i);
      expect({ mode: st.mode, role: st.role, slice: st.snatPortSlice?.spec }).toEqual({ mode: 'active-active', role: 'active', slice: SLICES[i] });
      // A steady gateway is quiet: the sliced SNAT rules and the invalid drop read back as rendered.
      const check = ok(await api(t.socket(i), 'GET', '/v1/status?check=true'), 'status check').body.drift.check;
      expect({ drifted: check.drifted, script: check.script }, `g${i}`).toEqual({ drifted: false, script: '' });
    }
    // No replica announces the EIPs (they are routed): not for a resent eip-add, nor for a link
    // flag change on net1 (promiscuous mode, as tcpdump turns on).
    const capture = t.spawn('rtr', ['timeout', '3', 'tcpdump', '-lnni', 'br-ext', 'arp']);
    let arp = '';
    capture.stdout?.setEncoding('utf8').on('data', (d: string) => (arp += d));
    const captured = new Promise((r) => capture.once('exit', r));
    await new Promise((r) => setTimeout(r, 500));
    for (const i of [0, 1]) await legacy(t, i, 'eip-add', `${EIP_SNAT}/24`, `${EIP_DNAT}/24`, `${EIP_FIP}/24`);
    await t.exec('g1', ['ip', 'link', 'set', 'net1', 'promisc', 'on']);
    await captured;
    const announced = arp.split('\n').filter((l) => [EIP_SNAT, EIP_DNAT, EIP_FIP].some((e) => l.includes(`tell ${e}`) || l.includes(`${e} is-at`)));
    expect(announced, 'gratuitous ARP for an EIP').toEqual([]);
    await Promise.all(
      [
        serve(startEchoServer(t.traffic, 'ext', 9000, ECMP_ADDR.extHost)),
        serve(startServer(t.traffic, 'ext', 'udp', 9001, ECMP_ADDR.extHost)),
        serve(startEchoServer(t.traffic, 'vpc1', 80)),
        serve(startEchoServer(t.traffic, 'vpc2', 7000)),
      ].map((s) => s.ready),
    );
    const groups: LongFlows[] = [];
    const start = async (ns: string, specs: Parameters<typeof startLongFlows>[2], local = '') => {
      const g = await startLongFlows(t, ns, specs, 100, local);
      stoppers.push(() => g.stop());
      groups.push(g);
    };
    await start('vpc1', [
      { name: 'snat', proto: 'tcp', host: ECMP_ADDR.extHost, port: 9000, count: 60 },
      { name: 'snat-udp', proto: 'udp', host: ECMP_ADDR.extHost, port: 9001, count: 20 },
    ]);
    await start('vpc2', [{ name: 'fip-out', proto: 'tcp', host: ECMP_ADDR.extHost, port: 9000, count: 20 }]);
    await start(
      'ext',
      [
        { name: 'dnat', proto: 'tcp', host: EIP_DNAT, port: 8080, count: 40 },
        { name: 'fip', proto: 'tcp', host: EIP_FIP, port: 7000, count: 40 },
      ],
      ECMP_ADDR.extHost,
    );
    const report = async () => (await Promise.all(groups.map((g) => g.report()))).flat();
    // Every flow established and answering (a first SYN-ACK that reached the replica without
    // the state yet was dropped and retransmitted, which takes a second).
    await waitFor(async () => (await report()).every((f) => f.up && f.error === null && (f.sinceLastMs ?? 1e9) < 500), {
      what: 'every flow answering',
      timeoutMs: 20_000,
    }).catch(async (e: unknown) => {
      const bad = (await report()).filter((f) => !f.up || f.error !== null);
      throw new Error(`${(e as Error).message}: ${JSON.stringify(bad.slice(0, 5))}\n${logs()}`);
    });
    const before = await report();
    const snatPorts = before.filter((f) => f.id.startsWith('snat')).map((f) => Number(f.peers[0]?.split(':')[1]));
    const bySlice = [0, 1].map((s) => snatPorts.filter((p) => sliceOf(p) === s).length);
    console.log(`[${b.name}] SNAT flows per replica (by port slice): g0 ${bySlice[0]}, g1 ${bySlice[1]}`);
    // Both replicas translate (ECMP spread the flows), each into its own slice.
    expect(
      bySlice.every((n) => n > 0),
      `SNAT flows through both replicas: ${bySlice}`,
    ).toBe(true);
    // Hairpin (a VPC host reaching a VPC service through its EIP) through the sliced hairpin SNAT.
    const hairpin = await request(t.traffic, 'vpc1', 'tcp', EIP_DNAT, 8080, { timeoutMs: 8000 });
    expect(parsePeer(hairpin).ip, 'hairpin SNAT to the EIP').toBe(EIP_DNAT);
    const udpPeers = new Map(before.filter((f) => f.proto === 'udp').map((f) => [f.id, f.peers.join(',')]));

    await Promise.all(groups.map((g) => g.reset()));
    const killedAt = Date.now();
    await t.killReplica(0);
    // BFD at 100 ms x 3.
    await new Promise((r) => setTimeout(r, 300));
    await t.failNexthop(0);
    await new Promise((r) => setTimeout(r, 4000));
    const after = await report();
    console.log(`[${b.name}] largest gap per flow over the loss of g0 (${Date.now() - killedAt} ms window): ${gapSummary(after)}`);
    console.log(`[${b.name}] per flow: ${after.map((f) => `${f.id}=${f.maxGapMs}`).join(' ')}`);
    const lost = after.filter((f) => f.error !== null || (f.sinceLastMs ?? 1e9) > 1000);
    expect(
      lost.map((f) => `${f.id}: ${f.error ?? `silent ${f.sinceLastMs} ms`}`),
      'flows lost with g0',
    ).toEqual([]);
    // A UDP session kept its translated port through the move.
    for (const f of after.filter((x) => x.proto === 'udp')) expect(f.peers.join(','), f.id).toBe(udpPeers.get(f.id));

    // g0 comes back as a new pod would: links up, an empty conntrack table, natgw started.
    await t.linksUp(0);
    await t.exec('g0', ['conntrack', '-F'], { reject: false });
    const flowsToExt = async (ns: string) =>
      (await t.exec(ns, ['conntrack', '-L', '-p', 'tcp', '--orig-dst', ECMP_ADDR.extHost, '--orig-port-dst', '9000'], { reject: false })).stdout
        .split('\n')
        .filter((l) => l.includes('ESTABLISHED')).length;
    expect(await flowsToExt('g0'), 'the new g0 starts without flows').toBe(0);
    const again = await startReplica(t, 0, { ...b.env, NATGW_SNAT_PORT_SLICE: SLICES[0] as string });
    let readyAt = 0;
    await waitFor(
      async () => {
        if (!(await ready(t, 0))) return false;
        readyAt = Date.now();
        return true;
      },
      { what: 'g0 ready again', timeoutMs: 30_000, intervalMs: 20 },
    ).catch(async (e: unknown) => {
      throw new Error(`${(e as Error).message}\n${JSON.stringify(await haStatus(t, 0))}\n${again.logs()}`);
    });
    const held = await flowsToExt('g0');
    const join = (await haStatus(t, 0)).join;
    console.log(`[${b.name}] g0 rejoined: ${JSON.stringify(join)}; SNAT flows in its kernel when ready: ${held}`);
    expect(join?.state, JSON.stringify(join)).toBe('done');
    expect(held, "g0's kernel holds the established flows when it reports ready").toBeGreaterThanOrEqual(80);
    expect(readyAt).toBeGreaterThan(0);

    await Promise.all(groups.map((g) => g.reset()));
    await t.restoreNexthop(0);
    await new Promise((r) => setTimeout(r, 3000));
    const back = await report();
    console.log(`[${b.name}] largest gap per flow as g0 rejoins ECMP: ${gapSummary(back)}`);
    const lostBack = back.filter((f) => f.error !== null || (f.sinceLastMs ?? 1e9) > 1000);
    expect(
      lostBack.map((f) => `${f.id}: ${f.error ?? `silent ${f.sinceLastMs} ms`}`),
      'flows lost as g0 rejoins',
    ).toEqual([]);
  }, 180_000);

  it('many short flows through both replicas: disjoint port slices never collide; one shared range does', async () => {
    const run = async (slices: readonly string[]) => {
      const { t } = await pair(b, (i) => ({ NATGW_SNAT_PORT_SLICE: slices[i] as string }));
      await serve(startServer(t.traffic, 'ext', 'tcp', 9002, ECMP_ADDR.extHost)).ready;
      const stutter = stutterSync(t);
      const r = await shortFlows(t, 'vpc1', ECMP_ADDR.extHost, 9002, 400, 40, 8000).finally(() => stutter.stop());
      const bySlice = (lo: number) => r.ports.filter((p) => p >= lo && p < lo + 512).length;
      for (const s of stoppers.splice(0)) await s();
      await t.cleanup();
      topo = undefined;
      return {
        ok: r.ok,
        failed: r.failed,
        errors: r.errors,
        low: bySlice(20000),
        high: bySlice(20512),
        p50ms: percentile(r.ms, 50),
        p99ms: percentile(r.ms, 99),
      };
    };
    const disjoint = await run(['20000-20511', '20512-21023']);
    const shared = await run(['20000-20511', '20000-20511']);
    console.log(`[${b.name}] 400 short flows, disjoint slices: ${JSON.stringify(disjoint)}`);
    console.log(`[${b.name}] 400 short flows, one shared range (control): ${JSON.stringify(shared)}`);
    expect(disjoint.low > 0 && disjoint.high > 0, 'flows through both replicas').toBe(true);
    expect({ failed: disjoint.failed, errors: disjoint.errors }).toEqual({ failed: 0, errors: {} });
    expect(shared.failed, 'the control: two replicas gave one port to two flows').toBeGreaterThan(0);
  }, 180_000);
});
