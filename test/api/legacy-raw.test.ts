/**
 * POST /v1/legacy/raw, the shim's curl client's endpoint: a form body decoded byte for byte
 * (as Node decodes argv), the same command as POST /v1/legacy, stdout as the body and status
 * and stderr in headers; 4xx only for a malformed request; the body limit as for JSON.
 */
import { beforeEach, describe, expect, it } from 'vitest';
import request from 'supertest';
import type { Express } from 'express';
import { createApp, escapeStderr } from '../../src/api/app.js';
import type { Agent } from '../../src/api/agent.js';
import { FakeEngine, fakeAgent } from './fakeEngine.js';

const EIP = '172.20.0.10';
const FORM = 'application/x-www-form-urlencoded';

let engine: FakeEngine;
let agent: Agent;
let app: Express;

beforeEach(async () => {
  engine = await FakeEngine.create();
  agent = fakeAgent(engine);
  app = createApp({ agent, log: engine.log, bodyLimit: '64kb' });
});

/** What `curl --data-urlencode` sends: every byte but unreserved ones as %HH, space as '+'. */
function curlEncode(value: Buffer | string): string {
  let out = '';
  for (const b of Buffer.from(value)) {
    const c = String.fromCharCode(b);
    if (/[A-Za-z0-9._~-]/.test(c)) out += c;
    else if (b === 0x20) out += '+';
    else out += `%${b.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
}

const form = (command: string, rules: readonly (string | Buffer)[]) =>
  [`command=${curlEncode(command)}`, ...rules.map((r) => `rule=${curlEncode(r)}`)].join('&');

const raw = (body: string) =>
  request(app)
    .post('/v1/legacy/raw')
    .set('content-type', FORM)
    .buffer(true)
    .parse((res, cb) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => cb(null, Buffer.concat(chunks)));
    })
    .send(body);

/** Undo escapeStderr the way bash's printf %b does. */
const unescapeStderr = (s: string) =>
  Buffer.from(
    s.replace(/\\x([0-9a-f]{2})/g, (_, h: string) => String.fromCharCode(parseInt(h, 16))),
    'latin1',
  ).toString('utf8');

describe('POST /v1/legacy/raw', () => {
  it('runs the command exactly as POST /v1/legacy does', async () => {
    const cases: [string, string[]][] = [
      ['dnat-add', [`${EIP},8080,tcp,10.0.1.6,80`]],
      ['dnat-add', [`${EIP},8080,tcp,10.0.1.7,80`]],
      ['dnat-add', [`${EIP},x,tcp,10.0.1.6,80`]],
      ['frobnicate', ['a b', '', '\'$(x)\'\n"q"']],
      ['', []],
    ];
    for (const [command, rules] of cases) {
      const viaJson = await request(app).post('/v1/legacy').send({ command, rules }).expect(200);
      const viaForm = await raw(form(command, rules)).expect(200);
      expect(viaForm.headers['content-type']).toMatch(/^text\/plain/);
      expect((viaForm.body as Buffer).toString('utf8')).toBe(viaJson.body.stdout);
      expect(viaForm.headers['x-natgw-status']).toBe(String(viaJson.body.status));
      expect(unescapeStderr(viaForm.headers['x-natgw-stderr'] ?? 'missing')).toBe(viaJson.body.stderr);
    }
    engine.initialized = false;
    const guarded = await raw(form('eip-add', [`${EIP}/24`])).expect(200);
    expect((guarded.body as Buffer).toString()).toBe(`eip-add ${EIP}/24\n`);
    expect(guarded.headers['x-natgw-status']).toBe('1');
    expect(guarded.headers['x-natgw-stderr']).toBe('nat\\x20gateway\\x20not\\x20initialized\\x0a');
  });

  it('keeps rules in order, empty rules included, and decodes invalid UTF-8 as Node decodes argv', async () => {
    const bytes = Buffer.from([0x61, 0xff, 0xfe, 0x20, 0xe2, 0x82]);
    const r = await raw(form('frobnicate', ['', 'b', bytes, '+&=%', ''])).expect(200);
    // The unknown command's first line names the command only; the rules reach the engine as given.
    expect(r.headers['x-natgw-status']).toBe('1');
    const seen: string[][] = [];
    const legacy = agent.legacy.bind(agent);
    agent.legacy = async (c, rules) => {
      seen.push([c, ...rules]);
      return legacy(c, rules);
    };
    await raw(form('dnat-add', ['', 'b', bytes, '+&=%', ''])).expect(200);
    await raw('rule=first&command=dnat-add&rule=second').expect(200);
    await raw('command=dnat%2dadd&rule=a+b%20c').expect(200);
    expect(seen).toEqual([
      ['dnat-add', '', 'b', bytes.toString('utf8'), '+&=%', ''],
      ['dnat-add', 'first', 'second'],
      ['dnat-add', 'a b c'],
    ]);
    expect(bytes.toString('utf8')).toBe('a\ufffd\ufffd \ufffd');
  });

  it('answers 4xx only for a malformed request, and applies nothing', async () => {
    const bad: [string, string | RegExp][] = [
      ['', 'command'],
      ['rule=x', 'command'],
      ['command=a&command=b', 'command'],
      ['command=dnat-add&rules=x', 'rules'],
      ['command=dnat-add&rule', 'body'],
      ['command=dnat-add&rule=%zz', 'rule'],
      ['command=dnat-add&rule=%4', 'rule'],
      [`command=${'x'.repeat(300)}`, 'command'],
    ];
    for (const [body, field] of bad) {
      const r = await raw(body).expect(400);
      expect(JSON.parse((r.body as Buffer).toString()), body).toMatchObject({ error: 'validation', field });
    }
    // JSON to the form endpoint, and a form to the JSON endpoint, are both refused.
    await request(app).post('/v1/legacy/raw').send({ command: 'help' }).expect(400);
    await request(app).post('/v1/legacy').set('content-type', FORM).send('command=help').expect(400);
    await raw(`command=dnat-add&rule=${'x'.repeat(70 * 1024)}`).expect(413);
    expect(engine.state.dnats).toHaveLength(0);
  });

  it('escapes stderr so that printf %b gives back every byte', () => {
    const text = 'Error: a\\b "c"\t%d\n\u00e9\u{1f600}\r\x01';
    const e = escapeStderr(text);
    expect(e).toMatch(/^[\x21-\x7e]*$/);
    expect(e).not.toMatch(/\\(?!x[0-9a-f]{2})/);
    expect(unescapeStderr(e)).toBe(text);
    expect(escapeStderr('')).toBe('');
  });
});
