/**
 * The daemon's queue: one job at a time in arrival order; API changes that arrive while
 * another job runs are merged into one transaction, yet each request keeps its own outcome —
 * a conflict or a kernel refusal of one request never fails another.
 */
import { beforeEach, describe, expect, it } from 'vitest';
import request from 'supertest';
import type { Express } from 'express';
import { createApp } from '../../src/api/app.js';
import { SerialQueue, QueueClosedError } from '../../src/engine/queue.js';
import type { Agent } from '../../src/api/agent.js';
import { SystemError } from '../../src/model/errors.js';
import { FakeEngine, fakeAgent } from './fakeEngine.js';
import { waitFor } from '../helpers/poll.js';

describe('SerialQueue', () => {
  it('runs jobs one at a time, in order, each with its own result or error', async () => {
    const q = new SerialQueue();
    const log: string[] = [];
    let running = 0;
    const job =
      (name: string, fail = false) =>
      async () => {
        running++;
        expect(running).toBe(1);
        log.push(`start ${name}`);
        await new Promise((r) => setTimeout(r, 5));
        log.push(`end ${name}`);
        running--;
        if (fail) throw new Error(name);
        return name;
      };
    const results = await Promise.allSettled([q.run(job('a')), q.run(job('b', true)), q.run(job('c'))]);
    expect(results.map((r) => (r.status === 'fulfilled' ? r.value : (r.reason as Error).message))).toEqual(['a', 'b', 'c']);
    expect(log).toEqual(['start a', 'end a', 'start b', 'end b', 'start c', 'end c']);
  });

  it('close() waits for accepted jobs and refuses new ones', async () => {
    const q = new SerialQueue();
    let done = false;
    const running = q.run(async () => {
      await new Promise((r) => setTimeout(r, 20));
      done = true;
    });
    await q.close();
    expect(done).toBe(true);
    await running;
    await expect(q.run(async () => 1)).rejects.toBeInstanceOf(QueueClosedError);
  });
});

describe('merged transactions', () => {
  let engine: FakeEngine;
  let agent: Agent;
  let app: Express;
  beforeEach(async () => {
    engine = await FakeEngine.create();
    engine.applyDelayMs = 30;
    agent = fakeAgent(engine);
    app = createApp({ agent, log: engine.log, bodyLimit: '1mb' });
  });

  const put = (port: number, ip = '10.0.1.6') => request(app).put(`/v1/dnats/172.20.0.10,${port},tcp`).send({ internalIp: ip, internalPort: 80 });

  it('merges concurrent requests into few transactions, each request with its own outcome', async () => {
    await put(1000).expect(201);
    const before = engine.transactions;
    // While an apply is held open (a QoS command: never merged with NAT changes), 20 API requests arrive; one conflicts.
    let release!: () => void;
    engine.gate = new Promise<void>((r) => (release = r));
    const blockerDone = request(app)
      .post('/v1/legacy')
      .send({ command: 'eip-egress-qos-add', rules: ['172.20.0.10,1,10,1'] })
      .then((r) => r);
    await waitFor(async () => engine.transactions > before, { what: 'the blocker to be applying', timeoutMs: 5000, intervalMs: 1 });
    const reqs = [...Array.from({ length: 19 }, (_, i) => put(2000 + i)), put(1000, '10.0.1.99')].map((r) => r.then((x) => x));
    await waitFor(async () => agent.batcher.waiting === 20, { what: 'all 20 requests queued behind the blocker', timeoutMs: 5000, intervalMs: 1 });
    engine.gate = undefined;
    release();
    const results = await Promise.all(reqs);
    expect((await blockerDone).body.status).toBe(0);
    expect(results.slice(0, 19).map((r) => r.status)).toEqual(Array(19).fill(201));
    expect(results[19]!.status).toBe(409);
    expect(engine.state.dnats).toHaveLength(20);
    expect(engine.state.dnats.find((d) => d.port === 1000)?.internalIp).toBe('10.0.1.6');
    // The blocker plus at most a couple of batches, not 20 transactions.
    expect(engine.transactions - before).toBeLessThanOrEqual(4);
    expect(agent.batcher.merged).toBeGreaterThanOrEqual(10);
  });

  it('merges script commands too, each with exactly its own output', async () => {
    await put(1).expect(201);
    const t = engine.transactions;
    const legacy = (command: string, rule: string) =>
      request(app)
        .post('/v1/legacy')
        .send({ command, rules: [rule] });
    const results = await Promise.all([
      legacy('dnat-add', '172.20.0.10,2,tcp,10.0.1.6,80'),
      legacy('dnat-add', '172.20.0.10,1,tcp,10.0.1.7,80'),
      legacy('snat-add', '172.20.0.10,10.0.1.0/24'),
      legacy('dnat-add', '172.20.0.10,3,tcp,10.0.1.6,x'),
      legacy('floating-ip-add', '172.20.0.11,10.0.1.6'),
    ]);
    expect(results.map((r) => r.body.status)).toEqual([0, 1, 0, 1, 0]);
    expect(results[0]!.body).toEqual({ status: 0, stdout: 'dnat-add 172.20.0.10,2,tcp,10.0.1.6,80\n', stderr: '' });
    expect(results[1]!.body.stdout).toMatch(
      /^dnat-add 172\.20\.0\.10,1,tcp,10\.0\.1\.7,80\ndnat \(172\.20\.0\.10, 1, tcp\) already exists: .* but expected 10\.0\.1\.7:80\n$/,
    );
    expect(results[1]!.body.stderr).toBe('');
    expect(engine.transactions - t).toBeLessThanOrEqual(2);
    expect(engine.state.dnats.map((d) => d.port).sort()).toEqual([1, 2]);
    expect(engine.state.fips).toHaveLength(1);
  });

  it('retries each request alone when the merged apply fails, so only the bad one fails', async () => {
    engine.refuse = (s) => (s.dnats.some((d) => d.port === 6666) ? new SystemError('Error: kernel refused port 6666') : undefined);
    await put(1).expect(201);
    const results = await Promise.all([put(2), put(6666), put(3), put(4)]);
    expect(results.map((r) => r.status)).toEqual([201, 500, 201, 201]);
    expect(results[1]!.body).toEqual({ error: 'apply-failed', message: 'Error: kernel refused port 6666' });
    expect(engine.state.dnats.map((d) => d.port).sort((a, b) => a - b)).toEqual([1, 2, 3, 4]);
  });

  it('applies nothing for a batch whose every request was refused', async () => {
    await put(1).expect(201);
    const gen = engine.generation;
    const t = engine.transactions;
    const results = await Promise.all([put(1, '10.0.1.7'), put(1, '10.0.1.8')]);
    expect(results.map((r) => r.status)).toEqual([409, 409]);
    expect(engine.generation).toBe(gen);
    expect(engine.transactions).toBe(t);
  });

  it('applies the requests of a batch in arrival order', async () => {
    const { addDnat, delDnat } = await import('../../src/state/operations.js');
    const d = (ip: string) => ({ eip: '172.20.0.10', port: 7, protocol: 'tcp' as const, internalIp: ip, internalPort: 80 });
    const t = engine.transactions;
    const results = await Promise.allSettled([
      agent.batcher.submit({ guarded: true, qos: false, op: (s) => addDnat(s, d('10.0.1.6')) }),
      agent.batcher.submit({ guarded: true, qos: false, op: (s) => delDnat(s, d('10.0.1.6')) }),
      agent.batcher.submit({ guarded: true, qos: false, op: (s) => addDnat(s, d('10.0.1.9')) }),
      agent.batcher.submit({ guarded: true, qos: false, op: (s) => addDnat(s, d('10.0.1.1')) }),
    ]);
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled', 'rejected']);
    expect(engine.transactions - t).toBe(1);
    expect(engine.state.dnats).toEqual([d('10.0.1.9')]);
  });
});
