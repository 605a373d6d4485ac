/**
 * The bulk PUT's timeline (src/system/timeline.ts): at debug level, one log line per
 * PUT /v1/state with its steps in the order the request went through them, wall and CPU
 * milliseconds never decreasing, and one per command (PUT or DELETE of a resource); at any
 * other level no line and no marks.
 */
import { Writable } from 'node:stream';
import pino from 'pino';
import request from 'supertest';
import { describe, expect, it } from 'vitest';
import { createApp } from '../../src/api/app.js';
import { timelineEnabled } from '../../src/system/timeline.js';
import { waitFor } from '../helpers/poll.js';
import { FakeEngine, fakeAgent } from './fakeEngine.js';

interface Step {
  readonly step: string;
  readonly wallMs: number;
  readonly cpuMs: number;
}

function capture(level: string): { log: pino.Logger; lines: () => Array<Record<string, unknown>> } {
  const out: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      out.push(...chunk.toString('utf8').split('\n').filter(Boolean));
      done();
    },
  });
  return { log: pino({ level }, sink), lines: () => out.map((l) => JSON.parse(l) as Record<string, unknown>) };
}

const DOC = {
  eips: [{ address: '172.20.0.10', prefixLength: 24 }],
  dnats: [{ eip: '172.20.0.10', port: 80, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8080 }],
};

describe('bulk PUT timeline', () => {
  it('at debug level: one line per PUT /v1/state, its steps in order', async () => {
    const engine = await FakeEngine.create();
    const { log, lines } = capture('debug');
    const app = createApp({ agent: fakeAgent(engine), log, bodyLimit: '1mb' });
    expect(timelineEnabled()).toBe(true);
    const base = (await request(app).get('/v1/state').expect(200)).body.desired;
    await request(app)
      .put('/v1/state')
      .send({ ...base, ...DOC, initialized: true })
      .expect(200);
    const line = await waitFor(async () => lines().find((l) => l.msg === 'bulk PUT timeline (ms since the request: wall, CPU)'), {
      what: 'the timeline line',
      intervalMs: 5,
    });
    const steps = line.steps as Step[];
    const names = steps.map((s) => s.step);
    // The request's own steps, in this order (the real engine's and the tools' come between validated and transacted).
    const mine = names.filter((n) => ['request', 'body in', 'parsed', 'validated', 'transacted', 'answered'].includes(n));
    expect(mine).toEqual(['request', 'body in', 'parsed', 'validated', 'transacted', 'answered']);
    for (let i = 1; i < steps.length; i++) {
      expect(steps[i]!.wallMs).toBeGreaterThanOrEqual(steps[i - 1]!.wallMs);
      expect(steps[i]!.cpuMs).toBeGreaterThanOrEqual(steps[i - 1]!.cpuMs);
    }
    expect(typeof line.startUs).toBe('number');
    // Other routes have none.
    await request(app).get('/v1/dnats').expect(200);
    expect(lines().filter((l) => l.msg === 'bulk PUT timeline (ms since the request: wall, CPU)')).toHaveLength(1);
  });

  it('at debug level: one line per command (PUT or DELETE of a resource), none for a read', async () => {
    const engine = await FakeEngine.create();
    const { log, lines } = capture('debug');
    const app = createApp({ agent: fakeAgent(engine), log, bodyLimit: '1mb' });
    const base = (await request(app).get('/v1/state').expect(200)).body.desired;
    await request(app)
      .put('/v1/state')
      .send({ ...base, eips: DOC.eips, initialized: true })
      .expect(200);
    const commands = () => lines().filter((l) => l.msg === 'command timeline (ms since the request: wall, CPU)');
    await request(app).put('/v1/dnats/172.20.0.10,81,tcp').send({ internalIp: '10.0.1.6', internalPort: 80 }).expect(201);
    await request(app).delete('/v1/dnats/172.20.0.10,81,tcp').expect(204);
    await request(app).get('/v1/dnats').expect(200);
    const found = await waitFor(async () => (commands().length === 2 ? commands() : undefined), { what: 'two command timelines', intervalMs: 5 });
    expect(found.map((l) => `${l.method} ${l.path}`)).toEqual(['PUT /v1/dnats/172.20.0.10,81,tcp', 'DELETE /v1/dnats/172.20.0.10,81,tcp']);
    for (const line of found) {
      const names = (line.steps as Step[]).map((s) => s.step);
      expect(names[0]).toBe('request');
      expect(names.at(-1)).toBe('answered');
      expect(names.indexOf('validated')).toBeLessThan(names.indexOf('answered'));
    }
    // The bulk PUT keeps its own line, not a command line.
    expect(lines().filter((l) => l.msg === 'bulk PUT timeline (ms since the request: wall, CPU)')).toHaveLength(1);
  });

  it('at info level: no timeline', async () => {
    const engine = await FakeEngine.create();
    const { log, lines } = capture('info');
    const app = createApp({ agent: fakeAgent(engine), log, bodyLimit: '1mb' });
    expect(timelineEnabled()).toBe(false);
    const base = (await request(app).get('/v1/state').expect(200)).body.desired;
    await request(app)
      .put('/v1/state')
      .send({ ...base, ...DOC, initialized: true })
      .expect(200);
    // The request's own log line is written at its end, after where a timeline line would be.
    await waitFor(async () => lines().some((l) => l.msg === 'request'), { what: 'the request line', intervalMs: 5 });
    expect(lines().some((l) => String(l.msg).startsWith('bulk PUT timeline'))).toBe(false);
  });
});

describe("the start's timeline beside a request's", () => {
  it('a timeline begun later replaces it, and the start then knows it is not its own to end', async () => {
    const { enableTimeline, timelineBegunAs, timelineEnd, timelineMark, timelineStart } = await import('../../src/system/timeline.js');
    const was = timelineEnabled();
    enableTimeline(true);
    try {
      timelineStart('serve');
      timelineMark('serving');
      expect(timelineBegunAs()).toBe('serve');
      timelineStart();
      expect(timelineBegunAs()).toBe('request');
      const ended = timelineEnd();
      expect(ended?.steps.map((s) => s.step)).toEqual(['request', 'answered']);
      expect(typeof ended?.startMs).toBe('number');
      expect(timelineBegunAs()).toBeUndefined();
    } finally {
      timelineEnd();
      enableTimeline(was);
    }
  });
});
