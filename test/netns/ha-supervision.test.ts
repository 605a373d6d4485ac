/**
 * Replica sync keeps out of NAT's way, and replicas can tell when they disagree:
 * - conntrackd killed on a replica: natgw reports sync unhealthy, restarts it, is healthy again,
 *   and NAT through that replica works throughout (an established flow and new connections).
 * - replicas with different desired states: natgw_ha_peer_divergent says so on both (each reads
 *   the other's digest over the authenticated TCP API every resync period), and says 0 again
 *   once they agree; the digest is on /metrics (natgw_state_info) and in GET /v1/state.
 */
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { ONE_BACKEND } from '../helpers/backends.js';
import { HA_ADDR, HaTopology } from '../helpers/haTopology.js';
import { waitFor } from '../helpers/poll.js';
import { request, startEchoServer, startLongFlow, startServer } from '../helpers/traffic.js';
import { api, ok, waitForLog } from './daemon-util.js';
import { haStatus, legacy, metric, metricsText, startReplica, syncEnv } from './ha-util.js';

const EIP = '172.20.0.10';

let topo: HaTopology | undefined;
afterEach(async () => {
  await topo?.cleanup();
  topo = undefined;
});

// conntrackd's supervision does not depend on the netfilter backend (ha-failover runs every one).
describe.each(ONE_BACKEND)('conntrackd supervision ($name)', (b) => {
  it('a killed conntrackd is restarted, sync is unhealthy meanwhile, NAT never stops', async () => {
    const t = await HaTopology.create();
    topo = t;
    const a = await startReplica(t, 'ga', { ...b.env, ...syncEnv('ga') });
    await startReplica(t, 'gb', { ...b.env, ...syncEnv('gb') });
    for (const r of ['ga', 'gb'] as const) {
      await legacy(t, r, 'init');
      await legacy(t, r, 'eip-add', `${EIP}/24`);
      await legacy(t, r, 'snat-add', `${EIP},${HA_ADDR.vpcCidr}`);
    }
    await t.routeEips([EIP], 'ga');
    await waitFor(async () => (await haStatus(t, 'ga')).health.healthy === true, { what: 'sync healthy on A', timeoutMs: 20_000 });
    const echo = startEchoServer(t.traffic, 'ext', 9000, HA_ADDR.extHost);
    const srv = startServer(t.traffic, 'ext', 'tcp', 9002, HA_ADDR.extHost);
    await Promise.all([echo.ready, srv.ready]);
    const flow = await startLongFlow(t.traffic, 'vpc1', HA_ADDR.extHost, 9000);

    const before = await haStatus(t, 'ga');
    const pid = before.conntrackd.pid as number;
    expect(pid).toBeGreaterThan(1);
    process.kill(pid, 'SIGKILL');

    // NAT while conntrackd is down or restarting: the established flow and a new connection.
    expect(await flow.check()).toBe(true);
    expect(await request(t.traffic, 'vpc1', 'tcp', HA_ADDR.extHost, 9002)).toMatch(new RegExp(`^peer=${EIP.replace(/\./g, '\\.')}:`));

    const after = await waitFor(
      async () => {
        const s = await haStatus(t, 'ga');
        return s.conntrackd.state === 'running' && s.conntrackd.pid !== pid && s.health.healthy === true ? s : undefined;
      },
      { what: 'conntrackd restarted and sync healthy again', timeoutMs: 20_000 },
    );
    expect(after.conntrackd.restarts).toBe(1);
    expect(after.conntrackd.lastExit.signal).toBe('SIGKILL');
    // The daemon's log travels a pipe that the answer above did not: poll it rather than race it.
    const logged = () => {
      const lines = a.logs().split('\n');
      const unhealthy = lines.findIndex((l) => l.includes('replica sync unhealthy') && l.includes('conntrackd is not running'));
      return {
        exited: lines.findIndex((l) => l.includes('exited; restarting it after a backoff')),
        unhealthy,
        healthyAgain: lines.findIndex((l, i) => i > unhealthy && l.includes('"msg":"replica sync healthy"')),
      };
    };
    await waitFor(async () => logged().healthyAgain >= 0, { what: 'the log to say sync is healthy again', timeoutMs: 5_000 }).catch(() => undefined);
    const { exited, unhealthy, healthyAgain } = logged();
    expect(exited, a.logs()).toBeGreaterThanOrEqual(0);
    expect(unhealthy, a.logs()).toBeGreaterThanOrEqual(0);
    expect(healthyAgain, a.logs()).toBeGreaterThan(unhealthy);
    expect(await metric(t, 'ga', 'natgw_ha_conntrackd_restarts_total')).toBe(1);
    expect(await metric(t, 'ga', 'natgw_ha_sync_healthy')).toBe(1);
    expect(await flow.check()).toBe(true);
    expect(await request(t.traffic, 'vpc1', 'tcp', HA_ADDR.extHost, 9002)).toMatch(/^peer=/);
    await flow.close();
    await echo.stop();
    await srv.stop();
  }, 120_000);
});

describe('replicas that disagree', () => {
  it('natgw_ha_peer_divergent turns 1 on both replicas within a resync period or so, and 0 when they agree again', async () => {
    const t = await HaTopology.create();
    topo = t;
    const token = `tok-${randomBytes(24).toString('hex')}`;
    for (const r of ['ga', 'gb'] as const) writeFileSync(join(t.stateDir[r], 'token'), `${token}\n`, { mode: 0o600 });
    const env = (r: 'ga' | 'gb') => ({
      GATEWAY_NETFILTER_MODE: 'nftables',
      NATGW_RESYNC_PERIOD: '1s',
      NATGW_LISTEN: `${HA_ADDR.sync[r]}:8080`,
      NATGW_TOKEN_FILE: join(t.stateDir[r], 'token'),
      NATGW_HA_PEER_API: `http://${HA_ADDR.sync[r === 'ga' ? 'gb' : 'ga']}:8080`,
    });
    const a = await startReplica(t, 'ga', env('ga'));
    await startReplica(t, 'gb', env('gb'));
    for (const r of ['ga', 'gb'] as const) {
      await legacy(t, r, 'init');
      await legacy(t, r, 'eip-add', `${EIP}/24`);
    }
    const agree = async (want: 0 | 1) => {
      for (const r of ['ga', 'gb'] as const) {
        await waitFor(async () => (await metric(t, r, 'natgw_ha_peer_divergent')) === want && (await metric(t, r, 'natgw_ha_peer_reachable')) === 1, {
          what: `natgw_ha_peer_divergent ${want} on ${r}`,
          timeoutMs: 20_000,
        }).catch(async (e: unknown) => {
          throw new Error(`${(e as Error).message}\n${JSON.stringify(await haStatus(t, r))}\n${a.logs()}`);
        });
      }
    };
    await agree(0);

    // The digest: one value in GET /v1/state, GET /v1/ha and natgw_state_info.
    const doc = ok(await api(t.socket('ga'), 'GET', '/v1/state'), 'GET /v1/state').body;
    expect(doc.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect((await haStatus(t, 'ga')).digest).toBe(doc.digest);
    expect(await metricsText(t, 'ga')).toContain(`natgw_state_info{digest="${doc.digest}"} 1`);
    expect((await haStatus(t, 'gb')).digest).toBe(doc.digest);

    await legacy(t, 'ga', 'dnat-add', `${EIP},8080,tcp,${HA_ADDR.vpc1},80`);
    await agree(1);
    await waitForLog(a, 'replicas disagree');
    // Reported, never repaired: B's state is still without the DNAT.
    expect(ok(await api(t.socket('gb'), 'GET', '/v1/dnats'), 'dnats on B').body.items).toEqual([]);

    await legacy(t, 'gb', 'dnat-add', `${EIP},8080,tcp,${HA_ADDR.vpc1},80`);
    await agree(0);
    await waitForLog(a, 'replicas agree again');

    // SIGUSR2 is the takeover for hooks without HTTP; without conntrackd it announces the EIPs only.
    const pid = ok(await api(t.socket('ga'), 'GET', '/healthz'), 'healthz').body.pid as number;
    process.kill(pid, 'SIGUSR2');
    const took = await waitFor(async () => (await haStatus(t, 'ga')).lastTakeover ?? undefined, { what: 'the SIGUSR2 takeover' });
    expect(took).toMatchObject({ reason: 'SIGUSR2', committed: false, announced: [EIP], interface: 'net1' });
    expect(await metric(t, 'ga', 'natgw_ha_takeovers_total', 'outcome="announced-only"')).toBe(1);
  }, 120_000);
});

describe('a natgw killed outright', () => {
  it('its conntrackd dies with it (parent-death signal), and the next natgw starts its own on the same socket', async () => {
    const t = await HaTopology.create();
    topo = t;
    const env = { GATEWAY_NETFILTER_MODE: 'nftables', ...syncEnv('ga') };
    const first = await startReplica(t, 'ga', env);
    await startReplica(t, 'gb', { GATEWAY_NETFILTER_MODE: 'nftables', ...syncEnv('gb') });
    const old = await waitFor(async () => (await haStatus(t, 'ga')).conntrackd?.pid as number | undefined, { what: 'conntrackd on A' });
    const natgwPid = ok(await api(t.socket('ga'), 'GET', '/healthz'), 'healthz').body.pid as number;
    process.kill(natgwPid, 'SIGKILL');
    await new Promise<void>((r) => (first.child.exitCode !== null || first.child.signalCode !== null ? r() : first.child.once('exit', () => r())));
    const alive = () =>
      readFile(`/proc/${old}/cmdline`, 'utf8').then(
        (c) => c.includes('conntrackd'),
        () => false,
      );
    await waitFor(async () => !(await alive()), { what: 'the conntrackd of the killed natgw to die with it', timeoutMs: 5000 });

    const second = await startReplica(t, 'ga', env);
    const now = await waitFor(
      async () => {
        const s = await haStatus(t, 'ga');
        return s.health.healthy === true ? s : undefined;
      },
      { what: 'sync healthy on the new natgw', timeoutMs: 20_000 },
    );
    expect(now.conntrackd.pid).not.toBe(old);
    expect(now.conntrackd.restarts).toBe(0);
    // Nothing was left for it to stop (where setpriv is missing it stops the orphan by its record).
    expect(second.logs()).not.toContain('stopping a conntrackd left running by an earlier natgw');
  }, 120_000);
});
