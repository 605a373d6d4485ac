/**
 * kill -9 at random points of a large `PUT /v1/state` (issue 12): after the restart the kernel
 * holds the old state or the new one — never a mix — the persisted state says which, and
 * nothing natgw added is left outside it (the netfilter parts own whole tables, the link part
 * its ownership record). The kill points come from a seeded PRNG (printed on failure): a timer
 * here is the fault being injected, not a wait for something to happen.
 *
 * NATGW_CRASH_ROUNDS (default 5) rounds per backend; NATGW_CRASH_OBJECTS (default 5000) DNATs.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, ownedNetfilter, type BackendCase } from '../helpers/backends.js';
import { prng } from '../helpers/prng.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const ROUNDS = Number(process.env.NATGW_CRASH_ROUNDS ?? 5);
const OBJECTS = Number(process.env.NATGW_CRASH_OBJECTS ?? 5000);
const SEED = Number(process.env.NATGW_CRASH_SEED ?? 20261130);

describe.each(BACKENDS)('kill -9 during a large PUT /v1/state ($name)', (b: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;
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
    return `${await ownedNetfilter(topo, b)}\n--\n${share}\n--\n${clean(addrs)}\n--\n${clean(routes)}`;
  };
  const start = async () => {
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon, 60_000);
  };

  beforeAll(async () => {
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
      },
    };
    for (const which of ['new', 'old'] as const) {
      const r = ok(await api(sock, 'PUT', '/v1/state', which === 'new' ? newDoc : oldDoc), `PUT ${which}`);
      digest[which] = r.body.digest;
      kernel[which] = await dump();
    }
    expect(kernel.old).not.toBe(kernel.new);
  }, 300_000);

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
  });

  it(`${ROUNDS} rounds: the kernel is the old or the new state after a restart, as persisted`, async () => {
    const random = prng(SEED);
    // How long one PUT takes here: the kill points are spread over it.
    const t0 = performance.now();
    ok(await api(sock, 'PUT', '/v1/state', newDoc), 'timing PUT');
    const span = performance.now() - t0;
    ok(await api(sock, 'PUT', '/v1/state', oldDoc), 'back to old');
    const seen: string[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      const at = Math.floor(random() * span * 2.5);
      const put = api(sock, 'PUT', '/v1/state', newDoc).catch(() => undefined);
      await new Promise((r) => setTimeout(r, at));
      await stopDaemon(daemon!, 'SIGKILL');
      daemon = undefined;
      await put;
      await start();
      const persisted = (await api(sock, 'GET', '/v1/state')).body.digest as string;
      const now = await dump();
      const which = now === kernel.old ? 'old' : now === kernel.new ? 'new' : 'mix';
      seen.push(`${at}ms:${which}`);
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
      expect(which, `round ${round} (seed ${SEED}, kill after ${at} ms): ${seen.join(' ')}`).not.toBe('mix');
      expect(persisted, `round ${round}: the persisted state says ${which}`).toBe(digest[which as 'old' | 'new']);
      if (which === 'new') ok(await api(sock, 'PUT', '/v1/state', oldDoc), 'back to old');
    }
    console.log(`crash rounds on ${b.name} (span ${Math.round(span)} ms): ${seen.join(' ')}`);
  }, 1_800_000);
});
