import type { Logger } from 'pino';
import type { Agent } from './agent.js';

export interface ReconcilerDeps {
  readonly agent: Pick<Agent, 'resync' | 'setInterfaces'>;
  readonly log: Logger;
  readonly periodMs: number;
  /** The interface names the desired state uses now. */
  readonly interfaces: () => Promise<{ vpc: string; ext: string }>;
  readonly exists: (ifname: string) => Promise<boolean>;
}

/**
 * Drift repair (SPEC §3.7): a resync every period and on request (link events). Requests
 * that arrive while a resync runs collapse into one more run afterwards. A resync runs only
 * when both interfaces exist; otherwise readiness says what is missing and the next link
 * event (the interface appearing) or period tries again.
 */
export class Reconciler {
  private interval: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private again: string | undefined;
  private stopped = false;
  private lastMissing = '';
  private presentNow = false;

  constructor(private readonly deps: ReconcilerDeps) {}

  /**
   * `present`: the caller has just seen both interfaces (the start-up wait), so the first
   * resync does not look again (two `ip` processes on the way to ready).
   */
  start(opts: { present?: boolean } = {}): void {
    this.interval = setInterval(() => this.request('periodic'), this.deps.periodMs);
    this.presentNow = opts.present === true;
    this.request('start');
  }

  /** Resync soon; merged with a resync already waiting. */
  request(reason: string): void {
    if (this.stopped) return;
    if (this.running) {
      this.again ??= reason;
      return;
    }
    this.running = this.loop(reason).finally(() => {
      this.running = undefined;
    });
  }

  private async loop(first: string): Promise<void> {
    let reason: string | undefined = first;
    while (reason !== undefined && !this.stopped) {
      await this.tick(reason);
      reason = this.again;
      this.again = undefined;
    }
  }

  private async tick(reason: string): Promise<void> {
    const { log, agent } = this.deps;
    try {
      const seen = this.presentNow;
      this.presentNow = false;
      if (!seen) {
        const { vpc, ext } = await this.deps.interfaces();
        const missing = await missingOf([vpc, ext], this.deps.exists);
        agent.setInterfaces(missing);
        const m = missing.join(',');
        if (m !== this.lastMissing) {
          if (m) log.warn({ missing }, 'interfaces missing: not ready; resync waits for them');
          else if (this.lastMissing) log.info({ vpc, ext }, 'interfaces present again');
          this.lastMissing = m;
        }
        if (missing.length > 0) return;
      }
      await agent.resync(reason);
    } catch (e) {
      if (!this.stopped) log.error({ err: e, reason }, 'resync failed');
    }
  }

  /** Stop the timer and wait for a resync in progress. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.interval) clearInterval(this.interval);
    this.interval = undefined;
    await this.running?.catch(() => undefined);
  }
}

/** The names that do not exist, asked all at once. */
async function missingOf(names: readonly string[], exists: (ifname: string) => Promise<boolean>): Promise<string[]> {
  const found = await Promise.all(names.map(exists));
  return names.filter((_, i) => !found[i]);
}
