/**
 * The HTTP API (SPEC §4.2) against createApp() with an in-memory engine: validation (400
 * naming the field), conflicts (409 with exactly the shim's text), idempotent PUT and lenient
 * DELETE, nothing applied on any error, the legacy endpoint, the whole-state document, auth
 * over TCP, the body limit, probes and metrics.
 */
import { beforeEach, describe, expect, it } from 'vitest';
import request from 'supertest';
import type { Express } from 'express';
import { createApp } from '../../src/api/app.js';
import { digestOf } from '../../src/api/stateDoc.js';
import type { Agent } from '../../src/api/agent.js';
import { SystemError } from '../../src/model/errors.js';
import { FakeEngine, fakeAgent } from './fakeEngine.js';

const EIP = '172.20.0.10';
const DNAT_ID = `${EIP},8080,tcp`;

let engine: FakeEngine;
let agent: Agent;
let app: Express;

beforeEach(async () => {
  engine = await FakeEngine.create();
  agent = fakeAgent(engine);
  app = createApp({ agent, log: engine.log, bodyLimit: '64kb' });
});

describe('resources', () => {
  it('creates (201), repeats idempotently (200), lists and gets a DNAT', async () => {
    const body = { internalIp: '10.0.1.6', internalPort: 80 };
    const created = await request(app).put(`/v1/dnats/${DNAT_ID}`).send(body).expect(201);
    expect(created.body).toEqual({ id: DNAT_ID, eip: EIP, port: 8080, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 });
    const gen = engine.generation;
    await request(app).put(`/v1/dnats/${EIP},8080,TCP`).send(body).expect(200);
    expect(engine.state.dnats).toHaveLength(1);
    expect(engine.generation).toBe(gen + 1);

    const list = await request(app).get('/v1/dnats').expect(200);
    expect(list.body.items).toEqual([created.body]);
    await request(app).get(`/v1/dnats/${DNAT_ID}`).expect(200, created.body);
    await request(app).get(`/v1/dnats/${EIP},9999,tcp`).expect(404);
  });

  it("answers 409 with exactly the shim's conflict message, and applies nothing", async () => {
    await request(app).put(`/v1/dnats/${DNAT_ID}`).send({ internalIp: '10.0.1.6', internalPort: 80 }).expect(201);
    const before = structuredClone(engine.state);
    const gen = engine.generation;
    const api = await request(app).put(`/v1/dnats/${DNAT_ID}`).send({ internalIp: '10.0.1.7', internalPort: 81 }).expect(409);
    expect(engine.state).toEqual(before);
    expect(engine.generation).toBe(gen);

    const shim = await request(app)
      .post('/v1/legacy')
      .send({ command: 'dnat-add', rules: [`${DNAT_ID},10.0.1.7,81`] })
      .expect(200);
    expect(shim.body.status).toBe(1);
    const shimLines = (shim.body.stdout as string).split('\n');
    expect(api.body).toEqual({ error: 'conflict', message: shimLines[1] });
    expect(api.body.message).toBe(
      `dnat (${EIP}, 8080, tcp) already exists: -A SHARED_DNAT -d ${EIP}/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.0.1.6:80, but expected 10.0.1.7:81`,
    );
  });

  it("gives a FIP the shim's conflict text too, and replaces a target with ?replace=true", async () => {
    await request(app).put('/v1/fips/172.20.0.11').send({ internalIp: '10.0.1.6' }).expect(201);
    const conflict = await request(app).put('/v1/fips/172.20.0.11').send({ internalIp: '10.0.1.7' }).expect(409);
    const shim = await request(app)
      .post('/v1/legacy')
      .send({ command: 'floating-ip-add', rules: ['172.20.0.11,10.0.1.7'] })
      .expect(200);
    expect(conflict.body.message).toBe((shim.body.stdout as string).split('\n')[1]);

    const replaced = await request(app).put('/v1/fips/172.20.0.11?replace=true').send({ internalIp: '10.0.1.7' }).expect(200);
    expect(replaced.body.internalIp).toBe('10.0.1.7');
    expect(engine.state.fips).toEqual([{ eip: '172.20.0.11', internalIp: '10.0.1.7' }]);
    // The old binding's connections are flushed, as floating-ip-del would.
    expect(engine.effects).toContainEqual({ kind: 'conntrack-flush', dst: '172.20.0.11' });

    await request(app).put(`/v1/dnats/${DNAT_ID}`).send({ internalIp: '10.0.1.6', internalPort: 80 }).expect(201);
    await request(app).put(`/v1/dnats/${DNAT_ID}?replace=true`).send({ internalIp: '10.0.1.7', internalPort: 81 }).expect(200);
    expect(engine.state.dnats[0]).toMatchObject({ internalIp: '10.0.1.7', internalPort: 81 });
  });

  it('answers 400 naming the field and the reason, in the body or the path, and applies nothing', async () => {
    const gen = engine.generation;
    const port = await request(app).put(`/v1/dnats/${DNAT_ID}`).send({ internalIp: '10.0.1.6', internalPort: 70000 }).expect(400);
    expect(port.body).toMatchObject({ error: 'validation', field: 'internalPort', in: 'body' });
    expect(port.body.message).toMatch(/^internalPort: .*65535/);

    const ip = await request(app).put(`/v1/dnats/${DNAT_ID}`).send({ internalIp: '10.0.1.300', internalPort: 80 }).expect(400);
    expect(ip.body).toMatchObject({ field: 'internalIp', message: 'internalIp: must be an IPv4 or IPv6 address' });

    const missing = await request(app).put(`/v1/dnats/${DNAT_ID}`).send({ internalIp: '10.0.1.6' }).expect(400);
    expect(missing.body.field).toBe('internalPort');

    const path = await request(app).put(`/v1/dnats/${EIP},http,tcp`).send({ internalIp: '10.0.1.6', internalPort: 80 }).expect(400);
    expect(path.body).toMatchObject({ field: 'port', in: 'path' });
    const proto = await request(app).put(`/v1/dnats/${EIP},80,icmp`).send({ internalIp: '10.0.1.6', internalPort: 80 }).expect(400);
    expect(proto.body).toMatchObject({ field: 'protocol', in: 'path' });
    const shape = await request(app).put(`/v1/dnats/${EIP},80`).send({ internalIp: '10.0.1.6', internalPort: 80 }).expect(400);
    expect(shape.body).toMatchObject({ field: 'id', in: 'path' });

    const mismatch = await request(app).put(`/v1/dnats/${DNAT_ID}`).send({ port: 9090, internalIp: '10.0.1.6', internalPort: 80 }).expect(400);
    expect(mismatch.body).toMatchObject({ field: 'port', message: "port: '9090' does not match the identity in the path" });

    const notObject = await request(app).put(`/v1/dnats/${DNAT_ID}`).set('content-type', 'application/json').send('[1]').expect(400);
    expect(notObject.body.field).toBe('body');
    const badJson = await request(app).put(`/v1/dnats/${DNAT_ID}`).set('content-type', 'application/json').send('{"internalIp":').expect(400);
    expect(badJson.body.field).toBe('body');
    const v4Prefix = await request(app).put(`/v1/eips/${EIP}`).send({ prefixLength: 33 }).expect(400);
    expect(v4Prefix.body.field).toBe('prefixLength');

    expect(engine.generation).toBe(gen);
    expect(engine.transactions).toBe(0);
  });

  it('deletes leniently (absent is 204) and refuses guarded kinds until init', async () => {
    await request(app).delete(`/v1/dnats/${DNAT_ID}`).expect(204);
    await request(app).put(`/v1/dnats/${DNAT_ID}`).send({ internalIp: '10.0.1.6', internalPort: 80 }).expect(201);
    await request(app).delete(`/v1/dnats/${EIP},8080,TCP`).expect(204);
    expect(engine.state.dnats).toEqual([]);

    engine.initialized = false;
    const guarded = await request(app).put(`/v1/eips/${EIP}`).send({ prefixLength: 24 }).expect(409);
    expect(guarded.body).toEqual({ error: 'not-initialized', message: 'nat gateway not initialized' });
    await request(app).delete(`/v1/eips/${EIP}`).expect(409);
    // QoS is not guarded, as in the script.
    await request(app).put(`/v1/eip-qos/egress,${EIP}`).send({ priority: 1, rate: '10', burst: '1' }).expect(201);
    expect(engine.state.eipQos[0]).toMatchObject({ direction: 'egress', ip: EIP, rate: '10' });
    expect(engine.state.eipQos[0]?.classId).toBeTypeOf('number');
  });

  it('takes CIDR identities with an encoded slash, canonicalised', async () => {
    const r = await request(app).put(`/v1/snats/${EIP},10.0.1.77%2F24`).send({}).expect(201);
    expect(r.body).toMatchObject({ id: `${EIP},10.0.1.0/24`, cidr: '10.0.1.0/24', randomFully: false });
    // Same identity, another randomFully: unchanged, as snat-add; replaced with ?replace=true.
    await request(app).put(`/v1/snats/${EIP},10.0.1.0%2F24`).send({ randomFully: true }).expect(200, r.body);
    await request(app).put(`/v1/snats/${EIP},10.0.1.0%2F24?replace=true`).send({ randomFully: true }).expect(200);
    expect(engine.state.snats).toEqual([{ eip: EIP, cidr: '10.0.1.0/24', randomFully: true }]);
    await request(app).put('/v1/routes/10.0.2.0%2F24').send({ nexthop: '10.0.1.254' }).expect(201);
    await request(app).put('/v1/routes/10.0.2.0%2F24').send({ nexthop: '10.0.1.253' }).expect(200);
    expect(engine.state.routes).toEqual([{ cidr: '10.0.2.0/24', nexthop: '10.0.1.253' }]);
    await request(app).get('/v1/routes/10.0.2.0%2F24').expect(200);
  });

  it('serves every kind: share-DNATs keep the protocol text, QoS rules get ids allocated', async () => {
    const sd = await request(app)
      .put(`/v1/share-dnats/${EIP},9000,TCP`)
      .send({
        backends: [
          { ip: '10.0.1.6', port: 80 },
          { ip: '10.0.1.7', port: 80 },
        ],
      })
      .expect(201);
    expect(sd.body).toMatchObject({ protocol: 'tcp', protocolText: 'TCP' });
    const q = await request(app).put('/v1/qos/egress,net1,10,u32,dst,10.0.1.0%2F24').send({ rate: '100', burst: '2', classId: 5 }).expect(201);
    expect(q.body).toMatchObject({ matchType: 'ip', cidr: '10.0.1.0/24' });
    expect(q.body.classId).toBeGreaterThanOrEqual(0x8000);
    await request(app).put('/v1/qos/egress,net1,20,matchall,,').send({ rate: '50', burst: '1' }).expect(201);
    expect((await request(app).get('/v1/qos').expect(200)).body.items).toHaveLength(2);
    await request(app).delete('/v1/qos/egress,net1,20,matchall,,').expect(204);
    expect(engine.state.qos).toHaveLength(1);
  });
});

describe('POST /v1/legacy', () => {
  it("returns the command's status, stdout and stderr exactly, with HTTP 200 whenever it ran", async () => {
    const ok = await request(app)
      .post('/v1/legacy')
      .send({ command: 'dnat-add', rules: [`${DNAT_ID},10.0.1.6,80`] })
      .expect(200);
    expect(ok.body).toEqual({ status: 0, stdout: `dnat-add ${DNAT_ID},10.0.1.6,80\n`, stderr: '' });
    expect(engine.state.dnats).toHaveLength(1);

    const bad = await request(app)
      .post('/v1/legacy')
      .send({ command: 'dnat-add', rules: [`${EIP},x,tcp,10.0.1.6,80`] })
      .expect(200);
    expect(bad.body.status).toBe(1);
    expect(bad.body.stderr).toBe('');

    const unknown = await request(app).post('/v1/legacy').send({ command: 'frobnicate' }).expect(200);
    expect(unknown.body.status).toBe(1);
    expect(unknown.body.stdout).toMatch(/^Unknown command: frobnicate\n\nUsage:/);

    engine.initialized = false;
    const guarded = await request(app)
      .post('/v1/legacy')
      .send({ command: 'eip-add', rules: [`${EIP}/24`] })
      .expect(200);
    expect(guarded.body).toEqual({ status: 1, stdout: `eip-add ${EIP}/24\n`, stderr: 'nat gateway not initialized\n' });
  });

  it('answers 4xx only for a malformed request', async () => {
    for (const body of [{}, { command: 5 }, { command: 'dnat-add', rules: 'x' }, { command: 'dnat-add', rules: [1] }, { command: 'x', rule: [] }]) {
      const r = await request(app).post('/v1/legacy').send(body).expect(400);
      expect(r.body.error).toBe('validation');
      expect(r.body.field).toBeTruthy();
    }
    await request(app).post('/v1/legacy').send('command=init').expect(400);
  });
});

describe('the whole state', () => {
  it('GET /v1/state has desired, lastApplied, drift, backend, mode, generation and digest', async () => {
    await request(app).put(`/v1/dnats/${DNAT_ID}`).send({ internalIp: '10.0.1.6', internalPort: 80 }).expect(201);
    await agent.resync('test');
    const r = await request(app).get('/v1/state').expect(200);
    expect(r.body).toMatchObject({
      desired: engine.state,
      lastApplied: engine.state,
      backend: { kind: 'iptables', variant: 'legacy' },
      mode: 'auto',
      generation: 2,
      digest: digestOf(engine.state),
      drift: { last: { reason: 'test', repaired: false }, lastRepair: null, repairs: 0 },
    });
    expect(r.headers.etag).toBe(`"${digestOf(engine.state)}"`);
  });

  it('plans without changing anything (dryRun), then replaces in one transaction from the GET document', async () => {
    await request(app).put(`/v1/dnats/${DNAT_ID}`).send({ internalIp: '10.0.1.6', internalPort: 80 }).expect(201);
    const doc = (await request(app).get('/v1/state').expect(200)).body;
    const edited = structuredClone(doc);
    edited.desired.dnats = [];
    edited.desired.fips = [{ eip: '172.20.0.11', internalIp: '10.0.1.7' }];
    edited.desired.snats = [
      { eip: EIP, cidr: '10.0.0.0/16' },
      { eip: EIP, cidr: '10.0.1.0/24' },
    ];
    edited.generation = 999;
    edited.digest = 'ignored';
    const gen = engine.generation;
    const before = structuredClone(engine.state);

    const plan = await request(app).put('/v1/state?dryRun=true').send(edited).expect(200);
    expect(plan.body).toMatchObject({ dryRun: true, plan: { dnats: { added: 0, removed: 1, changed: 0 }, fips: { added: 1 } } });
    expect(plan.body.script).toContain('# would apply');
    expect(engine.state).toEqual(before);
    expect(engine.generation).toBe(gen);

    const applied = await request(app).put('/v1/state').set('If-Match', r(doc.digest)).send(edited).expect(200);
    expect(applied.body.dryRun).toBe(false);
    // The script is a dry run's answer only (SPEC §4.2): a bulk change's would be megabytes.
    expect(applied.body).not.toHaveProperty('script');
    expect(engine.generation).toBe(gen + 1);
    expect(engine.state.dnats).toEqual([]);
    // SNATs are kept longest prefix first, whatever order the document had.
    expect(engine.state.snats.map((s) => s.cidr)).toEqual(['10.0.1.0/24', '10.0.0.0/16']);
    expect(applied.body.digest).toBe(digestOf(engine.state));
    expect(engine.effects).toContainEqual({ kind: 'conntrack-flush', dst: EIP, protocol: 'tcp', port: 8080 });

    // A stale If-Match is refused; so is a state with an identity twice.
    await request(app).put('/v1/state').set('If-Match', r(doc.digest)).send(edited).expect(412);
    const dup = structuredClone(edited);
    dup.desired.fips.push({ eip: '172.20.0.11', internalIp: '10.0.1.8' });
    const d = await request(app).put('/v1/state').send(dup).expect(400);
    expect(d.body).toMatchObject({ field: 'desired.fips[1]' });
    const bad = await request(app)
      .put('/v1/state')
      .send({ desired: { interfaces: { vpc: 'eth0' } } })
      .expect(400);
    expect(bad.body.field).toBe('desired.interfaces.ext');
    expect(engine.generation).toBe(gen + 1);
  });
});

const r = (digest: string) => `"${digest}"`;

describe('limits, auth, probes', () => {
  it('refuses a body over the limit with 413, and applies nothing', async () => {
    const small = createApp({ agent, log: engine.log, bodyLimit: '1kb' });
    const big = { desired: { ...engine.state, routes: Array.from({ length: 100 }, (_, i) => ({ cidr: `10.9.${i}.0/24`, nexthop: '10.0.1.254' })) } };
    const res = await request(small).put('/v1/state').send(big).expect(413);
    expect(res.body.error).toBe('too-large');
    expect(engine.transactions).toBe(0);
  });

  it('over TCP: probes open, everything else 401 without the bearer token, 200 with it', async () => {
    const tcp = createApp({ agent, log: engine.log, bodyLimit: '64kb', auth: { token: 's3cret-token' } });
    await request(tcp).get('/healthz').expect(200);
    const ready = await request(tcp).get('/readyz');
    expect(ready.status).toBe(503);
    for (const path of ['/v1/state', '/metrics', '/v1/dnats', '/v1/openapi.json']) {
      const res = await request(tcp).get(path).expect(401);
      expect(res.body.error).toBe('unauthorized');
      await request(tcp).get(path).set('Authorization', 'Bearer wrong').expect(401);
      await request(tcp).get(path).set('Authorization', 's3cret-token').expect(401);
    }
    await request(tcp).post('/v1/legacy').send({ command: 'help' }).expect(401);
    await request(tcp).get('/v1/state').set('Authorization', 'Bearer s3cret-token').expect(200);
    await request(tcp).post('/v1/legacy').set('Authorization', 'bearer s3cret-token').send({ command: 'help' }).expect(200);
  });

  it('reports ready only with interfaces present and a successful last sync', async () => {
    await request(app).get('/readyz').expect(503);
    agent.setInterfaces([]);
    await request(app).get('/readyz').expect(503);
    await agent.resync('start');
    const ok = await request(app).get('/readyz').expect(200);
    expect(ok.body).toMatchObject({ ready: true, reasons: [] });

    engine.refuse = () => new SystemError('Error: iptables-restore: line 3 failed');
    await expect(agent.resync('periodic')).rejects.toThrow();
    const failed = await request(app).get('/readyz').expect(503);
    expect(failed.body.reasons).toEqual(['last sync failed: Error: iptables-restore: line 3 failed']);
    engine.refuse = () => undefined;
    agent.setInterfaces(['net1']);
    await agent.resync('periodic');
    expect((await request(app).get('/readyz').expect(503)).body.reasons).toEqual(['waiting for interface(s) net1']);
  });

  it('?waitMs= holds /readyz until ready, or answers as without it once the wait is over', async () => {
    // Not ready, nothing changes: the wait runs out and the answer is the 503 with its reasons.
    const t0 = performance.now();
    const timedOut = await request(app).get('/readyz?waitMs=50').expect(503);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(45);
    expect(timedOut.body.reasons).toEqual(['starting']);
    // Ready while the request waits: answered 200 at that moment, well before its wait ends.
    const held = request(app)
      .get('/readyz?waitMs=20000')
      .then((r) => r);
    agent.setInterfaces([]);
    await agent.resync('start');
    const at = performance.now();
    const ok = await held;
    expect(ok.status).toBe(200);
    expect(performance.now() - at).toBeLessThan(10_000);
    // Ready already: no wait at all.
    await request(app).get('/readyz?waitMs=30000').expect(200);
  });

  it('refuses a waitMs that is not a whole number of milliseconds up to 30 s', async () => {
    for (const bad of ['-1', '1.5', 'soon', '30001', '']) {
      const res = await request(app).get(`/readyz?waitMs=${bad}`).expect(400);
      expect(res.body.message).toContain('waitMs');
    }
  });

  it('exports the sync metrics', async () => {
    await request(app).put(`/v1/dnats/${DNAT_ID}`).send({ internalIp: '10.0.1.6', internalPort: 80 }).expect(201);
    engine.refuse = () => new Error('no');
    await request(app).put(`/v1/dnats/${EIP},8081,tcp`).send({ internalIp: '10.0.1.6', internalPort: 80 }).expect(500);
    const m = (await request(app).get('/metrics').expect(200)).text;
    expect(m).toMatch(/natgw_syncs_total\{kind="partial",outcome="success"\} 1/);
    expect(m).toMatch(/natgw_syncs_total\{kind="partial",outcome="failure"\} 1/);
    expect(m).toMatch(/natgw_sync_failures_total 1/);
    expect(m).toMatch(/natgw_sync_duration_seconds_count 2/);
    expect(m).toMatch(/natgw_objects\{kind="dnats"\} 1/);
    expect(m).toMatch(/natgw_drift_repairs_total 0/);
  });

  it('answers unknown routes with a JSON 404', async () => {
    const res = await request(app).get('/v1/nope').expect(404);
    expect(res.body.error).toBe('not-found');
  });
});
