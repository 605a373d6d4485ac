import { randomUUID } from 'node:crypto';
import type { ErrorRequestHandler } from 'express';
import type { Logger } from 'pino';
import { z } from 'zod';
import { NatgwError } from '../model/errors.js';
import { QueueClosedError } from '../engine/queue.js';
import { worded } from '../engine/conflicts.js';
import type { ErrorBody } from './bodies.js';

/**
 * The API's one error shape and its one error handler. Operational errors (bad input,
 * conflicts, guard, a kernel that refused the change) map to 4xx/5xx with the same text the
 * shim prints; anything else is a programmer error: 500, logged with its stack.
 */
export class HttpError extends Error {
  override readonly name = 'HttpError';
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly extra: Partial<Pick<ErrorBody, 'field' | 'in' | 'issues'>> = {},
  ) {
    super(message);
  }
}

/** A zod failure as a 400 naming the first field at fault and why. */
export function validationError(error: z.ZodError, where: NonNullable<ErrorBody['in']>, prefix: readonly (string | number)[] = []): HttpError {
  const issues = error.issues.map((i) => ({ field: fieldName([...prefix, ...i.path]) || '(root)', message: i.message }));
  const first = issues[0] ?? { field: '(root)', message: 'invalid' };
  return new HttpError(400, 'validation', `${first.field}: ${first.message}`, { field: first.field, in: where, issues });
}

/** A path as the API names a field: `desired.dnats[3].port`. */
export function fieldName(path: readonly PropertyKey[]): string {
  return path.reduce<string>((acc, p) => (typeof p === 'number' ? `${acc}[${p}]` : acc ? `${acc}.${String(p)}` : String(p)), '');
}

/** The status and error code of each kind of operational error. */
const BY_KIND: Record<NatgwError['kind'], readonly [number, string]> = {
  validation: [400, 'validation'],
  conflict: [409, 'conflict'],
  'not-initialized': [409, 'not-initialized'],
  interface: [503, 'interface-missing'],
  system: [500, 'apply-failed'],
};

/** Map anything thrown by a route to its status and body. */
function toHttp(given: unknown): { status: number; body: ErrorBody } {
  const e = worded(given);
  if (e instanceof HttpError) return { status: e.status, body: { error: e.code, message: e.message, ...e.extra } };
  if (e instanceof z.ZodError) {
    const h = validationError(e, 'body');
    return { status: h.status, body: { error: h.code, message: h.message, ...h.extra } };
  }
  if (e instanceof QueueClosedError) return { status: 503, body: { error: 'shutting-down', message: e.message } };
  if (e instanceof NatgwError) {
    const [status, error] = BY_KIND[e.kind];
    return { status, body: { error, message: e.message, ...(e.kind === 'validation' && e.field ? { field: e.field, in: 'body' as const } : {}) } };
  }
  // body-parser's errors carry status and type.
  const bp = e as { status?: number; statusCode?: number; type?: string; message?: string; expose?: boolean };
  const status = bp.status ?? bp.statusCode;
  if (typeof status === 'number' && status >= 400 && status < 500) {
    if (bp.type === 'entity.too.large')
      return { status: 413, body: { error: 'too-large', message: 'request body exceeds the configured limit (NATGW_BODY_LIMIT)' } };
    if (bp.type === 'entity.parse.failed') return { status: 400, body: { error: 'validation', message: 'body: not valid JSON', field: 'body', in: 'body' } };
    return { status, body: { error: 'bad-request', message: bp.expose !== false && bp.message ? bp.message : 'bad request' } };
  }
  const msg = e instanceof Error ? e.message : String(e);
  return { status: 500, body: { error: 'internal', message: msg.startsWith('Error:') ? msg : `Error: ${msg}` } };
}

/**
 * `redact` (the TCP listener): a 5xx body carries a stable message and an error id, never the
 * tool's stderr or a file path; the full error is in the log under that id. A 4xx answer is
 * about the caller's own input and keeps its text.
 */
export function errorHandler(log: Logger, opts: { readonly redact?: boolean } = {}): ErrorRequestHandler {
  return (err, req, res, next) => {
    if (res.headersSent) {
      next(err);
      return;
    }
    const { status, body: full } = toHttp(err);
    const errorId = String(res.locals.reqId ?? randomUUID());
    const body: ErrorBody =
      opts.redact && status >= 500
        ? { error: full.error, message: REDACTED[full.error] ?? 'internal error (details in the natgw log under errorId)', errorId }
        : full;
    res.locals.error = full;
    if (status >= 500) log.error({ err, reqId: res.locals.reqId, errorId, path: req.path }, 'request failed');
    res.status(status).json(body);
  };
}

/** What a redacted 5xx says, by error code. */
const REDACTED: Record<string, string> = {
  'apply-failed': 'the kernel refused the change; nothing was applied (details in the natgw log under errorId)',
  'interface-missing': 'an interface natgw needs is missing (details in the natgw log under errorId)',
  'shutting-down': 'natgw is shutting down',
};
