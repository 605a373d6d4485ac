/**
 * Replica failover with conntrackd (issue 10), for real: two gateway replicas with the same
 * state, joined to one VPC and one external side and by a sync link; established TCP flows
 * through SNAT with --random-fully, a DNAT and a FIP, and a UDP flow through SNAT, run through
 * replica A; then B takes over (commit of conntrackd's external cache, gratuitous ARP), A's
 * links go down and the routes move to B. With sync every flow continues on the same
 * connection and the same translated port; without sync (the same scenario, the control that
 * shows the test can fail) B holds no state of the SNAT flow and the flow breaks.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { HA_ADDR, HaTopology, type Replica } from '../helpers/haTopology.js';
import { waitFor } from '../helpers/poll.js';
import { parsePeer, startEchoServer, startLongFlow, startServer, type LongFlow, type ServerHandle } from '../helpers/traffic.js';
import { api, ok } from './daemon-util.js';
import { haStatus, legacy, startReplica, startUdpFlow, syncEnv, type Replicad } from './ha-util.js';

const EIP_SNAT = '172.20.0.10';
const EIP_DNAT = '172.20.0.11';
const EIP_FIP = '172.20.0.12';

interface Outcome {
  readonly snat: boolean;
  readonly dnat: boolean;
  readonly fip: boolean;
  /** The UDP flow's answers came back, from the server that saw the same translated port as before. */
  readonly udpSamePort: boolean;
  readonly committed: boolean;
  /** B's kernel holds the SNAT flow with the port A chose. */
  readonly snatEntryOnB: boolean;
  /** How long the takeover took (commit, then queueing the announcements); printed, not asserted. */
  readonly takeoverMs: number;
}

let topo: HaTopology | undefined;
afterEach(async () => {
  await topo?.cleanup();
  topo = undefined;
});

async function configure(t: HaTopology, r: Replica): Promise<void> {
  await legacy(t, r, 'init');
  await legacy(t, r, 'eip-add', `${EIP_SNAT}/24`, `${EIP_DNAT}/24`, `${EIP_FIP}/24`);
  await legacy(t, r, 'snat-add', `${EIP_SNAT},${HA_ADDR.vpcCidr},--random-fully`);
  await legacy(t, r, 'dnat-add', `${EIP_DNAT},8080,tcp,${HA_ADDR.vpc1},80`);
  await legacy(t, r, 'floating-ip-add', `${EIP_FIP},${HA_ADDR.vpc2}`);
}

async function scenario(b: BackendCase, sync: boolean): Promise<Outcome> {
  const t = await HaTopology.create();
  topo = t;
  const replicas: Replicad[] = [];
  for (const r of ['ga', 'gb'] as const) {
    replicas.push(await startReplica(t, r, { ...b.env, NATGW_RESYNC_PERIOD: '5s', ...(sync ? syncEnv(r) : {}) }));
  }
  const logs = () => replicas.map((d) => `--- ${d.r}\n${d.logs()}`).join('\n');
  for (const r of ['ga', 'gb'] as const) await configure(t, r);
  await t.routeEips([EIP_SNAT, EIP_DNAT, EIP_FIP], 'ga');
  if (sync) {
    await waitFor(async () => (await haStatus(t, 'gb')).health.healthy === true, { what: 'sync healthy on B', timeoutMs: 20_000 }).catch((e: unknown) => {
      throw new Error(`${(e as Error).message}\n${logs()}`);
    });
  }

  const servers: ServerHandle[] = [
    startEchoServer(t.traffic, 'ext', 9000, HA_ADDR.extHost),
    startServer(t.traffic, 'ext', 'udp', 9001, HA_ADDR.extHost),
    startEchoServer(t.traffic, 'vpc1', 80),
    startEchoServer(t.traffic, 'vpc2', 7000),
  ];
  await Promise.all(servers.map((s) => s.ready));
  const flows: Record<'snat' | 'dnat' | 'fip', LongFlow> = {
    snat: await startLongFlow(t.traffic, 'vpc1', HA_ADDR.extHost, 9000),
    dnat: await startLongFlow(t.traffic, 'ext', EIP_DNAT, 8080, { localAddress: HA_ADDR.extHost }),
    fip: await startLongFlow(t.traffic, 'ext', EIP_FIP, 7000, { localAddress: HA_ADDR.extHost }),
  };
  const udp = await startUdpFlow(t, 'vpc1', HA_ADDR.extHost, 9001);
  const snatPeer = parsePeer(flows.snat.peer);
  expect(snatPeer.ip).toBe(EIP_SNAT);
  const udpBefore = await udp.send();
  expect(udpBefore, 'the UDP flow answers through A').not.toBeNull();
  const udpPort = parsePeer(udpBefore!).port;
  for (const [name, f] of Object.entries(flows)) expect(await f.check(), `${name} flow through A`).toBe(true);

  if (sync) {
    // B's conntrackd holds A's flows in its external cache: the three TCP flows and the UDP one.
    await waitFor(async () => ((await haStatus(t, 'gb')).sync.stats?.external.active ?? 0) >= 4, {
      what: "A's flows in B's external cache",
      timeoutMs: 15_000,
    }).catch(async (e: unknown) => {
      throw new Error(`${(e as Error).message}\n${JSON.stringify(await haStatus(t, 'gb'))}\n${logs()}`);
    });
  }

  const takeover = ok(await api(t.socket('gb'), 'POST', '/v1/ha/takeover?reason=test'), 'takeover on B').body;
  await t.failover();

  const outcome: Outcome = {
    snat: (await flows.snat.check(8000)) && (await flows.snat.check()),
    dnat: (await flows.dnat.check(8000)) && (await flows.dnat.check()),
    fip: (await flows.fip.check(8000)) && (await flows.fip.check()),
    udpSamePort: await (async () => {
      const a = await udp.send(5000);
      return a !== null && parsePeer(a).port === udpPort;
    })(),
    committed: takeover.committed === true,
    takeoverMs: takeover.ms as number,
    snatEntryOnB: await (async () => {
      const r = await t.exec('gb', ['conntrack', '-L', '-p', 'tcp', '--orig-port-dst', '9000', '--reply-port-dst', String(snatPeer.port)], { reject: false });
      return r.stdout.includes(`dport=${snatPeer.port}`) && r.stdout.includes(`dst=${EIP_SNAT}`);
    })(),
  };
  udp.close();
  for (const f of Object.values(flows)) await f.close();
  await Promise.all(servers.map((s) => s.stop()));
  return outcome;
}

describe.each(BACKENDS)('replica failover ($name)', (b) => {
  it('with conntrackd sync every established flow survives the move to B; without, the SNAT flow breaks', async () => {
    const withSync = await scenario(b, true);
    await topo?.cleanup();
    topo = undefined;
    const withoutSync = await scenario(b, false);
    console.log(`[${b.name}] failover with sync:    ${JSON.stringify(withSync)}`);
    console.log(`[${b.name}] failover without sync: ${JSON.stringify(withoutSync)}`);
    expect({ ...withSync, takeoverMs: 0 }).toEqual({
      snat: true,
      dnat: true,
      fip: true,
      udpSamePort: true,
      committed: true,
      snatEntryOnB: true,
      takeoverMs: 0,
    });
    // The control: the same move without conntrackd's state breaks the flow translated with
    // --random-fully (B picks its own port for it, or none).
    expect({ snat: withoutSync.snat, snatEntryOnB: withoutSync.snatEntryOnB }, 'without sync').toEqual({ snat: false, snatEntryOnB: false });
  }, 90_000);
});
