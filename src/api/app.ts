import express, { type Express, type Request, type Response } from 'express';
import type { Logger } from 'pino';
import { z } from 'zod';
import { authenticate, type AuthOptions } from './auth.js';
import { errorHandler, HttpError, validationError } from './errors.js';
import { requestLog } from './requestLog.js';
import { RESOURCES, idOf, splitId, type ResourceDef } from './resources.js';
import { chain, type OpResult } from '../state/operations.js';
import { sameValue } from '../state/change.js';
import { parseStateBody } from './stateDoc.js';
import { buildStatus } from './status.js';
import { buildOpenApi } from './openapi.js';
import { enableTimeline, timelineEnabled, timelineMark, timelineStart, timelineEnd } from '../system/timeline.js';
import type { DesiredState } from '../state/state.js';
import type { CommandOutput } from '../engine/output.js';
import type { Agent } from './agent.js';
import type { HaManager } from '../ha/manager.js';
import type { RoutingManager } from '../routing/manager.js';
import type { DrainingStatus } from '../dataplane/draining.js';
import type { EipPortUsage } from '../observe/portUsage.js';
import { hasSecondaryUplinks, uplinkNames } from '../model/uplinks.js';

export interface AppDeps {
  readonly agent: Agent;
  readonly log: Logger;
  /** NATGW_BODY_LIMIT in bytes (or a size text body-parser reads, as tests pass). */
  readonly bodyLimit: number | string;
  /** Set for the TCP listener: everything but the probes needs a token or a client certificate. */
  readonly auth?: AuthOptions;
  /** True once SIGTERM arrived: new requests get 503. */
  readonly shuttingDown?: () => boolean;
  /** Replica sync and takeover (src/ha); without it GET /v1/ha says sync is off. */
  readonly ha?: Pick<HaManager, 'status' | 'takeover' | 'resend' | 'health'>;
  /** EIPs announced by BGP (src/routing); without it GET /v1/bgp says BGP is off. */
  readonly routing?: Pick<RoutingManager, 'status'>;
  /** SNAT source ports in use per EIP (GET /v1/status); undefined while connections are not followed (the daemon's conntrack follower). */
  readonly portUsage?: () => readonly EipPortUsage[] | undefined;
  /** The connections still translated to each EIP draining out of a SNAT pool (GET /v1/status, dataplane/draining.ts). */
  readonly draining?: (state: DesiredState) => Promise<readonly DrainingStatus[]>;
}

/** A script command and its rules: the limits of every path into the daemon. */
const legacyBody = z
  .object({
    command: z.string().max(256),
    rules: z.array(z.string().max(65536)).max(100_000).default([]),
  })
  .strict();

const FORM = 'application/x-www-form-urlencoded';

function formError(message: string, field = 'body'): HttpError {
  return new HttpError(400, 'validation', message, { field, in: 'body' });
}

/**
 * Percent-decoding done here rather than by a query-string library, byte by byte: an argument
 * is any bytes but NUL, and its invalid UTF-8 must become the same U+FFFD characters Node puts
 * in process.argv, so the daemon sees exactly what the Node shim would have sent as JSON.
 */
function formValue(raw: Buffer, field: string): string {
  const out = Buffer.alloc(raw.length);
  let n = 0;
  for (let i = 0; i < raw.length; i++) {
    const b = raw[i]!;
    if (b === 0x2b) {
      out[n++] = 0x20;
    } else if (b === 0x25) {
      const hex = raw.subarray(i + 1, i + 3).toString('latin1');
      if (!/^[0-9A-Fa-f]{2}$/.test(hex)) throw formError(`${field}: malformed percent-encoding`, field);
      out[n++] = parseInt(hex, 16);
      i += 2;
    } else {
      out[n++] = b;
    }
  }
  return out.subarray(0, n).toString('utf8');
}

/** `command=<c>&rule=<r>&rule=...` (rules in order; empty rules kept) into the JSON body's shape. */
function legacyForm(body: unknown): unknown {
  if (!Buffer.isBuffer(body)) {
    throw formError(`body: form fields command and rule are required (Content-Type: ${FORM})`);
  }
  let command: string | undefined;
  const rules: string[] = [];
  let start = 0;
  while (start <= body.length) {
    let end = body.indexOf(0x26, start);
    if (end < 0) end = body.length;
    const pair = body.subarray(start, end);
    start = end + 1;
    if (pair.length === 0) continue;
    const eq = pair.indexOf(0x3d);
    if (eq < 0) throw formError(`body: field without a value: ${pair.subarray(0, 64).toString('latin1')}`);
    const name = formValue(pair.subarray(0, eq), 'body');
    const value = formValue(pair.subarray(eq + 1), name);
    if (name === 'rule') rules.push(value);
    else if (name === 'command' && command === undefined) command = value;
    else if (name === 'command') throw formError('command: given more than once', 'command');
    else throw formError(`${name}: unknown field (expected command and rule)`, name);
  }
  return command === undefined ? { rules } : { command, rules };
}

/**
 * stderr for the X-Natgw-Stderr header, readable back by bash's `printf %b` without a fork:
 * printable ASCII stays, every other byte (space, backslash, newline, UTF-8) becomes \xHH.
 */
export function escapeStderr(text: string): string {
  let out = '';
  for (const b of Buffer.from(text, 'utf8')) {
    out += b > 0x20 && b < 0x7f && b !== 0x5c ? String.fromCharCode(b) : `\\x${b.toString(16).padStart(2, '0')}`;
  }
  return out;
}

/** A JSON object body, or a 400 saying what is missing. */
function objectBody(req: Request): Record<string, unknown> {
  const b: unknown = req.body;
  if (b === undefined) {
    throw new HttpError(400, 'validation', 'body: a JSON object is required (Content-Type: application/json)', { field: 'body', in: 'body' });
  }
  if (b === null || typeof b !== 'object' || Array.isArray(b)) {
    throw new HttpError(400, 'validation', 'body: must be a JSON object', { field: 'body', in: 'body' });
  }
  return b as Record<string, unknown>;
}

function boolQuery(req: Request, name: string): boolean {
  const v = req.query[name];
  if (v === undefined) return false;
  if (typeof v === 'string') {
    const s = v.toLowerCase();
    if (s === 'true' || s === '1' || s === 'yes' || s === '') return true;
    if (s === 'false' || s === '0' || s === 'no') return false;
  }
  throw new HttpError(400, 'validation', `${name}: must be true or false`, { field: name, in: 'query' });
}

/** The longest /readyz?waitMs= holds a request: below any client's or proxy's idle timeout. */
const READYZ_MAX_WAIT_MS = 30_000;

function waitQuery(req: Request): number {
  const v = req.query.waitMs;
  if (v === undefined) return 0;
  if (typeof v === 'string' && /^\d{1,9}$/.test(v) && Number(v) <= READYZ_MAX_WAIT_MS) return Number(v);
  throw new HttpError(400, 'validation', `waitMs: must be a whole number of milliseconds from 0 to ${READYZ_MAX_WAIT_MS}`, { field: 'waitMs', in: 'query' });
}

function parseIdentity(def: ResourceDef, req: Request): { raw: Record<string, unknown>; id: unknown; key: string } {
  const raw = splitId(def, String(req.params.id ?? ''));
  const parsed = def.idSchema.safeParse(raw);
  if (!parsed.success) throw validationError(parsed.error, 'path');
  return { raw, id: parsed.data, key: def.key(parsed.data) };
}

/**
 * The HTTP API (SPEC §4.2) as an express app, without listening: the daemon mounts it on
 * its Unix socket and TCP listener; tests drive it with supertest.
 */
export function createApp(deps: AppDeps): Express {
  const { agent, log } = deps;
  const app = express();
  app.disable('x-powered-by');
  app.set('etag', false);
  app.set('query parser', 'simple');

  app.use(requestLog(log));
  app.use((_req, res, next) => {
    if (deps.shuttingDown?.()) {
      res.set('Connection', 'close');
      res.status(503).json({ error: 'shutting-down', message: 'natgw is shutting down' });
      return;
    }
    next();
  });
  if (deps.auth) app.use(authenticate(deps.auth));
  // Debug level: a request's critical path, step by step (system/timeline.ts). A single
  // command's few milliseconds are spread over the request, the lock, the tool and the journal:
  // its timeline says which (bench/commandTimeline.ts reads these lines).
  enableTimeline(log.isLevelEnabled('debug'));
  if (timelineEnabled()) {
    app.use((req, res, next) => {
      if (req.method === 'GET' || !req.path.startsWith('/v1/')) return next();
      const bulk = req.path === '/v1/state';
      timelineStart();
      res.on('finish', () => {
        const timeline = timelineEnd();
        if (timeline && bulk) log.debug(timeline, 'bulk PUT timeline (ms since the request: wall, CPU)');
        else if (timeline) log.debug({ ...timeline, method: req.method, path: req.path }, 'command timeline (ms since the request: wall, CPU)');
      });
      next();
    });
  }
  app.use(
    express.json({
      limit: deps.bodyLimit,
      type: ['application/json', 'application/*+json'],
      ...(timelineEnabled() ? { verify: () => timelineMark('body in') } : {}),
    }),
  );

  // ---- probes, metrics, description ----
  app.get('/healthz', (_req, res) => {
    res.json({ status: 'ok', pid: process.pid, uptimeSeconds: Math.round(process.uptime()) });
  });
  app.get('/readyz', async (req, res) => {
    // `?waitMs=`: held until ready (or that long), so a client that waits for a start learns of
    // it at once instead of at its next poll.
    const waitMs = waitQuery(req);
    if (waitMs > 0) await agent.whenReady(waitMs);
    const r = agent.readiness();
    // Over TCP the probe is open (tenant-reachable): the status only. The reasons name
    // interfaces and carry tool stderr and file paths; they stay on the Unix socket and in the log.
    // Sync health is reported, not gated on: a replica whose peer is gone must keep serving.
    res.status(r.ready ? 200 : 503).json(deps.auth ? { ready: r.ready } : deps.ha ? { ...r, ha: deps.ha.health() } : r);
  });
  app.get('/metrics', async (_req, res) => {
    const m = await (await agent.metrics).render();
    res.type(m.contentType).send(m.body);
  });
  // Built on first request, not at start: converting every schema is start-up time a restore waits for.
  let openapi: ReturnType<typeof buildOpenApi> | undefined;
  app.get('/v1/openapi.json', (_req, res) => {
    openapi ??= buildOpenApi();
    res.json(openapi);
  });

  // ---- the script's commands ----
  const runLegacy = async (body: unknown, res: Response): Promise<CommandOutput> => {
    const parsed = legacyBody.safeParse(body);
    if (!parsed.success) throw validationError(parsed.error, 'body');
    const { command, rules } = parsed.data;
    const out = await agent.legacy(command, rules);
    res.locals.log = { command, rules: rules.length, exitStatus: out.status, outcome: out.status === 0 ? 'ok' : 'failed' };
    return out;
  };
  app.post('/v1/legacy', async (req, res) => {
    res.status(200).json(await runLegacy(objectBody(req), res));
  });
  // The shim's curl client (image/nat-gateway.sh): a form body curl can build from argv
  // without any quoting, and an answer bash reads without a JSON parser: stdout is the body,
  // byte for byte; the command's status and stderr travel in headers.
  app.post('/v1/legacy/raw', express.raw({ type: FORM, limit: deps.bodyLimit }), async (req, res) => {
    const out = await runLegacy(legacyForm(req.body), res);
    res.status(200);
    res.set('X-Natgw-Status', String(out.status));
    res.set('X-Natgw-Stderr', escapeStderr(out.stderr));
    res.set('Content-Type', 'text/plain; charset=utf-8');
    res.send(Buffer.from(out.stdout, 'utf8'));
  });

  // ---- the whole state ----
  app.get('/v1/state', async (_req, res) => {
    const doc = await agent.stateDocument();
    res.set('ETag', `"${doc.digest}"`);
    res.json(doc);
  });
  app.put('/v1/state', async (req, res) => {
    timelineMark('parsed');
    const dryRun = boolQuery(req, 'dryRun');
    const next = parseStateBody(objectBody(req));
    timelineMark('validated');
    const ifMatch = req
      .get('if-match')
      ?.replace(/^W\//, '')
      .replace(/^"(.*)"$/, '$1');
    const result = await agent.replaceState(next, { dryRun, ifMatch });
    timelineMark('transacted');
    res.locals.log = { command: dryRun ? 'state-plan' : 'state-replace', outcome: 'ok' };
    if (!dryRun) res.set('ETag', `"${result.digest}"`);
    res.json(result);
  });

  app.get('/v1/status', async (req, res) => {
    const check = boolQuery(req, 'check');
    const drift = check ? await agent.checkDrift() : undefined;
    const doc = await agent.stateDocument();
    const snatPorts = deps.portUsage?.();
    const draining = deps.draining && doc.desired.snats.some((x) => x.draining) ? await deps.draining(doc.desired) : [];
    res.json({
      ...buildStatus(doc, agent.readiness(), agent.lastSyncDetail, drift),
      ...(snatPorts ? { snatPorts } : {}),
      ...(draining.length > 0 ? { draining } : {}),
    });
  });

  // ---- replicas ----
  app.get('/v1/ha', async (_req, res) => {
    if (deps.ha) res.json(await deps.ha.status());
    else res.json({ enabled: false, digest: (await agent.stateDocument()).digest });
  });
  app.get('/v1/bgp', async (_req, res) => {
    res.json(deps.routing ? await deps.routing.status() : { enabled: false, off: 'not the daemon (natgw serve)' });
  });
  app.post('/v1/ha/takeover', async (req, res) => {
    if (!deps.ha) throw new HttpError(503, 'unavailable', 'takeover needs the daemon (natgw serve)');
    const reason = typeof req.query.reason === 'string' ? req.query.reason.slice(0, 200) : 'api';
    res.locals.log = { command: 'ha-takeover', outcome: 'ok' };
    res.json(await deps.ha.takeover(reason));
  });
  app.post('/v1/ha/resend', async (_req, res) => {
    if (!deps.ha) throw new HttpError(503, 'unavailable', 'resend needs the daemon (natgw serve) with replica sync');
    res.locals.log = { command: 'ha-resend', outcome: 'ok' };
    res.json(await deps.ha.resend());
  });

  // ---- resources ----
  for (const def of RESOURCES) mountResource(app, def, agent);

  app.use((req, res) => {
    res.status(404).json({ error: 'not-found', message: `no route for ${req.method} ${req.path}` });
  });
  app.use(errorHandler(log, { redact: deps.auth !== undefined }));
  return app;
}

/** The object under identity `key`. */
function findIn(def: ResourceDef, s: DesiredState, key: string): unknown {
  return s[def.stateKey].find((x: unknown) => def.key(x) === key);
}

function mountResource(app: Express, def: ResourceDef, agent: Agent): void {
  const { engine } = agent;
  const base = `/v1/${def.path}`;
  const view = (x: unknown) => ({ id: idOf(def, x), ...(x as object) });

  app.get(base, async (_req, res) => {
    res.json({ items: (await engine.loadState())[def.stateKey].map(view) });
  });

  app.get(`${base}/:id`, async (req, res) => {
    const { key } = parseIdentity(def, req);
    const found = findIn(def, await engine.loadState(), key);
    if (found === undefined) throw new HttpError(404, 'not-found', `no ${def.title} ${String(req.params.id)}`);
    res.json(view(found));
  });

  app.put(`${base}/:id`, async (req: Request, res: Response) => {
    const { raw, id, key } = parseIdentity(def, req);
    const replace = boolQuery(req, 'replace') && def.replaceable;
    const body = { ...objectBody(req) };
    for (const f of def.readOnly) delete body[f];
    const merged = def.prepare ? def.prepare(raw, { ...raw, ...body }) : { ...raw, ...body };
    const parsed = def.schema.safeParse(merged);
    if (!parsed.success) throw validationError(parsed.error, 'body');
    const obj = parsed.data;
    def.check?.(obj);
    if (def.key(obj) !== key) {
      const o = obj as Record<string, unknown>;
      const path = id as Record<string, unknown>;
      const field = def.idFields.find((f) => String(o[f]) !== String(path[f])) ?? 'id';
      throw new HttpError(400, 'validation', `${field}: '${String(o[field])}' does not match the identity in the path`, { field, in: 'body' });
    }
    timelineMark('validated');
    const ctx = {
      gateways: { v4: engine.config.gatewayV4, v6: engine.config.gatewayV6 },
      networks: def.stateKey === 'eips' ? await uplinkNetworks(engine) : [],
    };
    const put = (s: DesiredState): OpResult => {
      const existing = replace ? findIn(def, s, key) : undefined;
      if (existing === undefined || sameValue(existing, obj)) return def.put(s, obj, ctx);
      return chain(def.del(s, obj), (t) => def.put(t, obj, ctx));
    };
    const result = await agent.batcher.submit({ guarded: def.guarded, qos: def.qos, op: put });
    // What the operation changed under this identity says whether it existed; untouched, it was there as asked.
    const touched = (result.change?.lists as Record<string, ReadonlyMap<string, { before?: unknown; after?: unknown }>> | undefined)?.[def.stateKey]?.get(key);
    const existed = touched === undefined || touched.before !== undefined;
    const stored = touched?.after ?? findIn(def, result.after, key) ?? obj;
    res.locals.log = { command: `put-${def.path}`, id: idOf(def, stored), batch: result.batchSize, outcome: 'ok' };
    res.status(existed ? 200 : 201).json(view(stored));
  });

  app.delete(`${base}/:id`, async (req, res) => {
    const { id } = parseIdentity(def, req);
    timelineMark('validated');
    const result = await agent.batcher.submit({ guarded: def.guarded, qos: def.qos, op: (s) => def.del(s, id) });
    res.locals.log = { command: `delete-${def.path}`, id: String(req.params.id), batch: result.batchSize, outcome: 'ok' };
    res.status(204).end();
  });
}

/** Several external interfaces: their networks, where a new EIP's interface is found (as eip-add does); none with one. */
async function uplinkNetworks(engine: Agent['engine']) {
  const ifs = (engine.lastApplied ?? (await engine.loadState())).interfaces;
  return hasSecondaryUplinks(ifs) ? engine.link.uplinkNetworks(uplinkNames(ifs)) : [];
}
