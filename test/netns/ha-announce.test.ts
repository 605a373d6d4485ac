/**
 * Only the active replica announces (issue 30), for real: two replicas on one external segment
 * (ext's neighbour entry for the EIP decides which one receives its traffic) hold the same EIP;
 * a SNAT TCP flow runs through A, the active one. On B, the standby: a flag change of net1
 * (promiscuous on and off), an eip-add of the EIP it holds, `init` again and a restart of its
 * daemon. After each, a capture of what B sends onto the segment shows no gratuitous ARP for the
 * EIP, ext still sends to A's MAC and the flow passes bytes on the same connection. Then a
 * takeover on B announces: the capture sees it and ext's entry moves to B's MAC (the control
 * that shows the capture and the neighbour check can see an announcement).
 */
import type { ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { afterEach, describe, expect, it } from 'vitest';
import { BACKENDS } from '../helpers/backends.js';
import { HA_ADDR, HaTopology } from '../helpers/haTopology.js';
import { waitFor } from '../helpers/poll.js';
import { parsePeer, startEchoServer, startLongFlow } from '../helpers/traffic.js';
import { api, ok } from './daemon-util.js';
import { haStatus, legacy, startReplica, syncEnv, type Replicad } from './ha-util.js';

const EIP = '172.20.0.10';
/**
 * How long each step is watched for an announcement. Not a poll's deadline: the assertion is
 * that nothing comes. arping sends its first packet as it starts, and natgw starts it right
 * after the command's answer (or, at a start, before readiness): 2.5 s covers that with margin.
 */
const WINDOW_MS = 2500;

let topo: HaTopology | undefined;
afterEach(async () => {
  await topo?.cleanup();
  topo = undefined;
});

/** What B sends onto the segment (ext's end of B's link, inbound), ARP only, one line per packet. */
async function captureFromB(t: HaTopology): Promise<{ lines: string[]; child: ChildProcess }> {
  const child = t.spawn('ext', ['tcpdump', '-i', 'e-b', '-Q', 'in', '-n', '-l', 'arp']);
  const lines: string[] = [];
  createInterface({ input: child.stdout! }).on('line', (l) => lines.push(l));
  let err = '';
  child.stderr?.setEncoding('utf8').on('data', (d: string) => (err += d));
  await waitFor(async () => err.includes('listening on'), { what: `tcpdump on e-b to listen (${err})`, timeoutMs: 10_000 });
  return { lines, child };
}

/** A gratuitous ARP for the EIP: a request (arping -U) or a reply that names the EIP as its sender. */
const E = EIP.replaceAll('.', '\\.');
// tcpdump: `Request who-has 172.20.0.10 (ff:ff:ff:ff:ff:ff) tell 172.20.0.10, length 28` (arping -U).
const GARP = new RegExp(`who-has ${E} (\\([^)]*\\) )?tell ${E},|Reply ${E} is-at`);
const isGarp = (l: string): boolean => GARP.test(l);

describe.each(BACKENDS)('only the active replica announces ($name)', (b) => {
  it('standby B sends no gratuitous ARP on a link flag change, a resent eip-add, init or a restart; the flow through A lives; a takeover announces', async () => {
    const t = await HaTopology.create({ sharedExt: true });
    topo = t;
    const envA = { ...b.env, ...syncEnv('ga'), NATGW_HA_INITIAL_ROLE: 'active', NATGW_RESYNC_PERIOD: '5s' };
    const envB = { ...b.env, ...syncEnv('gb'), NATGW_LOG_LEVEL: 'debug', NATGW_RESYNC_PERIOD: '5s' };
    await startReplica(t, 'ga', envA);
    let rb: Replicad = await startReplica(t, 'gb', envB);
    // B first: whatever it might announce, A's announcement comes last.
    for (const r of ['gb', 'ga'] as const) {
      await legacy(t, r, 'init');
      await legacy(t, r, 'eip-add', `${EIP}/24`);
      await legacy(t, r, 'snat-add', `${EIP},${HA_ADDR.vpcCidr},--random-fully`);
    }
    const macA = await t.macOf('ga');
    const macB = await t.macOf('gb');
    await waitFor(async () => (await t.extNeighbour(EIP)) === macA, {
      what: "ext's neighbour entry for the EIP at A's MAC (A's announcement)",
      timeoutMs: 10_000,
    });

    const server = startEchoServer(t.traffic, 'ext', 9000, HA_ADDR.extHost);
    await server.ready;
    const flow = await startLongFlow(t.traffic, 'vpc1', HA_ADDR.extHost, 9000);
    expect(parsePeer(flow.peer).ip).toBe(EIP);
    expect(await flow.check(), 'the flow through A').toBe(true);
    const capture = await captureFromB(t);

    const steps: Array<{ step: string; garps: string[]; neighbourIsA: boolean; flow: boolean }> = [];
    const watch = async (step: string): Promise<void> => {
      const from = capture.lines.length;
      const garps = () => capture.lines.slice(from).filter(isGarp);
      const end = Date.now() + WINDOW_MS;
      while (Date.now() < end && garps().length === 0) await new Promise((r) => setTimeout(r, 100));
      steps.push({ step, garps: garps(), neighbourIsA: (await t.extNeighbour(EIP)) === macA, flow: await flow.check() });
    };

    await t.exec('gb', ['ip', 'link', 'set', 'net1', 'promisc', 'on']);
    await watch('net1 promisc on');
    await t.exec('gb', ['ip', 'link', 'set', 'net1', 'promisc', 'off']);
    await watch('net1 promisc off');
    await legacy(t, 'gb', 'eip-add', `${EIP}/24`);
    await watch('eip-add of the EIP B holds');
    await legacy(t, 'gb', 'init');
    await watch('init again');
    const initQuiet = rb.logs().includes('"why":"init"');

    const pid = ok(await api(t.socket('gb'), 'GET', '/healthz'), 'healthz of B').body.pid as number;
    process.kill(pid, 'SIGTERM');
    await new Promise<void>((r) => (rb.child.exitCode !== null || rb.child.signalCode !== null ? r() : rb.child.once('exit', () => r())));
    rb = await startReplica(t, 'gb', envB);
    await waitFor(async () => (await api(t.socket('gb'), 'GET', '/readyz')).status === 200, { what: 'B ready after its restart', timeoutMs: 20_000 });
    await watch('daemon restart');
    const restartQuiet = rb.logs().includes('"why":"first apply after start"');

    console.log(`[${b.name}] standby steps: ${JSON.stringify(steps)}`);
    expect(steps).toEqual(steps.map((s) => ({ step: s.step, garps: [], neighbourIsA: true, flow: true })));
    // The standby says at debug level what it did not announce.
    expect({ initQuiet, restartQuiet }).toEqual({ initQuiet: true, restartQuiet: true });
    expect((await haStatus(t, 'gb')).role, 'a restarted replica is a standby').toBe('standby');
    expect((await haStatus(t, 'ga')).role, 'NATGW_HA_INITIAL_ROLE=active').toBe('active');

    // The control: a takeover on B announces, and the segment follows it.
    const from = capture.lines.length;
    const takeover = ok(await api(t.socket('gb'), 'POST', '/v1/ha/takeover?reason=test'), 'takeover on B').body;
    expect(takeover.announced).toEqual([EIP]);
    await waitFor(async () => capture.lines.slice(from).some(isGarp), { what: "B's gratuitous ARP in the capture", timeoutMs: 5000 }).catch((e: unknown) => {
      throw new Error(`${(e as Error).message}\ncaptured:\n${capture.lines.join('\n')}`);
    });
    await waitFor(async () => (await t.extNeighbour(EIP)) === macB, { what: "ext's neighbour entry for the EIP moved to B's MAC", timeoutMs: 5000 });
    expect((await haStatus(t, 'gb')).role).toBe('active');

    capture.child.kill('SIGTERM');
    await flow.close();
    await server.stop();
  }, 120_000);
});
