import type { Logger } from 'pino';
import type { CommandOutput, Output } from './output.js';
import { NatgwError } from '../model/errors.js';
import { worded } from './conflicts.js';

/**
 * How a legacy verb reports an error: a refusal the script would print (NatgwError, on the
 * stream the script used) or an unexpected failure on stderr. Its own module because both the
 * verb dispatcher (legacy.ts) and `init` (init.ts) need it, and legacy.ts dispatches to init.
 */
export function failure(out: Output, given: unknown, log: Logger, rules?: readonly string[]): CommandOutput {
  const e = worded(given);
  if (e instanceof NatgwError) {
    if (e.stream === 'stdout') out.line(e.message);
    else out.error(e.message);
    log.info({ rules, kind: e.kind, reason: e.message }, 'command refused');
  } else {
    const msg = e instanceof Error ? e.message : String(e);
    out.error(msg.startsWith('Error:') ? msg : `Error: ${msg}`);
    log.error({ rules, err: e }, 'command failed');
  }
  return out.result(1);
}
