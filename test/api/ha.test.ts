/**
 * The replica routes of the API: GET /v1/ha (the digest a peer compares), POST /v1/ha/takeover,
 * the `ha` part of /readyz (reported, never gating readiness), and the TCP listener's auth on them.
 */
import { describe, expect, it } from 'vitest';
import request from 'supertest';
import { createApp } from '../../src/api/app.js';
import type { AppDeps } from '../../src/api/app.js';
import { FakeEngine, fakeAgent } from './fakeEngine.js';

function fakeHa(): NonNullable<AppDeps['ha']> & { calls: string[] } {
  const calls: string[] = [];
  return {
    calls,
    status: async () => ({ enabled: true, digest: 'sha256:abc' }),
    takeover: async (reason) => {
      calls.push(reason);
      return { reason, at: '2026-01-01T00:00:00.000Z', committed: true, announced: ['172.20.0.10'], interface: 'net1', ms: 3 };
    },
    health: () => ({ enabled: true, healthy: false, reasons: ['conntrackd is not running'] }),
    resend: async () => ({ resent: false, flows: 0 }),
  };
}

describe('replica routes', async () => {
  const engine = await FakeEngine.create();
  const agent = fakeAgent(engine);

  it('without the replica part: sync off, the digest of GET /v1/state, takeover 503', async () => {
    const app = createApp({ agent, log: engine.log, bodyLimit: '64kb' });
    const state = await request(app).get('/v1/state').expect(200);
    const ha = await request(app).get('/v1/ha').expect(200);
    expect(ha.body).toEqual({ enabled: false, digest: state.body.digest });
    await request(app).post('/v1/ha/takeover').expect(503);
    const ready = await request(app).get('/readyz');
    expect(ready.body.ha).toBeUndefined();
  });

  it('with it: status, takeover with its reason, sync health beside readiness', async () => {
    const ha = fakeHa();
    const app = createApp({ agent, log: engine.log, bodyLimit: '64kb', ha });
    expect((await request(app).get('/v1/ha').expect(200)).body).toEqual({ enabled: true, digest: 'sha256:abc' });
    const t = await request(app).post('/v1/ha/takeover?reason=bfd-down').expect(200);
    expect(t.body).toEqual({ reason: 'bfd-down', at: '2026-01-01T00:00:00.000Z', committed: true, announced: ['172.20.0.10'], interface: 'net1', ms: 3 });
    expect(ha.calls).toEqual(['bfd-down']);
    const ready = await request(app).get('/readyz');
    expect(ready.body.ha).toEqual({ enabled: true, healthy: false, reasons: ['conntrackd is not running'] });
    // Unhealthy sync does not make the gateway unready: the fake engine's readiness decides alone.
    expect(ready.status).toBe(agent.readiness().ready ? 200 : 503);
  });

  it('over TCP both need the token', async () => {
    const ha = fakeHa();
    const app = createApp({ agent, log: engine.log, bodyLimit: '64kb', ha, auth: { token: 'sekrit' } });
    await request(app).get('/v1/ha').expect(401);
    await request(app).post('/v1/ha/takeover').expect(401);
    await request(app).get('/v1/ha').set('Authorization', 'Bearer sekrit').expect(200);
    expect(ha.calls).toEqual([]);
  });
});
