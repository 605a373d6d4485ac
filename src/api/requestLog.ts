import { randomUUID } from 'node:crypto';
import type { RequestHandler } from 'express';
import type { Logger } from 'pino';

const QUIET = new Set(['/healthz', '/readyz', '/metrics']);
const SANE_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/**
 * One JSON log line per request: request id (the caller's X-Request-Id when sane, else a
 * new one, echoed back), method, path, status, duration and what the route added to
 * res.locals.log (command, outcome). Probes log at debug level.
 */
export function requestLog(log: Logger): RequestHandler {
  return (req, res, next) => {
    const given = req.get('x-request-id');
    const reqId = given && SANE_ID.test(given) ? given : randomUUID();
    res.locals.reqId = reqId;
    res.setHeader('X-Request-Id', reqId);
    const started = process.hrtime.bigint();
    res.on('finish', () => {
      const ms = Number(process.hrtime.bigint() - started) / 1e6;
      const status = res.statusCode;
      const line = {
        reqId,
        method: req.method,
        path: req.originalUrl,
        status,
        ms: Math.round(ms * 10) / 10,
        ...(res.locals.log as Record<string, unknown> | undefined),
        ...(res.locals.error ? { error: res.locals.error } : {}),
        outcome: (res.locals.log as { outcome?: string } | undefined)?.outcome ?? (status < 400 ? 'ok' : 'refused'),
      };
      // Probes are polled: debug, whatever they answer (a 503 from /readyz is an answer, not a failure).
      if (QUIET.has(req.path) && status !== 401) log.debug(line, 'request');
      else if (status >= 500) log.error(line, 'request');
      else log.info(line, 'request');
    });
    next();
  };
}
