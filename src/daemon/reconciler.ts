import type { Logger } from 'pino';
import type { Agent } from '../api/agent.js';
import type { Engine } from '../engine/engine.js';

export interface ReconcilerDeps {
  readonly agent: Pick<Agent, 'resync' | 'setInterfaces'>;
  /** The interface names the desired state uses now, and the wait for them (LinkManager.waitFor). */
  readonly engine: Pick<Engine, 'stateForResync' | 'link'>;
  readonly log: Logger;
  readonly periodMs: number;
  /** How long the start's resync waits for missing interfaces (SPEC §3.1); later ones look once. */
  readonly interfaceWaitMs: number;
}

/**
 * Drift repair (SPEC §3.7): a resync every period and on request (link events). Requests
 * that arrive while a resync runs collapse into one more run afterwards. A resync runs only
 * when both interfaces exist; the start's waits for them (bounded), later ones look once;
 * otherwise readiness says what is missing and the next link event (the interface appearing)
 * or period tries again.
 */
export class Reconciler {
  private interval: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  /** The resync under way: what stop() waits for (never the start's wait for interfaces). */
  private resyncing: Promise<unknown> | undefined;
  private again: string | undefined;
  private stopped = false;
  private lastMissing = '';

  constructor(private readonly deps: ReconcilerDeps) {}

  start(): void {
    this.interval = setInterval(() => this.request('periodic'), this.deps.periodMs);
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
      const { vpc, ext } = (await this.deps.engine.stateForResync()).interfaces;
      const waitMs = reason === 'start' ? this.deps.interfaceWaitMs : 0;
      const missing = await this.deps.engine.link.waitFor([vpc, ext], waitMs, (m) => {
        log.info({ missing: m, deadlineMs: waitMs }, 'waiting for interfaces');
        agent.setInterfaces(m);
      });
      agent.setInterfaces(missing);
      const m = missing.join(',');
      if (m !== this.lastMissing) {
        if (m && reason === 'start') {
          log.warn({ missing, waitedMs: waitMs }, 'interfaces still missing after the deadline: not ready; still waiting (link events, every resync period)');
        } else if (m) log.warn({ missing }, 'interfaces missing: not ready; resync waits for them');
        else if (this.lastMissing) log.info({ vpc, ext }, 'interfaces present again');
        this.lastMissing = m;
      }
      if (missing.length > 0 || this.stopped) return;
      this.resyncing = agent.resync(reason);
      await this.resyncing;
    } catch (e) {
      if (!this.stopped) log.error({ err: e, reason }, 'resync failed');
    }
  }

  /** Stop the timer and wait for a resync in progress. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.interval) clearInterval(this.interval);
    this.interval = undefined;
    await this.resyncing?.catch(() => undefined);
  }
}
