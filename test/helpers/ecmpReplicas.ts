/**
 * Active-active replicas on an EcmpTopology, shared by test/netns/ha-active-active.test.ts and
 * bench/failover.ts: natgw started in each replica with the same rules (SNAT, DNAT, FIP), the
 * EIPs routed statically or by BGP, 200 long-lived TCP flows and 20 UDP sessions over them, and
 * a replica killed behind BGP. What they start is registered in `live` for cleanupLive().
 */
import { ECMP_ADDR, EcmpTopology } from './ecmpTopology.js';
import { percentile, startLongFlows, type FlowRecord, type LongFlows } from './ecmpFlows.js';
import { waitFor } from './poll.js';
import { startEchoServer, startServer, type ServerHandle } from './traffic.js';
import { api, ok, waitServing } from '../netns/daemon-util.js';

export const EIP_SNAT = '172.20.0.10';
export const EIP_DNAT = '172.20.0.11';
export const EIP_FIP = '172.20.0.12';

/** What is running, for cleanupLive(). */
export const live: { topo: EcmpTopology | undefined; stoppers: Array<() => void | Promise<void>> } = { topo: undefined, stoppers: [] };

export async function cleanupLive(): Promise<void> {
  for (const s of live.stoppers.splice(0)) await s();
  await live.topo?.cleanup();
  live.topo = undefined;
}

/** A backend case's environment (test/helpers/backends.ts). */
interface BackendEnv {
  readonly env: Readonly<Record<string, string>>;
}

export interface Replica {
  readonly i: number;
  logs(): string;
}

export async function startReplica(t: EcmpTopology, i: number, env: Record<string, string>): Promise<Replica> {
  const child = t.spawnNatgw(i, env, 'serve');
  return { i, logs: await waitServing(child, t.socket(i), `g${i}`) };
}

export async function legacy(t: EcmpTopology, i: number, command: string, ...rules: string[]): Promise<void> {
  const res = ok(await api(t.socket(i), 'POST', '/v1/legacy', { command, rules }), `${command} on g${i}`);
  if (res.body.status !== 0) throw new Error(`${command} ${rules.join(' ')} on g${i}: ${JSON.stringify(res.body)}`);
}

export async function configure(t: EcmpTopology, i: number): Promise<void> {
  await legacy(t, i, 'init');
  await legacy(t, i, 'eip-add', `${EIP_SNAT}/24`, `${EIP_DNAT}/24`, `${EIP_FIP}/24`);
  await legacy(t, i, 'snat-add', `${EIP_SNAT},${ECMP_ADDR.vpcCidr},--random-fully`);
  await legacy(t, i, 'dnat-add', `${EIP_DNAT},8080,tcp,${ECMP_ADDR.vpc1},80`);
  await legacy(t, i, 'floating-ip-add', `${EIP_FIP},${ECMP_ADDR.vpc2}`);
}

export const ready = async (t: EcmpTopology, i: number): Promise<boolean> => (await api(t.socket(i), 'GET', '/readyz', undefined, {}, 2000)).status === 200;
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export const haStatus = async (t: EcmpTopology, i: number): Promise<any> => ok(await api(t.socket(i), 'GET', '/v1/ha'), `GET /v1/ha on g${i}`).body;

export const EIPS = [EIP_SNAT, EIP_DNAT, EIP_FIP];

/**
 * n replicas with the same rules. Routing of the EIPs: a static ECMP route on rtr, or (bgp) the
 * router's BIRD learning them from each replica's BIRD, resolved once rtr's FIB holds every
 * replica as a next hop of every EIP. strictSync: strict reverse-path filtering on each sync0
 * before natgw starts (the topology's default is off everywhere).
 */
export async function pair(
  b: BackendEnv,
  envOf: (i: number) => Record<string, string>,
  opts: { n?: number; bgp?: boolean; strictSync?: boolean } = {},
): Promise<{ t: EcmpTopology; replicas: Replica[]; logs: () => string }> {
  const t = await EcmpTopology.create(opts.n ?? 2);
  live.topo = t;
  const all = [...t.replicas.keys()];
  if (opts.strictSync) for (const i of all) await t.exec(`g${i}`, ['sysctl', '-qw', 'net.ipv4.conf.sync0.rp_filter=1']);
  const router = opts.bgp ? await t.startRouterBgp() : undefined;
  const replicas: Replica[] = [];
  for (const i of all) replicas.push(await startReplica(t, i, { ...b.env, ...(opts.bgp ? EcmpTopology.natgwBgpEnv() : {}), ...envOf(i) }));
  const logs = () => [...replicas.map((r) => `--- g${r.i}\n${r.logs()}`), ...(router ? [`--- rtr bird\n${router.log()}`] : [])].join('\n');
  for (const i of all) await configure(t, i);
  if (router) {
    for (const eip of EIPS) {
      await waitFor(async () => (await t.fibVia(eip)).length === all.length, { what: `${eip} via every replica in rtr's FIB (BGP)`, timeoutMs: 30_000 }).catch(
        async (e: unknown) => {
          throw new Error(`${(e as Error).message}\n${await t.bgpDiagnosis()}\n${logs()}`);
        },
      );
    }
  } else await t.routeEips(EIPS);
  for (const i of all) {
    await waitFor(async () => (await ready(t, i)) && (await haStatus(t, i)).health.healthy === true, {
      what: `g${i} ready with sync healthy`,
      timeoutMs: 30_000,
    }).catch(async (e: unknown) => {
      throw new Error(`${(e as Error).message}\n${JSON.stringify(await haStatus(t, i))}\n${logs()}`);
    });
  }
  return { t, replicas, logs };
}

export function serve(h: ServerHandle): ServerHandle {
  live.stoppers.push(() => h.stop());
  return h;
}

/**
 * 200 long-lived TCP flows (SNAT, FIP outbound, DNAT and FIP inbound) and 20 UDP sessions
 * through SNAT, spread over the replicas by ECMP; resolves once every flow answers.
 */
export async function startFlows(t: EcmpTopology, logs: () => string): Promise<{ groups: LongFlows[]; report: () => Promise<FlowRecord[]> }> {
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
    live.stoppers.push(() => g.stop());
    groups.push(g);
  };
  await start('vpc1', [
    { name: 'snat', proto: 'tcp', host: ECMP_ADDR.extHost, port: 9000, count: 80 },
    { name: 'snat-udp', proto: 'udp', host: ECMP_ADDR.extHost, port: 9001, count: 20 },
  ]);
  await start('vpc2', [{ name: 'fip-out', proto: 'tcp', host: ECMP_ADDR.extHost, port: 9000, count: 20 }]);
  await start(
    'ext',
    [
      { name: 'dnat', proto: 'tcp', host: EIP_DNAT, port: 8080, count: 50 },
      { name: 'fip', proto: 'tcp', host: EIP_FIP, port: 7000, count: 50 },
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
  return { groups, report };
}

export function gapSummary(flows: readonly FlowRecord[]): string {
  const gaps = flows.map((f) => f.maxGapMs);
  const worst = [...flows].sort((a, b) => b.maxGapMs - a.maxGapMs).slice(0, 3);
  return `p50 ${percentile(gaps, 50)} ms, p99 ${percentile(gaps, 99)} ms, max ${percentile(gaps, 100)} ms (worst: ${worst.map((f) => `${f.id} ${f.maxGapMs} ms`).join(', ')})`;
}

/**
 * Replica i killed behind BGP (links down, then SIGKILL: no FIN of its BGP session reaches rtr):
 * rtr's BFD withdraws its routes on its own (timed from the links going down, polled every few ms); the VPC side, which OVN's BFD would handle, is
 * switched by the test 300 ms after the kill. Resolves 4 s after the kill.
 */
export async function killBehindBgp(t: EcmpTopology, i: number): Promise<{ withdrawnMs: number; windowMs: number }> {
  const killedAt = Date.now();
  await t.killReplica(i, true);
  const vpc = new Promise((r) => setTimeout(r, 300)).then(() => t.failVpcNexthop(i));
  await waitFor(async () => (await Promise.all(EIPS.map((e) => t.fibVia(e)))).every((via) => !via.includes(ECMP_ADDR.net1(i))), {
    what: `g${i}'s routes withdrawn from rtr by BFD`,
    timeoutMs: 5000,
    intervalMs: 5,
  });
  const withdrawnMs = Date.now() - killedAt;
  await vpc;
  await new Promise((r) => setTimeout(r, Math.max(0, 4000 - (Date.now() - killedAt))));
  return { withdrawnMs, windowMs: Date.now() - killedAt };
}
