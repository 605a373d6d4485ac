/**
 * GET /v1/status against createApp() with an in-memory engine: counts per kind desired and
 * applied, the last sync's kind, and a drift check that applies nothing.
 */
import { beforeEach, describe, expect, it } from 'vitest';
import request from 'supertest';
import type { Express } from 'express';
import { createApp } from '../../src/api/app.js';
import type { Agent } from '../../src/api/agent.js';
import { FakeEngine, fakeAgent } from './fakeEngine.js';

let engine: FakeEngine;
let agent: Agent;
let app: Express;

beforeEach(async () => {
  engine = await FakeEngine.create();
  agent = fakeAgent(engine);
  app = createApp({ agent, log: engine.log, bodyLimit: '64kb' });
});

describe('GET /v1/status', () => {
  it('counts desired and applied objects per kind and reports the last sync', async () => {
    await request(app).put('/v1/dnats/172.20.0.10,8080,tcp').send({ internalIp: '10.0.1.6', internalPort: 80 }).expect(201);
    const s = (await request(app).get('/v1/status').expect(200)).body;
    expect(s.objects.dnats).toEqual({ desired: 1, applied: 1 });
    expect(s.objects.eips).toEqual({ desired: 0, applied: 0 });
    expect(s.inSync).toBe(true);
    expect(s.digest).toBe(s.appliedDigest);
    expect(s.generation).toBe(engine.generation);
    expect(s.lastSync).toMatchObject({ ok: true, kind: 'partial', ms: expect.any(Number) });
    expect(s.drift).toEqual({ repairs: 0, last: null, lastRepair: null });
    expect(s).not.toHaveProperty('drift.check');
  });

  it('runs a drift check on request only, changing nothing', async () => {
    await request(app).put('/v1/dnats/172.20.0.10,8080,tcp').send({ internalIp: '10.0.1.6', internalPort: 80 }).expect(201);
    const gen = engine.generation;
    const state = structuredClone(engine.state);
    const s = (await request(app).get('/v1/status?check=true').expect(200)).body;
    expect(s.drift.check).toMatchObject({ drifted: expect.any(Boolean), changes: expect.any(Object) });
    expect(engine.generation).toBe(gen);
    expect(engine.state).toEqual(state);
    const bad = await request(app).get('/v1/status?check=maybe').expect(400);
    expect(bad.body).toMatchObject({ error: 'validation', field: 'check' });
  });

  it('lists SNAT port usage per EIP while connections are followed, and nothing before', async () => {
    expect((await request(app).get('/v1/status').expect(200)).body).not.toHaveProperty('snatPorts');
    const usage = [
      { eip: '172.20.0.10', destinations: 1, maxPorts: 10, maxShare: 1, top: [{ ip: '172.20.0.100', port: 7002, protocol: 'udp', ports: 10, share: 1 }] },
    ];
    let following = false;
    const watched = createApp({ agent, log: engine.log, bodyLimit: '64kb', portUsage: () => (following ? usage : undefined) });
    expect((await request(watched).get('/v1/status').expect(200)).body).not.toHaveProperty('snatPorts');
    following = true;
    expect((await request(watched).get('/v1/status').expect(200)).body.snatPorts).toEqual(usage);
  });
});
