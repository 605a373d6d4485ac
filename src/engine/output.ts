import type { Logger } from 'pino';
import { NatgwError } from '../model/errors.js';
import { worded } from './conflicts.js';

/** A command's result exactly as the shim prints it (SPEC §1: stdout, stderr, exit status). */
export interface CommandOutput {
  readonly status: number;
  readonly stdout: string;
  readonly stderr: string;
}

export class Output {
  private readonly out: string[] = [];
  private readonly err: string[] = [];

  line(s: string): void {
    this.out.push(s);
  }

  error(s: string): void {
    this.err.push(s);
  }

  result(status: number): CommandOutput {
    const join = (l: string[]) => (l.length ? `${l.join('\n')}\n` : '');
    return { status, stdout: join(this.out), stderr: join(this.err) };
  }

  /**
   * How a legacy verb reports an error: a refusal the script would print (NatgwError, on the
   * stream the script used) or an unexpected failure on stderr.
   */
  failure(given: unknown, log: Logger, rules?: readonly string[]): CommandOutput {
    const e = worded(given);
    if (e instanceof NatgwError) {
      if (e.stream === 'stdout') this.line(e.message);
      else this.error(e.message);
      log.info({ rules, kind: e.kind, reason: e.message }, 'command refused');
    } else {
      const msg = e instanceof Error ? e.message : String(e);
      this.error(msg.startsWith('Error:') ? msg : `Error: ${msg}`);
      log.error({ rules, err: e }, 'command failed');
    }
    return this.result(1);
  }
}
