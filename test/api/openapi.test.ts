/**
 * The OpenAPI document describes exactly the routes the app serves: every path and method
 * of the express router is in the document and vice versa, and the document is served.
 */
import { describe, expect, it } from 'vitest';
import request from 'supertest';
import type { z } from 'zod';
import {
  bgpStatusBody,
  commandOutputBody,
  errorBody,
  haStatusBody,
  healthBody,
  readinessBody,
  replaceResultBody,
  stateDocumentBody,
  statusBody,
} from '../../src/api/bodies.js';
import type { Express } from 'express';
import { createApp } from '../../src/api/app.js';
import { buildOpenApi } from '../../src/api/openapi.js';
import { RESOURCES } from '../../src/api/resources.js';
import { FakeEngine, fakeAgent } from './fakeEngine.js';

interface LayerLike {
  route?: { path: string | string[]; methods: Record<string, boolean> };
  handle?: { stack?: LayerLike[] };
}

/** "METHOD /path" for every route in the app's router (and routers mounted in it). */
function routesOf(app: Express): string[] {
  const out: string[] = [];
  const walk = (stack: LayerLike[]) => {
    for (const layer of stack) {
      if (layer.route) {
        const paths = Array.isArray(layer.route.path) ? layer.route.path : [layer.route.path];
        for (const p of paths) {
          for (const [m, on] of Object.entries(layer.route.methods)) if (on && m !== '_all') out.push(`${m.toUpperCase()} ${p}`);
        }
      } else if (layer.handle?.stack) {
        walk(layer.handle.stack);
      }
    }
  };
  walk((app as unknown as { router: { stack: LayerLike[] } }).router.stack);
  return out.sort();
}

const METHODS = new Set(['get', 'put', 'post', 'delete', 'patch', 'head', 'options']);

function documented(doc: ReturnType<typeof buildOpenApi>): string[] {
  const out: string[] = [];
  for (const [path, item] of Object.entries(doc.paths as Record<string, Record<string, unknown>>)) {
    const expressPath = path.replace(/\{(\w+)\}/g, ':$1');
    for (const m of Object.keys(item)) if (METHODS.has(m)) out.push(`${m.toUpperCase()} ${expressPath}`);
  }
  return out.sort();
}

describe('OpenAPI document', async () => {
  const engine = await FakeEngine.create();
  const app = createApp({ agent: fakeAgent(engine), log: engine.log, bodyLimit: '1mb' });
  const doc = buildOpenApi();

  it('lists exactly the routes the app serves', () => {
    const routes = routesOf(app);
    expect(routes.length).toBeGreaterThan(RESOURCES.length * 4);
    expect(documented(doc)).toEqual(routes);
  });

  it('is OpenAPI 3 with a schema for every resource and unique operation ids', () => {
    expect(doc.openapi).toMatch(/^3\./);
    const schemas = (doc.components as { schemas: Record<string, unknown> }).schemas;
    for (const def of RESOURCES) expect(schemas[def.title.replace(/[^A-Za-z]/g, '')], def.path).toBeTypeOf('object');
    const ids: string[] = [];
    for (const item of Object.values(doc.paths as Record<string, Record<string, { operationId?: string }>>)) {
      for (const [m, op] of Object.entries(item)) if (METHODS.has(m)) ids.push(op.operationId ?? '');
    }
    expect(new Set(ids).size).toBe(ids.length);
    expect(ids).not.toContain('');
  });

  it('is served at /v1/openapi.json', async () => {
    const res = await request(app).get('/v1/openapi.json').expect(200);
    expect(res.body).toEqual(JSON.parse(JSON.stringify(doc)));
  });

  // Every $ref names a schema of the document, and the bodies the app serves are what the
  // schemas the document is generated from say.
  it('has references that resolve', () => {
    const schemas = (doc.components as { schemas: Record<string, unknown> }).schemas;
    const refs = [...JSON.stringify(doc).matchAll(/"\$ref":"#\/components\/schemas\/([^"]+)"/g)].map((m) => m[1] ?? '');
    expect(new Set(refs)).toEqual(new Set(Object.keys(schemas)));
  });

  it('describes the bodies the app serves', async () => {
    const check = (schema: z.ZodType, body: unknown) => expect(schema.safeParse(body).error).toBeUndefined();
    await request(app).put('/v1/dnats/172.20.0.10,8080,tcp').send({ internalIp: '10.0.1.6', internalPort: 80 });
    check(healthBody, (await request(app).get('/healthz')).body);
    check(readinessBody, (await request(app).get('/readyz')).body);
    const state = (await request(app).get('/v1/state').expect(200)).body;
    check(stateDocumentBody, state);
    check(statusBody, (await request(app).get('/v1/status').expect(200)).body);
    check(replaceResultBody, (await request(app).put('/v1/state?dryRun=true').send(state).expect(200)).body);
    check(
      commandOutputBody,
      (
        await request(app)
          .post('/v1/legacy')
          .send({ command: 'dnat-add', rules: ['172.20.0.10,8081,tcp,10.0.1.6,80'] })
          .expect(200)
      ).body,
    );
    check(errorBody, (await request(app).get('/v1/dnats/nonsense').expect(400)).body);
    check(haStatusBody, (await request(app).get('/v1/ha').expect(200)).body);
    check(bgpStatusBody, (await request(app).get('/v1/bgp').expect(200)).body);
  });
});
