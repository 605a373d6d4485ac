/**
 * A steady gateway is quiet (SPEC §5): holding every kind of object — dual stack, share DNAT,
 * EIP and gateway QoS, a `0.0.0.0/0` subnet route, `GATEWAY_V6` in a non-canonical spelling —
 * ten full resyncs in a row find nothing to repair (`natgw_drift_repairs_total` unchanged, no
 * "repaired drift" log line), on every backend.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { waitFor } from '../helpers/poll.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const RESYNCS = 10;

describe.each(BACKENDS)('steady state on $name', (b: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;

  const metric = async (re: RegExp): Promise<number> => Number(re.exec((await api(sock, 'GET', '/metrics')).text)?.[1] ?? Number.NaN);
  const fullSyncs = () => metric(/^natgw_syncs_total\{kind="full",outcome="success"\} (\d+)/m);
  const repairs = () => metric(/^natgw_drift_repairs_total (\d+)/m);
  const legacy = async (command: string, ...rules: string[]) => {
    const r = ok(await api(sock, 'POST', '/v1/legacy', { command, rules }), command);
    if (r.body.status !== 0 || r.body.stderr !== '') throw new Error(`${command} ${rules.join(' ')}: ${r.text}`);
  };

  beforeAll(async () => {
    topo = await createTopology();
    // Upper case and a zero run the kernel prints as `fd00:20::1`.
    Object.assign(topo.env, b.env, { GATEWAY_V6: 'FD00:20:0::1', NATGW_RESYNC_PERIOD: '200ms' });
    sock = socketOf(topo);
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    await legacy('init');
    await legacy('eip-add', '172.20.0.10/24');
    await legacy('eip-add', '172.20.0.11/24');
    await legacy('snat-add', '172.20.0.10,10.0.1.0/24');
    await legacy('snat-add', '172.20.0.10,0.0.0.0/0');
    await legacy('dnat-add', '172.20.0.10,8080,tcp,10.0.1.6,80');
    await legacy('floating-ip-add', '172.20.0.11,10.0.1.7');
    await legacy('nft-dnat-map-add', '172.20.0.10,9000,tcp,10.0.1.6:80@10.0.1.7:80');
    await legacy('subnet-route-add', '0.0.0.0/0,10.0.1.254');
    await legacy('subnet-route-add', '10.0.2.0/24,10.0.1.254');
    await legacy('eip-egress-qos-add', '172.20.0.10,1,10,1');
    await legacy('eip-ingress-qos-add', '172.20.0.10,1,20,1');
    await legacy('qos-add', 'egress,net1,5,u32,ip,src,10.0.1.0/24,7,1');
    ok(await api(sock, 'PUT', '/v1/eips/fd00:20::10', { prefixLength: 64 }), 'IPv6 EIP');
    ok(await api(sock, 'PUT', `/v1/snats/fd00:20::10,${encodeURIComponent('fd00:1::/64')}`, {}), 'IPv6 SNAT');
    ok(await api(sock, 'PUT', '/v1/dnats/fd00:20::10,8080,tcp', { internalIp: 'fd00:1::6', internalPort: 80 }), 'IPv6 DNAT');
  }, 120_000);

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
  });

  it(`reports zero repairs over ${RESYNCS} resyncs`, async () => {
    // The first full sync after the commands may settle what they left to it; count from there.
    const first = await fullSyncs();
    await waitFor(async () => (await fullSyncs()) >= first + 1, { what: 'one full resync', timeoutMs: 20_000 });
    const base = await repairs();
    const logged = daemon!.logs().length;
    const from = await fullSyncs();
    await waitFor(async () => (await fullSyncs()) >= from + RESYNCS, { what: `${RESYNCS} full resyncs`, timeoutMs: 60_000 });
    const drift = daemon!
      .logs()
      .slice(logged)
      .split('\n')
      .filter((l) => l.includes('resync repaired drift'));
    expect(drift.join('\n')).toBe('');
    expect(await repairs()).toBe(base);
    // And nothing was lost on the way: every kind is still in the kernel.
    const routes = (await topo.exec('gw', ['ip', 'route', 'show'])).stdout;
    expect(routes).toMatch(/^default via 10\.0\.1\.254 dev eth0/m);
    expect((await topo.exec('gw', ['ip', '-6', 'route', 'show', 'default'])).stdout).toContain('via fd00:20::1 dev net1');
    expect((await topo.exec('gw', ['ip', '-o', 'addr', 'show', 'dev', 'net1'])).stdout).toContain('fd00:20::10/64');
  }, 120_000);

  it('stays quiet once the last share DNAT is gone (its table is still read back at every full sync)', async () => {
    await legacy('nft-dnat-map-del', '172.20.0.10,9000,tcp');
    // The first full sync may delete the stale chain the kernel held a moment.
    const first = await fullSyncs();
    await waitFor(async () => (await fullSyncs()) >= first + 2, { what: 'two full resyncs', timeoutMs: 20_000 });
    const base = await repairs();
    const from = await fullSyncs();
    await waitFor(async () => (await fullSyncs()) >= from + 5, { what: '5 full resyncs', timeoutMs: 60_000 });
    expect(await repairs()).toBe(base);
  }, 120_000);
});
