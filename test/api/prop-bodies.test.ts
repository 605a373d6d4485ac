/**
 * Property tests (fast-check) of every API body: arbitrary identities, bodies, state documents
 * and legacy requests never crash the API (no 5xx) and, when refused, never reach a tool (the
 * app runs on a real Agent and Engine over recording fakes: the count of tool calls does not
 * move), and, when accepted, leave the state holding what the answer says was accepted; valid
 * generated objects round-trip through PUT and GET.
 */
import fc from 'fast-check';
import request from 'supertest';
import type { Express } from 'express';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApp } from '../../src/api/app.js';
import { RESOURCES, splitId, type ResourceDef } from '../../src/api/resources.js';
import { Agent } from '../../src/api/agent.js';
import { RecordingKernel } from '../helpers/recordingKernel.js';

const RUNS = Number(process.env.NATGW_PROP_RUNS ?? 150);

let kernel: RecordingKernel;
let app: Express;
beforeAll(async () => {
  kernel = new RecordingKernel();
  const engine = await kernel.initialised();
  const agent = new Agent({ engine, log: pino({ level: 'silent' }) });
  app = createApp({ agent, log: pino({ level: 'silent' }), bodyLimit: '1mb' });
});
afterAll(() => kernel?.cleanup());

const hostileText = fc.oneof(
  fc.constantFrom('172.20.0.10', '10.0.1.6', '010.0.1.6', '::ffff:10.0.1.6', '10.0.0.0/33', '0', '65536', '-1', 'tcp', 'sctp', 'net1', 'a'.repeat(16)),
  fc.constantFrom('$(reboot)', '`id`', '}', ';', '#', '\n', '\0', '-j ACCEPT', '--random-fully', '1e3', ' 80', '0x50'),
  fc.string({ maxLength: 20 }),
);
const hostileValue = fc.oneof(
  hostileText,
  fc.integer(),
  fc.double(),
  fc.boolean(),
  fc.constant(null),
  fc.array(hostileText, { maxLength: 3 }),
  fc.jsonValue({ maxDepth: 2 }),
);

/** A resource's example body with some fields replaced by hostile values, or extra fields added. */
const mutatedBody = (example: Record<string, unknown>) =>
  fc.oneof(
    fc
      .dictionary(fc.constantFrom(...Object.keys(example), 'extra', '__proto__', 'constructor'), hostileValue, { maxKeys: 4 })
      .map((d) => ({ ...example, ...d })),
    fc.jsonValue({ maxDepth: 3 }),
  );

/** Every planned change of a PUT /v1/state answer's plan, summed. */
const planned = (plan: Record<string, { added: number; removed: number; changed: number }>): number =>
  Object.values(plan).reduce((n, d) => n + d.added + d.removed + d.changed, 0);

/**
 * An accepted PUT (2xx): the state now holds the object the answer reports, under its identity;
 * and a created one (201) is what the request asked for, every field as the schema reads it.
 */
async function expectStored(def: ResourceDef, id: string, body: unknown, r: request.Response): Promise<void> {
  const what = `PUT ${def.path}/${id} ${JSON.stringify(body)} → ${r.status} ${r.text}`;
  const got = await request(app).get(`/v1/${def.path}/${encodeURIComponent(String(r.body?.id))}`);
  expect(got.status, what).toBe(200);
  expect(got.body, what).toEqual(r.body);
  if (r.status !== 201) return;
  const raw = splitId(def, id);
  const given = { ...(body as Record<string, unknown>) };
  for (const f of def.readOnly) delete given[f];
  const asked = def.schema.parse(def.prepare ? def.prepare(raw, { ...raw, ...given }) : { ...raw, ...given }) as Record<string, unknown>;
  expect(r.body, what).toMatchObject(asked);
}

/** Every 4xx/5xx answer: one JSON error with a one-line message. */
function expectRefusal(r: request.Response, what: string): void {
  expect(r.status, `${what}: ${r.text}`).toBeLessThan(500);
  expect(typeof r.body?.error, what).toBe('string');
  expect(String(r.body?.message ?? ''), what).not.toMatch(/\n/);
}

const octet = fc.integer({ min: 0, max: 255 });
const ipv4 = fc.tuple(fc.constantFrom(10, 172, 192), octet, octet, fc.integer({ min: 1, max: 254 })).map((o) => o.join('.'));
const port = fc.integer({ min: 1, max: 65535 });
/** DNATs and SNATs a whole state may hold (identities unique, CIDRs canonical). */
const validCollections = fc.record({
  dnats: fc.uniqueArray(fc.record({ eip: ipv4, port, protocol: fc.constantFrom('tcp', 'udp'), internalIp: ipv4, internalPort: port }), {
    maxLength: 4,
    selector: (d) => `${d.eip},${d.port},${d.protocol}`,
  }),
  snats: fc.uniqueArray(fc.record({ eip: ipv4, cidr: fc.tuple(octet, octet).map(([a, b]) => `10.${a}.${b}.0/24`), randomFully: fc.boolean() }), {
    maxLength: 4,
    selector: (x) => `${x.eip},${x.cidr}`,
  }),
});

describe('arbitrary API input', () => {
  it.each(RESOURCES.map((d) => [d.path, d] as const))('PUT /v1/%s/<id>: accepted, or refused without reaching a tool', async (_p, def) => {
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          // The example as a path segment holds (e.g. a CIDR's slash; encoded again below).
          fc.constant(decodeURIComponent(def.idExample)),
          hostileText.filter((s) => s !== '' && !s.includes('/')),
        ),
        mutatedBody(def.bodyExample),
        fc.boolean(),
        async (id, body, keep) => {
          const before = kernel.calls.length;
          const r = await request(app)
            .put(`/v1/${def.path}/${encodeURIComponent(id)}`)
            .type('json')
            .send(JSON.stringify(body));
          // The fake kernel has no QoS devices: valid QoS input reaches it and is refused there (apply-failed), as a kernel would.
          if (r.status === 500 && r.body?.error === 'apply-failed' && def.qos) return;
          if (r.status >= 400) {
            expectRefusal(r, `PUT ${def.path}/${id} ${JSON.stringify(body)}`);
            if (r.status !== 409) expect(kernel.calls.slice(before), `${r.status} ${r.text}`).toEqual([]);
            return;
          }
          expect([200, 201], r.text).toContain(r.status);
          await expectStored(def, id, body, r);
          // Kept, the next PUT of this identity meets it (an update or a conflict); removed, it creates again.
          if (!keep) expect((await request(app).delete(`/v1/${def.path}/${encodeURIComponent(String(r.body.id))}`)).status).toBe(204);
        },
      ),
      { numRuns: RUNS },
    );
  });

  it.each(RESOURCES.map((d) => [d.path, d] as const))('DELETE /v1/%s/<arbitrary id>: refused without reaching a tool, or done', async (_p, def) => {
    await fc.assert(
      fc.asyncProperty(
        hostileText.filter((s) => s !== ''),
        async (id) => {
          const before = kernel.calls.length;
          const r = await request(app).delete(`/v1/${def.path}/${encodeURIComponent(id)}`);
          if (r.status >= 400) {
            expectRefusal(r, `DELETE ${def.path}/${id}`);
            expect(kernel.calls.slice(before)).toEqual([]);
            return;
          }
          // Accepted: the identity is gone from the state.
          expect(r.status, r.text).toBe(204);
          expect((await request(app).get(`/v1/${def.path}/${encodeURIComponent(id)}`)).status, `GET ${def.path}/${id} after its DELETE`).toBe(404);
        },
      ),
      { numRuns: RUNS },
    );
  });

  it('PUT /v1/state with arbitrary documents', async () => {
    const objectsOf = (def: (typeof RESOURCES)[number]) => fc.array(mutatedBody({ ...def.bodyExample }), { maxLength: 3 });
    const doc = fc.oneof(
      fc.jsonValue({ maxDepth: 3 }),
      fc.record(
        { snats: objectsOf(RESOURCES.find((d) => d.stateKey === 'snats')!), dnats: objectsOf(RESOURCES.find((d) => d.stateKey === 'dnats')!) },
        { requiredKeys: [] },
      ),
      fc.record({ desired: fc.jsonValue({ maxDepth: 3 }) }),
      validCollections.map((valid) => ({ valid })),
    );
    await fc.assert(
      fc.asyncProperty(doc, fc.boolean(), async (generated, dry) => {
        const before = kernel.calls.length;
        const current = (await request(app).get('/v1/state')).body;
        const digestBefore = current.digest as string;
        // A valid document: the current desired state with generated DNATs and SNATs.
        const body =
          generated && typeof generated === 'object' && 'valid' in generated ? { desired: { ...current.desired, ...(generated.valid as object) } } : generated;
        const put = (dryRun: boolean) =>
          request(app)
            .put(`/v1/state${dryRun ? '?dryRun=true' : ''}`)
            .type('json')
            .send(JSON.stringify(body));
        const r = await put(dry);
        if (r.status >= 400) {
          expectRefusal(r, `PUT /v1/state ${JSON.stringify(body)}`);
          expect(kernel.calls.slice(before)).toEqual([]);
          return;
        }
        const what = `PUT /v1/state${dry ? '?dryRun=true' : ''} ${JSON.stringify(body)} → ${r.status}`;
        expect(r.status, what).toBe(200);
        const after = (await request(app).get('/v1/state')).body.digest as string;
        if (dry) {
          // A dry run changes nothing.
          expect(after, what).toBe(digestBefore);
          return;
        }
        // The state is the one accepted: its digest is the answer's, and the same document
        // planned against it again changes nothing.
        expect(after, what).toBe(r.body.digest);
        const again = await put(true);
        expect(again.status, what).toBe(200);
        expect(planned(again.body.plan), `${what}: planned again ${JSON.stringify(again.body.plan)}`).toBe(0);
      }),
      { numRuns: RUNS },
    );
  });

  it("POST /v1/legacy with arbitrary requests: 400 without a tool call, or the command's own answer", async () => {
    const body = fc.oneof(
      fc.jsonValue({ maxDepth: 2 }),
      fc.record(
        {
          command: fc.oneof(hostileText, fc.constantFrom('dnat-add', 'snat-add', 'help', 'init')),
          rules: fc.oneof(fc.array(hostileText, { maxLength: 3 }), hostileValue),
        },
        { requiredKeys: [] },
      ),
    );
    await fc.assert(
      fc.asyncProperty(body, async (b) => {
        // init with arbitrary interface names would wait for them: a refusal is what is tested here.
        fc.pre(
          !(
            b &&
            typeof b === 'object' &&
            (b as { command?: unknown }).command === 'init' &&
            Array.isArray((b as { rules?: unknown }).rules) &&
            (b as { rules: unknown[] }).rules.length === 0
          ),
        );
        const before = kernel.calls.length;
        const r = await request(app).post('/v1/legacy').type('json').send(JSON.stringify(b));
        if (r.status === 200) {
          expect([0, 1]).toContain(r.body.status);
          if (r.body.status !== 0) expect(r.body.stderr === '' || /^[^\n]*\n$/.test(r.body.stderr), r.text).toBe(true);
          return;
        }
        expectRefusal(r, `POST /v1/legacy ${JSON.stringify(b)}`);
        expect(kernel.calls.slice(before)).toEqual([]);
      }),
      { numRuns: RUNS },
    );
  });
});

describe('valid generated objects round-trip through PUT and GET', () => {
  it('DNATs', async () => {
    await fc.assert(
      fc.asyncProperty(ipv4, port, fc.constantFrom('tcp', 'udp'), ipv4, port, async (eip, p, proto, ip, ip2) => {
        const path = `/v1/dnats/${eip},${p},${proto}`;
        const put = await request(app).put(`${path}?replace=true`).send({ internalIp: ip, internalPort: ip2 });
        expect([200, 201], put.text).toContain(put.status);
        const got = await request(app).get(path);
        expect(got.status).toBe(200);
        expect(got.body).toMatchObject({ eip, port: p, protocol: proto, internalIp: ip, internalPort: ip2 });
        expect((await request(app).delete(path)).status).toBe(204);
      }),
      { numRuns: 50 },
    );
  });

  it('SNATs', async () => {
    await fc.assert(
      fc.asyncProperty(ipv4, ipv4, fc.integer({ min: 8, max: 32 }), fc.boolean(), async (eip, addr, len, rf) => {
        const put = await request(app)
          .put(`/v1/snats/${eip},${encodeURIComponent(`${addr}/${len}`)}?replace=true`)
          .send({ randomFully: rf });
        expect([200, 201], put.text).toContain(put.status);
        const cidr = put.body.cidr as string;
        const got = await request(app).get(`/v1/snats/${eip},${encodeURIComponent(cidr)}`);
        expect(got.body).toMatchObject({ eip, cidr, randomFully: rf });
        expect((await request(app).delete(`/v1/snats/${eip},${encodeURIComponent(cidr)}`)).status).toBe(204);
      }),
      { numRuns: 50 },
    );
  });
});
