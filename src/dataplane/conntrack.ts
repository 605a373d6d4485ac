import type { Logger } from 'pino';
import type { Executor } from '../system/exec.js';

export interface ConntrackFilter {
  readonly dst: string;
  readonly protocol?: 'tcp' | 'udp';
  readonly port?: number;
}

/** PURE: conntrack arguments deleting entries whose ORIGINAL destination matches. */
export function conntrackDeleteArgs(f: ConntrackFilter): string[] {
  const args = ['-D', '--orig-dst', f.dst];
  if (f.protocol) args.push('-p', f.protocol);
  if (f.protocol && f.port !== undefined) args.push('--orig-port-dst', String(f.port));
  return args;
}

/**
 * Flush stale conntrack entries after a NAT mapping went away, so existing flows stop using
 * the old translation. conntrack exits 1 when nothing matched; that is success here, and its
 * summary line (on stderr) never reaches natgw's stderr.
 */
export class Conntrack {
  constructor(
    private readonly exec: Executor,
    private readonly log?: Logger,
  ) {}

  async flush(f: ConntrackFilter): Promise<number> {
    const r = await this.exec.run({ file: 'conntrack', args: conntrackDeleteArgs(f) });
    if (r.failedToStart) {
      this.log?.warn({ filter: f }, 'conntrack tool missing: stale connections were not flushed');
      return 0;
    }
    const m = /(\d+) flow entries have been deleted/.exec(r.stderr + r.stdout);
    const n = m ? Number(m[1]) : 0;
    this.log?.info({ filter: f, deleted: n }, 'conntrack flushed');
    return n;
  }
}
