/**
 * The TCP listener's hardening (issue 12): `/readyz` answers only the status (its reasons name
 * interfaces and carry tool stderr); a 5xx body carries a stable message and an error id, the
 * tool's stderr only in the log (the Unix socket, root-local, keeps the full text); a rotated
 * token file takes effect without a restart; connection, header and request limits are set.
 */
import { writeFileSync, utimesSync } from 'node:fs';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import { beforeEach, describe, expect, it } from 'vitest';
import request from 'supertest';
import { createApp } from '../../src/api/app.js';
import type { Agent } from '../../src/api/agent.js';
import { SystemError } from '../../src/model/errors.js';
import { closeServer, listenTcp } from '../../src/daemon/listeners.js';
import { FakeEngine, fakeAgent } from './fakeEngine.js';
import { testTempDir } from '../helpers/tempDir.js';

const SECRET_STDERR = 'Error: iptables-restore: line 3 failed: /var/lib/natgw/secret-path';

let engine: FakeEngine;
let agent: Agent;

beforeEach(async () => {
  engine = await FakeEngine.create();
  agent = fakeAgent(engine);
});

describe('over TCP', () => {
  it('/readyz tells only whether the gateway is ready; the Unix socket keeps the reasons', async () => {
    const tcp = createApp({ agent, log: engine.log, bodyLimit: '64kb', auth: { token: 't0ken' } });
    const unix = createApp({ agent, log: engine.log, bodyLimit: '64kb' });
    agent.setInterfaces(['net1']);
    engine.refuse = () => new SystemError(SECRET_STDERR);
    await agent.resync('start').catch(() => undefined);
    const remote = await request(tcp).get('/readyz').expect(503);
    expect(remote.body).toEqual({ ready: false });
    expect(remote.text).not.toContain('net1');
    expect(remote.text).not.toContain('secret-path');
    const local = await request(unix).get('/readyz').expect(503);
    expect(local.text).toContain('net1');
    expect(local.text).toContain('secret-path');
  });

  it('a 500 carries a stable message and an error id, never the tool stderr', async () => {
    const tcp = createApp({ agent, log: engine.log, bodyLimit: '64kb', auth: { token: 't0ken' } });
    const unix = createApp({ agent, log: engine.log, bodyLimit: '64kb' });
    engine.refuse = () => new SystemError(SECRET_STDERR);
    const body = { internalIp: '10.0.1.6', internalPort: 80 };
    const remote = await request(tcp).put('/v1/dnats/172.20.0.10,8080,tcp').set('Authorization', 'Bearer t0ken').send(body).expect(500);
    expect(remote.body.error).toBe('apply-failed');
    expect(remote.body.message).toMatch(/nothing was applied/);
    expect(remote.body.errorId).toBe(remote.headers['x-request-id']);
    expect(remote.text).not.toContain('secret-path');
    const local = await request(unix).put('/v1/dnats/172.20.0.10,8080,tcp').send(body).expect(500);
    expect(local.body.message).toBe(SECRET_STDERR);
  });

  it('re-reads a rotated token file; an emptied one admits nobody', async () => {
    const dir = testTempDir('natgw-token-');
    const file = join(dir, 'token');
    writeFileSync(file, 'first-token\n');
    const tcp = createApp({ agent, log: engine.log, bodyLimit: '64kb', auth: { token: 'first-token', tokenFile: file } });
    await request(tcp).get('/v1/state').set('Authorization', 'Bearer first-token').expect(200);
    writeFileSync(file, 'second-token-longer\n');
    // Same second on a coarse clock: the size differs, and the mtime is moved on explicitly.
    utimesSync(file, new Date(), new Date(Date.now() + 5000));
    await request(tcp).get('/v1/state').set('Authorization', 'Bearer first-token').expect(401);
    await request(tcp).get('/v1/state').set('Authorization', 'Bearer second-token-longer').expect(200);
    writeFileSync(file, '');
    utimesSync(file, new Date(), new Date(Date.now() + 10_000));
    await request(tcp).get('/v1/state').set('Authorization', 'Bearer second-token-longer').expect(401);
  });

  it('the listener carries the connection, header and request limits', async () => {
    const app = createApp({ agent, log: engine.log, bodyLimit: '64kb', auth: { token: 't0ken' } });
    const server = await listenTcp(app, {
      host: '127.0.0.1',
      port: 0,
      auth: { token: 't0ken' },
      limits: { maxConnections: 7, headersTimeoutMs: 3000, requestTimeoutMs: 9000 },
    });
    try {
      expect(server.maxConnections).toBe(7);
      expect(server.headersTimeout).toBe(3000);
      expect(server.requestTimeout).toBe(9000);
      expect((server.address() as AddressInfo).port).toBeGreaterThan(0);
    } finally {
      await closeServer(server);
    }
  });
});
