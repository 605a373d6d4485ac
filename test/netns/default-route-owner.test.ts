/**
 * One owner for the default route (SPEC §5 "A steady gateway is quiet"). An EIP with
 * GATEWAY_V4/GATEWAY_V6 set puts the default route on EXT (eip-add); a subnet route to
 * `0.0.0.0/0` or `::/0` would put it on VPC, and the kernel holds one default route per family.
 * The external default owns it: a subnet route to the default while it holds is refused (status
 * 1 and the conflict on stdout through the shim, 409 through the API), and a state that already
 * holds both (the route came first, or an older natgw wrote it) installs the external default
 * and keeps the route held but not installed, warned about: ten full resyncs in a row repair
 * nothing and `ip monitor route` sees no change, on every backend.
 */
import type { ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { waitFor } from '../helpers/poll.js';
import { api, ok, savedState, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const RESYNCS = 10;
const VPC_HOP = '10.0.1.254';
// A link-local next hop is on-link on eth0 without an IPv6 address there.
const VPC_HOP_V6 = 'fe80::fe';

describe.each(BACKENDS)('one owner for the default route on $name', (b: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;
  let monitor: ChildProcess | undefined;
  let eipAddOut = '';

  const metric = async (re: RegExp): Promise<number> => Number(re.exec((await api(sock, 'GET', '/metrics')).text)?.[1] ?? Number.NaN);
  const fullSyncs = () => metric(/^natgw_syncs_total\{kind="full",outcome="success"\} (\d+)/m);
  const repairs = () => metric(/^natgw_drift_repairs_total (\d+)/m);
  const legacyOk = async (command: string, ...rules: string[]): Promise<string> => {
    const r = ok(await api(sock, 'POST', '/v1/legacy', { command, rules }), command);
    if (r.body.status !== 0 || r.body.stderr !== '') throw new Error(`${command} ${rules.join(' ')}: ${r.text}`);
    return r.body.stdout as string;
  };
  const defaults = async (family: '-4' | '-6'): Promise<string> => (await topo.exec('gw', ['ip', family, 'route', 'show', 'default'])).stdout.trim();

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, b.env, { GATEWAY_V4: topo.addr.extGateway, GATEWAY_V6: topo.addr.extGatewayV6, NATGW_RESYNC_PERIOD: '200ms' });
    sock = socketOf(topo);
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    await legacyOk('init');
    // The routes first (nothing owns the default yet), then the EIP whose gateways take it: the
    // state holds both, as an older natgw left it or a redo in this order makes it.
    await legacyOk('subnet-route-add', `0.0.0.0/0,${VPC_HOP}`, '10.0.2.0/24,10.0.1.254');
    ok(await api(sock, 'PUT', `/v1/routes/${encodeURIComponent('::/0')}`, { nexthop: VPC_HOP_V6 }), 'IPv6 default subnet route');
    expect(await defaults('-4')).toMatch(new RegExp(`^default via ${VPC_HOP} dev eth0`));
    eipAddOut = await legacyOk('eip-add', '172.20.0.10/24');
  }, 120_000);

  afterAll(async () => {
    monitor?.kill('SIGKILL');
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
  });

  it('the external default owns it; eip-add says the subnet route is held but not installed', async () => {
    expect(await defaults('-4')).toMatch(new RegExp(`^default via ${topo.addr.extGateway} dev net1`));
    expect(await defaults('-6')).toMatch(new RegExp(`^default via ${topo.addr.extGatewayV6} dev net1`));
    expect(await defaults('-4')).not.toContain('eth0');
    expect(await defaults('-6')).not.toContain('eth0');
    // The other subnet route is untouched.
    expect((await topo.exec('gw', ['ip', 'route', 'show', '10.0.2.0/24'])).stdout).toContain(`via ${VPC_HOP} dev eth0`);
    expect(eipAddOut).toContain(`Warning: subnet route 0.0.0.0/0 via ${VPC_HOP} is held but not installed`);
    expect(eipAddOut).toContain(`Warning: subnet route ::/0 via ${VPC_HOP_V6} is held but not installed`);
    // Nothing acknowledged is dropped: the state still lists both routes.
    const saved = await savedState(topo);
    expect(saved.routes.map((r: { cidr: string }) => r.cidr).sort()).toEqual(['0.0.0.0/0', '10.0.2.0/24', '::/0']);
    expect(saved.defaultRoutes).toEqual({ v4: topo.addr.extGateway, v6: topo.addr.extGatewayV6 });
  });

  it(`repairs nothing over ${RESYNCS} resyncs, and ip monitor route sees no change`, async () => {
    const first = await fullSyncs();
    await waitFor(async () => (await fullSyncs()) >= first + 1, { what: 'one full resync', timeoutMs: 20_000 });
    let seen = '';
    monitor = topo.spawn('gw', ['ip', 'monitor', 'route']);
    monitor.stdout?.setEncoding('utf8').on('data', (d: string) => (seen += d));
    // A route change of our own, made until it is heard, shows that `ip monitor` listens; its
    // removal, heard last, is where the watch starts.
    let probes = 0;
    await waitFor(
      async () => {
        await topo.exec('gw', ['ip', 'route', 'add', `192.0.2.${++probes}/32`, 'dev', 'lo']);
        return seen.includes('192.0.2.');
      },
      { what: 'ip monitor route to hear a change', timeoutMs: 10_000, intervalMs: 50 },
    );
    for (let i = 1; i <= probes; i++) await topo.exec('gw', ['ip', 'route', 'del', `192.0.2.${i}/32`, 'dev', 'lo']);
    await waitFor(async () => seen.includes(`Deleted 192.0.2.${probes} `), {
      what: 'ip monitor route to hear the probe go',
      timeoutMs: 10_000,
      intervalMs: 20,
    });
    seen = '';
    const base = await repairs();
    const logged = daemon!.logs().length;
    const from = await fullSyncs();
    await waitFor(async () => (await fullSyncs()) >= from + RESYNCS, { what: `${RESYNCS} full resyncs`, timeoutMs: 60_000 });
    expect(seen).toBe('');
    expect(await repairs()).toBe(base);
    const drift = daemon!
      .logs()
      .slice(logged)
      .split('\n')
      .filter((l) => l.includes('resync repaired drift'));
    expect(drift.join('\n')).toBe('');
    // The held routes were logged as warnings once each, not at every resync.
    const warned = daemon!
      .logs()
      .split('\n')
      .filter((l) => l.includes('is held but not installed'));
    expect(warned).toHaveLength(2);
    expect(warned.every((l) => JSON.parse(l).level === 40)).toBe(true);
    expect(await defaults('-4')).toMatch(new RegExp(`^default via ${topo.addr.extGateway} dev net1`));
    expect(await defaults('-6')).toMatch(new RegExp(`^default via ${topo.addr.extGatewayV6} dev net1`));
  }, 120_000);

  it('the status names the held route and why', async () => {
    const status = ok(await api(sock, 'GET', '/v1/status'), 'status').body;
    const warnings = (status.warnings ?? []).join('\n');
    expect(warnings).toContain(`subnet route 0.0.0.0/0 via ${VPC_HOP} is held but not installed`);
    expect(warnings).toContain(`the default route via ${topo.addr.extGateway} dev net1 (GATEWAY_V4) owns it`);
    expect(warnings).toContain(`subnet route ::/0 via ${VPC_HOP_V6} is held but not installed`);
  });

  it('a restart from the persisted state that holds both puts the external default back and stays quiet', async () => {
    await stopDaemon(daemon!, 'SIGKILL');
    daemon = undefined;
    // What the old natgw's last alternation may have left: the subnet routes in the defaults' place.
    await topo.exec('gw', ['ip', 'route', 'replace', '0.0.0.0/0', 'via', VPC_HOP, 'dev', 'eth0']);
    await topo.exec('gw', ['ip', '-6', 'route', 'replace', '::/0', 'via', VPC_HOP_V6, 'dev', 'eth0']);
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    expect(await defaults('-4')).toMatch(new RegExp(`^default via ${topo.addr.extGateway} dev net1`));
    expect(await defaults('-6')).toMatch(new RegExp(`^default via ${topo.addr.extGatewayV6} dev net1`));
    const from = await fullSyncs();
    await waitFor(async () => (await fullSyncs()) >= from + 3, { what: '3 full resyncs', timeoutMs: 30_000 });
    expect(await repairs()).toBe(0);
    expect(await defaults('-4')).not.toContain('eth0');
  }, 120_000);

  it('subnet-route-add to the default is refused through the shim while the external default owns it', async () => {
    const before = await savedState(topo);
    for (const spelling of ['0.0.0.0/0', '0.0.0.0/00', '10.9.8.7/0']) {
      const r = await topo.natgw('subnet-route-add', `10.0.3.0/24,${VPC_HOP}`, `${spelling},10.0.1.253`);
      expect(r.exitCode, r.stdout).toBe(1);
      expect(r.stderr).toBe('');
      expect(r.stdout).toBe(
        `subnet-route-add 10.0.3.0/24,${VPC_HOP} ${spelling},10.0.1.253\n` +
          `subnet route 0.0.0.0/0 via 10.0.1.253 conflicts with the default route via ${topo.addr.extGateway} dev net1 that eip-add installs from GATEWAY_V4, which owns the default: ` +
          'route 0.0.0.0/1 and 128.0.0.0/1 via 10.0.1.253 on eth0 instead, ' +
          'or remove defaultRoutes.v4 from the state (PUT /v1/state) and unset GATEWAY_V4 to hand the default to eth0\n',
      );
    }
    // Nothing half-applied: the other route of the command is not there either.
    expect((await topo.exec('gw', ['ip', 'route', 'show', '10.0.3.0/24'])).stdout).toBe('');
    expect(await savedState(topo)).toEqual(before);
    // A route that is not the default still goes through.
    await topo.natgwOk('subnet-route-add', `0.0.0.0/1,${VPC_HOP}`);
    expect((await topo.exec('gw', ['ip', 'route', 'show', '0.0.0.0/1'])).stdout).toContain(`via ${VPC_HOP} dev eth0`);
    await topo.natgwOk('subnet-route-del', '0.0.0.0/1');
  });

  it('PUT /v1/routes to the default answers 409 with the same message, per family', async () => {
    const r4 = await api(sock, 'PUT', `/v1/routes/${encodeURIComponent('0.0.0.0/0')}`, { nexthop: '10.0.1.253' });
    expect(r4.status).toBe(409);
    expect(r4.body.error).toBe('conflict');
    expect(r4.body.message).toContain(
      `subnet route 0.0.0.0/0 via 10.0.1.253 conflicts with the default route via ${topo.addr.extGateway} dev net1 that eip-add installs from GATEWAY_V4`,
    );
    const r6 = await api(sock, 'PUT', `/v1/routes/${encodeURIComponent('0::0/000')}`, { nexthop: 'fe80::fd' });
    expect(r6.status).toBe(409);
    expect(r6.body.message).toContain(
      `subnet route ::/0 via fe80::fd conflicts with the default route via ${topo.addr.extGatewayV6} dev net1 that eip-add installs from GATEWAY_V6`,
    );
    expect(r6.body.message).toContain('route ::/1 and 8000::/1 via fe80::fd on eth0 instead');
    expect(await defaults('-4')).toMatch(new RegExp(`^default via ${topo.addr.extGateway} dev net1`));
  });

  it('subnet-route-del of the held route succeeds and leaves the external default in place', async () => {
    await topo.natgwOk('subnet-route-del', '0.0.0.0/0');
    expect(await defaults('-4')).toMatch(new RegExp(`^default via ${topo.addr.extGateway} dev net1`));
    const saved = await savedState(topo);
    expect(saved.routes.map((r: { cidr: string }) => r.cidr)).not.toContain('0.0.0.0/0');
  });
});
