/**
 * Draining an EIP out of a SNAT pool on the real kernel, for every backend (issue 31): drained
 * with `natgw apply -f`, long-lived flows through the drained EIP keep carrying data, the status
 * (API and `natgw status`) counts them, 100 new connections
 * all leave through the other pool members, and removing the drained EIP from the pool afterwards
 * resets none of the remaining flows.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, REPO_ROOT, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { waitFor } from '../helpers/poll.js';
import { conntrackCount, startEchoServer, startLongFlow, startServer, type LongFlow, type ServerHandle } from '../helpers/traffic.js';
import { api, ok, socketOf, startDaemon, stopDaemon, type Daemon } from './daemon-util.js';

const HOOK_TIMEOUT = 60_000;
const EIP = '172.20.0.10';
const EIP2 = '172.20.0.11';
const EIP3 = '172.20.0.12';
const ECHO_PORT = 7101;
const SERVER_PORT = 7102;
const NEW_CONNECTIONS = 100;
const SNAT_PATH = `/v1/snats/${EIP},${encodeURIComponent(ADDR.vpcCidr)}`;

/**
 * Opens `count` short TCP connections to host:port one after another, each reading the server's
 * `peer=<ip>:<port>` line; prints {"sources": {ip: n}, "failures": n}. Parameters through argv only.
 */
const SEQUENTIAL_CLIENT = `
const net = require('net');
const [host, port, count] = process.argv.slice(1).map((v, i) => (i === 0 ? v : Number(v)));
const sources = {};
let failures = 0;
const one = () => new Promise((resolve) => {
  let data = '';
  const s = net.connect({ host, port });
  const finish = (err) => {
    s.destroy();
    const m = /^peer=(\\S+):\\d+/.exec(data);
    if (err || !m) failures++;
    else sources[m[1]] = (sources[m[1]] || 0) + 1;
    resolve();
  };
  s.setTimeout(5000, () => finish(new Error('timeout')));
  s.on('data', (d) => (data += d));
  s.on('end', () => finish());
  s.on('error', (e) => finish(e));
});
(async () => {
  for (let i = 0; i < count; i++) await one();
  process.stdout.write(JSON.stringify({ sources, failures }) + '\\n');
})();`;

const NATGW_BIN = join(REPO_ROOT, 'bin', 'natgw.js');

const sourceOf = (f: LongFlow): string => /^peer=(\S+):\d+/.exec(f.peer)?.[1] ?? '';

describe.each(BACKENDS)('draining an EIP out of a SNAT pool on $name', (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  const servers: ServerHandle[] = [];
  const flows: LongFlow[] = [];
  const sock = () => socketOf(topo);
  /** The natgw CLI in gw, against the daemon's socket. */
  const cli = (args: readonly string[]) => topo.exec('gw', ['node', NATGW_BIN, ...args], { env: topo.natgwEnv(), reject: false, timeoutMs: 60_000 });

  /** Every long flow still echoes a fresh line end to end. */
  const allFlowing = async (): Promise<boolean[]> => Promise.all(flows.map((f) => f.check(5000)));

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env, { GATEWAY_V4: ADDR.extGateway });
    // A resync every second: the last test waits for one that ran after its change.
    daemon = await startDaemon(topo, { NATGW_RESYNC_PERIOD: '1s' });
    servers.push(startEchoServer(topo, 'ext', ECHO_PORT, ADDR.extHost));
    servers.push(startServer(topo, 'ext', 'tcp', SERVER_PORT, ADDR.extHost));
    await Promise.all(servers.map((s) => s.ready));
    await topo.natgwOk('init');
    await topo.natgwOk('eip-add', `${EIP}/24`, `${EIP2}/24`, `${EIP3}/24`);
    ok(await api(sock(), 'PUT', SNAT_PATH, { eips: [EIP, EIP2, EIP3] }), 'PUT the pool');
  }, HOOK_TIMEOUT);

  afterAll(async () => {
    await Promise.all(flows.map((f) => f.close().catch(() => undefined)));
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    if (daemon) await stopDaemon(daemon);
    await topo?.cleanup();
  }, HOOK_TIMEOUT);

  it('a drained EIP takes no new connection while its established ones carry on, counted in the status', async () => {
    // Connections take the pool's EIPs in turn: six long flows, two through each.
    for (let i = 0; i < 6; i++) flows.push(await startLongFlow(topo, 'vpc1', ADDR.extHost, ECHO_PORT));
    const onDrained = flows.filter((f) => sourceOf(f) === EIP2);
    expect(onDrained.length).toBeGreaterThan(0);
    expect(new Set(flows.map(sourceOf))).toEqual(new Set([EIP, EIP2, EIP3]));

    // Drained through the CLI: `natgw apply -f` updates the SNAT by its identity.
    const file = join(topo.stateDir, 'drain.yaml');
    writeFileSync(file, `snats:\n  - {eip: ${EIP}, cidr: ${ADDR.vpcCidr}, eips: [${EIP}, ${EIP2}, ${EIP3}], draining: [${EIP2}]}\n`);
    const applied = await cli(['apply', '-f', file]);
    expect(applied.stderr).toBe('');
    expect(applied.exitCode, applied.stdout).toBe(0);
    if (backend.iptablesVariant) {
      const nat = await topo.iptablesSave('nat', backend.iptablesVariant);
      expect(nat).toContain(
        `-A SHARED_SNAT -s ${ADDR.vpcCidr} -o net1 -m statistic --mode nth --every 2 --packet 0 -j SNAT --to-source ${EIP}\n` +
          `-A SHARED_SNAT -s ${ADDR.vpcCidr} -o net1 -j SNAT --to-source ${EIP3}`,
      );
    }
    const status = ok(await api(sock(), 'GET', '/v1/status'), 'GET /v1/status').body;
    expect(status.draining).toEqual([{ snat: { eip: EIP, cidr: ADDR.vpcCidr }, eip: EIP2, connections: onDrained.length }]);
    const text = await cli(['status']);
    expect(text.stdout).toContain(
      `Draining:    ${EIP2} out of snat ${EIP},${ADDR.vpcCidr}: ${onDrained.length} connection${onDrained.length === 1 ? '' : 's'} left\n`,
    );

    // The established flows, the drained EIP's included, keep carrying data.
    expect(await allFlowing()).toEqual(flows.map(() => true));

    const r = await topo.exec('vpc1', [process.execPath, '-e', SEQUENTIAL_CLIENT, '--', ADDR.extHost, String(SERVER_PORT), String(NEW_CONNECTIONS)], {
      timeoutMs: 120_000,
    });
    const result = JSON.parse(r.stdout) as { sources: Record<string, number>; failures: number };
    expect(result.failures).toBe(0);
    expect(Object.keys(result.sources).sort()).toEqual([EIP, EIP3]);
    expect((result.sources[EIP] ?? 0) + (result.sources[EIP3] ?? 0)).toBe(NEW_CONNECTIONS);

    // Still flowing after the new connections went around the drained EIP.
    expect(await allFlowing()).toEqual(flows.map(() => true));
    const again = ok(await api(sock(), 'GET', '/v1/status'), 'GET /v1/status').body;
    expect(again.draining?.[0]?.connections).toBe(onDrained.length);
  }, 180_000);

  it('removing the drained EIP from the pool resets none of the remaining flows', async () => {
    const before = await conntrackCount(topo, ['-p', 'tcp', '--orig-port-dst', String(ECHO_PORT)]);
    expect(before).toBe(flows.length);
    ok(await api(sock(), 'PUT', `${SNAT_PATH}?replace=true`, { eips: [EIP, EIP3] }), 'remove EIP2 from the pool');
    expect(await allFlowing()).toEqual(flows.map(() => true));
    expect(await conntrackCount(topo, ['-p', 'tcp', '--orig-port-dst', String(ECHO_PORT), '--state', 'ESTABLISHED'])).toBe(flows.length);
    // Nothing drains any more: the status says nothing of it.
    const status = ok(await api(sock(), 'GET', '/v1/status'), 'GET /v1/status').body;
    expect(status.draining).toBeUndefined();
    // And the daemon's own resync after the change repairs nothing.
    const since = new Date().toISOString();
    const d = await waitFor(
      async () => {
        const drift = ok(await api(sock(), 'GET', '/v1/state'), 'GET /v1/state').body.drift;
        return drift.last && drift.last.at > since ? drift : undefined;
      },
      { what: 'a resync after the change', timeoutMs: 20_000 },
    );
    expect(d.last.repaired).toBe(false);
    expect(await allFlowing()).toEqual(flows.map(() => true));
  }, 60_000);
});
