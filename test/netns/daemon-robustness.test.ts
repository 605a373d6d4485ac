/**
 * The daemon's edges: one daemon per socket; late interfaces (not ready, logged, then ready
 * on the link event without any command); link events repair at once even with a long
 * resync period, and a dead link monitor is restarted; SIGTERM finishes the accepted
 * changes, persists every acknowledged one and exits 0.
 */
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { waitFor } from '../helpers/poll.js';
import { childrenOf } from '../helpers/procs.js';
import { api, ok, savedState, socketOf, startDaemon, stopDaemon, waitForLog, waitReady, type ApiResponse, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';

/** Children of `pid` whose command line contains `word` (the daemon's `ip monitor`). */
const monitorsOf = (pid: number, word: string): number[] => childrenOf(pid, (argv) => argv.includes(word));

describe('daemon robustness', () => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;

  beforeAll(async () => {
    topo = await createTopology({ lateExternal: true });
    Object.assign(topo.env, { GATEWAY_V4: ADDR.extGateway, NATGW_INTERFACE_WAIT_TIMEOUT: '1s', NATGW_RESYNC_PERIOD: '1h' });
    sock = socketOf(topo);
  });
  afterEach(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    daemon = undefined;
  });
  afterAll(async () => {
    await topo?.cleanup();
  });

  it('waits for a late interface past the deadline, not ready, then gets ready on its own', async () => {
    daemon = await startDaemon(topo);
    // The API answers at once, while the interface is missing.
    const early = await api(sock, 'GET', '/readyz');
    expect(early.status).toBe(503);
    await waitFor(async () => daemon!.logs().includes('interfaces still missing after the deadline'), { what: 'the deadline log line', timeoutMs: 10_000 });
    const notReady = await api(sock, 'GET', '/readyz');
    expect(notReady.status).toBe(503);
    expect(notReady.body.reasons.join(' ')).toContain('net1');

    await topo.attachExternal();
    await waitReady(topo, daemon, 10_000);
    // Refuses a second daemon on the same socket, leaving the first serving.
    const second = await topo.natgw('serve');
    expect(second.exitCode).not.toBe(0);
    expect(second.stderr).toContain('another natgw daemon is serving');
    expect((await api(sock, 'GET', '/healthz')).body.pid).toBe(daemon.pid);
  });

  it('repairs a recreated net1 on the link event (period 1h), also after its link monitor died', async () => {
    daemon = await startDaemon(topo);
    ok(await api(sock, 'POST', '/v1/legacy', { command: 'init', rules: [] }), 'init');
    ok(await api(sock, 'PUT', `/v1/eips/${EIP}`, { prefixLength: 24 }), 'eip');
    await waitReady(topo, daemon);

    const monitors = await waitFor(
      async () => {
        const m = monitorsOf(daemon!.pid, 'monitor');
        return m.length === 1 ? m : undefined;
      },
      { what: "the daemon's ip monitor" },
    );
    process.kill(monitors[0]!, 'SIGKILL');
    await waitFor(
      async () => {
        const m = monitorsOf(daemon!.pid, 'monitor');
        return m.length === 1 && m[0] !== monitors[0];
      },
      { what: 'a new ip monitor', timeoutMs: 10_000 },
    );
    await waitForLog(daemon, 'link monitor exited; restarting');

    await topo.recreateExternal();
    await waitFor(async () => (await topo.addresses('gw', 'net1', 4))?.includes(`${EIP}/24`), {
      what: 'the EIP back on the new net1',
      timeoutMs: 5000,
      intervalMs: 50,
    });
    // The route follows the address in the same `ip -batch`: seen a moment later, not at once.
    await waitFor(async () => (await topo.exec('gw', ['ip', '-4', 'route', 'show', 'default'])).stdout.includes(`via ${ADDR.extGateway} dev net1`), {
      what: 'the default route back via net1',
      timeoutMs: 5000,
      intervalMs: 50,
    });
  });

  it('on SIGTERM finishes accepted changes, persists every acknowledged one and exits 0', async () => {
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    const put = (i: number) =>
      api(sock, 'PUT', `/v1/dnats/${EIP},${20000 + i},tcp`, { internalIp: ADDR.vpc1, internalPort: 80 }).then(
        (r): ApiResponse | string => r,
        (e: unknown) => String((e as Error).message),
      );
    const first = put(0);
    const rest = Array.from({ length: 29 }, (_, i) => put(i + 1));
    await first;
    process.kill(daemon.pid, 'SIGTERM');
    // Keep asking while it shuts down: each answer is either an acknowledged (and persisted)
    // change or a refusal that applied nothing.
    let gone = false;
    void daemon.exited.then(() => (gone = true));
    const late: Promise<ApiResponse | string>[] = [];
    for (let i = 30; !gone && i < 200; i++) {
      late.push(put(i));
      await late[late.length - 1];
    }
    const results = [await first, ...(await Promise.all(rest)), ...(await Promise.all(late))];
    expect(await daemon.exited).toBe(0);
    daemon = undefined;

    const saved = await savedState(topo);
    const ports = new Set<number>(saved.dnats.map((d: { port: number }) => d.port));
    let acknowledged = 0;
    results.forEach((r, i) => {
      if (typeof r !== 'string' && (r.status === 201 || r.status === 200)) {
        acknowledged++;
        expect(ports.has(20000 + i), `acknowledged dnat ${20000 + i} persisted`).toBe(true);
      } else {
        if (typeof r !== 'string') expect(r.status, r.text).toBe(503);
        else expect(r).toMatch(/ECONNREFUSED|ENOENT|ECONNRESET|EPIPE|socket hang up/);
        expect(ports.has(20000 + i), `refused dnat ${20000 + i} not applied`).toBe(false);
      }
    });
    expect(acknowledged).toBeGreaterThanOrEqual(1);
  });

  it('exits 1 when its TCP port is taken (after starting to sync), and frees the socket for the next daemon', async () => {
    const port = 20_000 + Math.floor(Math.random() * 20_000);
    const holder = topo.spawn('gw', ['nc', '-l', '-k', '127.0.0.1', String(port)]);
    const tokenFile = join(topo.stateDir, 'api-token');
    writeFileSync(tokenFile, randomBytes(32).toString('hex'), { mode: 0o600 });
    try {
      await waitFor(async () => (await topo.exec('gw', ['ss', '-Hltn', `sport = :${port}`])).stdout.includes(`:${port}`), {
        what: `nc listening on 127.0.0.1:${port}`,
      });
      Object.assign(topo.env, { NATGW_LISTEN: `127.0.0.1:${port}`, NATGW_TOKEN_FILE: tokenFile });
      const r = await topo.natgw('serve');
      expect(r.exitCode).toBe(1);
      expect(r.stderr).toMatch(/^Error: .*EADDRINUSE/);
    } finally {
      delete topo.env.NATGW_LISTEN;
      delete topo.env.NATGW_TOKEN_FILE;
      holder.kill('SIGKILL');
    }
    daemon = await startDaemon(topo);
    expect((await api(sock, 'GET', '/healthz')).body.pid).toBe(daemon.pid);
  });
});
