import pino, { type Logger } from 'pino';
import path from 'node:path';
import { mkdirSync } from 'node:fs';

/** The daemon logs JSON to stdout (SPEC). */
export function daemonLogger(level: string): Logger {
  return pino({ level, base: { svc: 'natgw' } });
}

/**
 * A shim run must keep its stdout and stderr for the command's own output, so its log goes
 * to a file in the state dir instead.
 */
export function commandLogger(level: string, stateDir: string): Logger {
  try {
    mkdirSync(stateDir, { recursive: true });
    return pino({ level, base: { svc: 'natgw', pid: process.pid } }, pino.destination({ dest: path.join(stateDir, 'natgw.log'), sync: true, mkdir: true }));
  } catch {
    return pino({ level: 'silent' });
  }
}
