/**
 * kill -9 at random points of a large `PUT /v1/state` (issue 12): after the restart the kernel
 * holds the old state or the new one — never a mix — the persisted state says which, and
 * nothing natgw added is left outside it (the netfilter parts own whole tables, the link part
 * its ownership record, QoS its intent record). The kill points come from a seeded PRNG
 * (printed on failure): a timer here is the fault being injected, not a wait for something to
 * happen.
 *
 * The new state brings QoS to a gateway that has none (egress and ingress EIP rules and a
 * gateway rule: an htb root on net1, the IFB, the ingress qdisc and redirect, classes and
 * filters). Every other round the kill comes while `tc -batch` hangs after a random number of
 * its lines (a wrapper on PATH, test/helpers/faults.ts): after the restart `tc` on net1 and the
 * IFB shows exactly what the old state implies, which is nothing of natgw's.
 *
 * A timed kill lands inside the change: at 5–95 % of the length of the same PUT measured on this
 * run (to a daemon freshly started, as every round's is), and the test asserts that some rounds
 * were killed before the answer arrived (a round killed after it only re-checks persistence).
 *
 * NATGW_CRASH_ROUNDS (default 5) rounds per backend; NATGW_CRASH_OBJECTS (default 5000) DNATs;
 * NATGW_CRASH_SEED (default: the run's property seed, test/setup/propSeed.ts) the kill points.
 */
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, ownedNetfilter, type BackendCase } from '../helpers/backends.js';
import { prng } from '../helpers/prng.js';
import { propSeedFrom } from '../setup/propSeed.js';
import { makeWrappers, type Faults } from '../helpers/faults.js';
import { waitFor } from '../helpers/poll.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const ROUNDS = Number(process.env.NATGW_CRASH_ROUNDS ?? 5);
const OBJECTS = Number(process.env.NATGW_CRASH_OBJECTS ?? 5000);
const SEED = process.env.NATGW_CRASH_SEED ? propSeedFrom(process.env.NATGW_CRASH_SEED) : inject('propSeed');

describe.each(BACKENDS)('kill -9 during a large PUT /v1/state ($name)', (b: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;
  let faults: Faults;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  let oldDoc: any;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  let newDoc: any;
  const kernel: Record<'old' | 'new', string> = { old: '', new: '' };
  const digest: Record<'old' | 'new', string> = { old: '', new: '' };

  const dump = async (): Promise<string> => {
    const addrs = (await topo.exec('gw', ['ip', '-o', '-4', 'addr', 'show', 'dev', 'net1'])).stdout;
    const routes = (await topo.exec('gw', ['ip', 'route', 'show', 'dev', 'eth0'])).stdout;
    const clean = (s: string) =>
      s
        .split('\n')
        .map((l) => l.replace(/\s+valid_lft.*$/, '').replace(/^\d+:\s+/, ''))
        .sort()
        .join('\n');
    const share = (await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'kube-ovn'], { reject: false })).stdout;
    return `${await ownedNetfilter(topo, b)}\n--\n${share}\n--\n${clean(addrs)}\n--\n${clean(routes)}\n--\n${await tcDump()}`;
  };
  /**
   * QoS as `tc` prints it on net1 and the IFB. Numbers the kernel picks anew each time a piece
   * is created (an fq_codel leaf's handle, the mirred action's index) and a counter are masked.
   */
  const tcDump = async (): Promise<string> => {
    const run = async (argv: string[]) => (await topo.exec('gw', argv, { reject: false })).stdout;
    const ifb = (await run(['ip', '-o', 'link', 'show', 'dev', 'ifb-net1'])) === '' ? 'no ifb-net1' : 'ifb-net1 exists';
    // The QoS probe's throwaway device, should a kill have come while it existed.
    const probes = (await run(['ip', '-o', 'link', 'show']))
      .split('\n')
      .filter((l) => l.includes('ngprobe'))
      .map((l) => l.split(':')[1]?.trim());
    const parts = [ifb, `probe devices: ${probes.join(' ')}`];
    for (const dev of ['net1', 'ifb-net1']) {
      for (const what of ['qdisc', 'class', 'filter']) parts.push(`tc ${what} ${dev}:\n${await run(['tc', what, 'show', 'dev', dev])}`);
    }
    parts.push(`tc filter net1 ingress:\n${await run(['tc', 'filter', 'show', 'dev', 'net1', 'ingress'])}`);
    return parts
      .join('\n')
      .replace(/qdisc fq_codel [0-9a-f]+:/g, 'qdisc fq_codel N:')
      .replace(/\bindex \d+/g, 'index N')
      .replace(/direct_packets_stat \d+/g, 'direct_packets_stat N');
  };
  const start = async () => {
    daemon = await startDaemon(topo, { PATH: `${faults.dir}:${process.env.PATH ?? ''}` });
    await waitReady(topo, daemon, 60_000);
  };
  /**
   * The old state as a gateway that never had QoS holds it. An acknowledged QoS rule leaves its
   * shared pieces in place when it goes (SPEC), so after the new state they are taken away by
   * hand, with the daemon stopped, for the next round to create them again.
   */
  const backToPristineOld = async () => {
    ok(await api(sock, 'PUT', '/v1/state', oldDoc), 'back to old');
    await stopDaemon(daemon!, 'SIGTERM');
    daemon = undefined;
    for (const argv of [
      ['tc', 'qdisc', 'del', 'dev', 'net1', 'root'],
      ['tc', 'qdisc', 'del', 'dev', 'net1', 'ingress'],
      ['ip', 'link', 'del', 'ifb-net1'],
    ]) {
      await topo.exec('gw', argv, { reject: false });
    }
    await start();
  };

  beforeAll(async () => {
    faults = makeWrappers();
    topo = await createTopology();
    Object.assign(topo.env, b.env, { GATEWAY_V4: ADDR.extGateway, NATGW_RESYNC_PERIOD: '1h' });
    sock = socketOf(topo);
    await start();
    const init = ok(await api(sock, 'POST', '/v1/legacy', { command: 'init', rules: [] }), 'init');
    expect(init.body.status).toBe(0);
    const base = (await api(sock, 'GET', '/v1/state')).body.desired;
    const eips = (from: number) => Array.from({ length: 20 }, (_, i) => ({ address: `172.20.0.${from + i}`, prefixLength: 24 }));
    const routes = (third: number) => Array.from({ length: 20 }, (_, i) => ({ cidr: `10.${third}.${i}.0/24`, nexthop: ADDR.rtr }));
    oldDoc = {
      desired: {
        ...base,
        eips: eips(10),
        routes: routes(50),
        dnats: [{ eip: '172.20.0.10', port: 80, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 }],
      },
    };
    const dnats = Array.from({ length: OBJECTS }, (_, i) => ({
      eip: `172.20.0.${40 + (i % 20)}`,
      port: 1024 + Math.floor(i / 20),
      protocol: 'tcp',
      internalIp: '10.0.1.6',
      internalPort: 80,
    }));
    newDoc = {
      desired: {
        ...base,
        eips: eips(40),
        routes: routes(60),
        dnats,
        shareDnats: [{ eip: '172.20.0.40', port: 9000, protocol: 'tcp', protocolText: 'tcp', backends: [{ ip: '10.0.1.6', port: 80 }] }],
        eipQos: [
          { direction: 'egress', ip: '172.20.0.40', priority: 1, rate: '10', burst: '1' },
          { direction: 'egress', ip: '172.20.0.41', priority: 1, rate: '20', burst: '1' },
          { direction: 'ingress', ip: '172.20.0.42', priority: 1, rate: '30', burst: '2' },
          { direction: 'ingress', ip: '172.20.0.43', priority: 1, rate: '40', burst: '2' },
        ],
        qos: [
          {
            direction: 'egress',
            dev: 'net1',
            priority: 5,
            classifier: 'u32',
            matchType: 'ip',
            matchDirection: 'dst',
            cidr: '10.0.1.0/24',
            rate: '100',
            burst: '1',
          },
        ],
      },
    };
    const r = ok(await api(sock, 'PUT', '/v1/state', newDoc), 'PUT new');
    digest.new = r.body.digest;
    kernel.new = await dump();
    await backToPristineOld();
    digest.old = (await api(sock, 'GET', '/v1/state')).body.digest;
    kernel.old = await dump();
    expect(kernel.old).not.toBe(kernel.new);
    // The new state brings every shared piece, the old one has none.
    expect(kernel.new).toContain('ifb-net1 exists');
    expect(kernel.new).toMatch(/qdisc htb 1: root/);
    expect(kernel.new).toMatch(/Egress Redirect to device ifb-net1/);
    expect(kernel.old).toContain('no ifb-net1');
    expect(kernel.old).not.toMatch(/htb|ingress ffff:/);
  }, 90_000);

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
    faults?.remove();
  });

  // A round takes 3–4 s here (a kill, a restart, a dump; a new state put back): three times that.
  it(`${ROUNDS} rounds: the kernel is the old or the new state after a restart, as persisted`, { timeout: 30_000 + ROUNDS * 12_000 }, async () => {
    const random = prng(SEED);
    // How long one PUT takes here: the kill points are spread over it.
    const t0 = performance.now();
    ok(await api(sock, 'PUT', '/v1/state', newDoc), 'timing PUT');
    const span = performance.now() - t0;
    await backToPristineOld();
    // How many lines the QoS batch has: a hang stops it after 1 to all of them.
    const tcLines = Number(process.env.NATGW_CRASH_TC_LINES ?? 16);
    const seen: string[] = [];
    let timedRounds = 0;
    let killedBeforeAnswer = 0;
    for (let round = 0; round < ROUNDS; round++) {
      const inTc = round % 2 === 1;
      const at = inTc ? 0 : Math.floor(span * (0.05 + 0.9 * random()));
      const lines = inTc ? 1 + Math.floor(random() * tcLines) : 0;
      if (inTc) faults.arm('tc', 1, 'half-hang', '-batch', '^(qdisc|class|filter) (add|replace|change) ', lines);
      let answered = false;
      const put = api(sock, 'PUT', '/v1/state', newDoc).then(
        () => {
          answered = true;
        },
        () => undefined,
      );
      let beforeAnswer = false;
      try {
        if (inTc) await waitFor(async () => faults.hanging(), { what: `tc -batch hung after ${lines} lines`, timeoutMs: 120_000 });
        else await new Promise((r) => setTimeout(r, at));
        beforeAnswer = !answered;
        await stopDaemon(daemon!, 'SIGKILL');
        daemon = undefined;
      } finally {
        faults.disarm();
        faults.endHung();
      }
      await put;
      if (!inTc) {
        timedRounds++;
        if (beforeAnswer) killedBeforeAnswer++;
      }
      await start();
      // Killed inside tc, the daemon held natgw's lock: the restart takes it over at once (its
      // owner is gone), not ~10 s later when it goes stale, and says so.
      if (inTc) expect(daemon!.logs(), `round ${round}: the dead holder's lock`).toMatch(/lock was held by a process that no longer exists/);
      const persisted = (await api(sock, 'GET', '/v1/state')).body.digest as string;
      const now = await dump();
      const which = now === kernel.old ? 'old' : now === kernel.new ? 'new' : 'mix';
      seen.push(inTc ? `tc+${lines}:${which}` : `${at}ms${beforeAnswer ? '' : '(after the answer)'}:${which}`);
      if (which === 'mix') {
        const lines = (t: string) => new Set(t.split('\n'));
        const [o, n, c] = [lines(kernel.old), lines(kernel.new), lines(now)];
        const odd = [...c]
          .filter((l) => !o.has(l))
          .slice(0, 10)
          .map((l) => `+ ${l}`);
        const missing = [...o]
          .filter((l) => !c.has(l) && !n.has(l))
          .slice(0, 10)
          .map((l) => `- ${l}`);
        seen.push(`\nbeside old:\n${[...odd, ...missing].join('\n')}`);
      }
      expect(which, `round ${round} (seed ${SEED}, ${inTc ? `tc hung after ${lines} lines` : `kill after ${at} ms`}): ${seen.join(' ')}`).not.toBe('mix');
      // A change stopped inside tc was never persisted: the old state, and nothing of the new QoS.
      if (inTc) expect(which, `round ${round}: killed inside tc`).toBe('old');
      expect(persisted, `round ${round}: the persisted state says ${which}`).toBe(digest[which as 'old' | 'new']);
      if (which === 'new') await backToPristineOld();
    }
    console.log(`crash rounds on ${b.name} (span ${Math.round(span)} ms): ${seen.join(' ')}`);
    // The timed kills test a change cut short only if some came before the answer.
    if (timedRounds > 0)
      expect(killedBeforeAnswer, `timed rounds killed before the answer (span ${Math.round(span)} ms): ${seen.join(' ')}`).toBeGreaterThan(0);
  });
});
