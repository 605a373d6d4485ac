/**
 * The OpenAPI document describes exactly the routes the app serves: every path and method
 * of the express router is in the document and vice versa, and the document is served.
 */
import { describe, expect, it } from 'vitest';
import request from 'supertest';
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
});
