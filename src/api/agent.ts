import type { Logger } from 'pino';
import { changesOf, type ApplyReport, type Engine, type SyncEvent } from '../engine/engine.js';
import { ChangeBatcher, SerialQueue } from '../engine/queue.js';
import type { Metrics } from '../engine/metrics.js';
import { LEGACY_COMMANDS, runLegacy } from '../engine/legacy.js';
import type { CommandOutput } from '../engine/output.js';
import type { DesiredState } from '../state/state.js';
import type { LinkManager } from '../dataplane/link.js';
import { HttpError } from './errors.js';
import { diffStates, type StateChange } from '../state/change.js';
import { digestOf, effectsOf, planOf } from './stateDoc.js';
import { timelineMark } from '../system/timeline.js';
import type { DriftCheck, ReadBack, Readiness, ReplaceResult, StateDocument, SyncInfo } from './bodies.js';

/** The parts of the Engine the agent and the API use (a fake stands in for it in API tests). */
export type EngineLike = Pick<Engine, 'config' | 'log' | 'lastApplied' | 'generation' | 'onSync' | 'transact' | 'resync' | 'loadState' | 'currentBackend'> & {
  readonly link: Pick<LinkManager, 'uplinkNetworks'>;
};

export interface AgentDeps {
  readonly engine: EngineLike;
  readonly log: Logger;
  /**
   * The daemon's metrics, once prom-client has loaded (serve.ts loads it beside the first sync);
   * syncs observed before are recorded then, in order.
   */
  readonly metrics?: Promise<Metrics>;
  /** Restart hygiene (daemon only, daemon/hygiene.ts): run after the first successful resync, before ready. */
  readonly hygiene?: { afterFirstSync(state: DesiredState): Promise<void>; announce(state: DesiredState, why: string): void };
}

/** Commands that need neither the queue nor the state: they may run beside an apply. */
const UNQUEUED = new Set(['get-iptables-version', 'help', '--help', '-h']);

/**
 * Script commands whose transaction may be merged with others: pure NAT, address and route
 * operations that print nothing from inside the operation (a merged batch that fails is
 * retried request by request, running the operation again) and report no QoS notes. init,
 * the share-DNAT commands (they print from the operation) and QoS commands get a
 * transaction of their own.
 */
const MERGEABLE = new Set([
  'subnet-route-add',
  'subnet-route-del',
  'eip-add',
  'eip-del',
  'floating-ip-add',
  'floating-ip-del',
  'dnat-add',
  'dnat-del',
  'snat-add',
  'snat-del',
]);

/**
 * The daemon's core as the API sees it: the engine behind one queue, plus what the API reports
 * about it (readiness, drift, metrics). Every change goes through the queue; API changes that
 * arrive while another job runs are merged into one transaction (`batcher`).
 */
export class Agent {
  readonly queue = new SerialQueue();
  readonly batcher: ChangeBatcher;
  readonly metrics: Promise<Metrics>;
  private lastSync: { ok: boolean; at: string; error?: string } | null = null;
  /** The last apply's kind and duration (GET /v1/status). */
  lastSyncDetail: SyncInfo | null = null;
  private lastReadBack: ReadBack | null = null;
  private lastRepair: ReadBack | null = null;
  private repairs = 0;
  private interfaces: { present: boolean; missing: readonly string[] } = { present: false, missing: [] };
  private notReadyWhy: string[] = ['starting'];
  private hygienePending: boolean;
  /** Requests to announce every EIP after the next resync (external interface up), and how many were served. */
  private announceAsked = 0;
  private announceServed = 0;
  private readonly unsubscribe: () => void;

  constructor(private readonly deps: AgentDeps) {
    this.metrics = deps.metrics ?? import('../engine/metrics.js').then((m) => new m.Metrics());
    this.batcher = new ChangeBatcher(this.queue, deps.engine);
    this.hygienePending = deps.hygiene !== undefined;
    this.unsubscribe = deps.engine.onSync((e) => this.observe(e));
  }

  get engine(): EngineLike {
    return this.deps.engine;
  }

  /**
   * Every apply feeds the metrics. Readiness follows the kernel: any successful apply shows it
   * matches the desired state; a failed change was rolled back (the kernel still matches the
   * state before it), so only a failed resync makes the agent unready.
   */
  private observe(e: SyncEvent): void {
    void this.metrics.then((m) => m.observeSync(e));
    const at = new Date().toISOString();
    this.lastSyncDetail = e.ok
      ? { ok: true, at, kind: e.kind, ms: Math.round(e.ms) }
      : { ok: false, at, kind: e.kind, ms: Math.round(e.ms), error: e.error instanceof Error ? e.error.message : String(e.error) };
    if (e.ok) {
      this.lastSync = { ok: true, at: new Date().toISOString() };
      this.updateReady();
    } else if (e.kind === 'full') {
      this.deps.log.warn({ err: e.error }, 'apply failed; what it had applied was put back');
    }
    // A refused partial sync is retried at once as a full one (the engine logs it); only the
    // outcome of that retry says whether the change failed.
  }

  private syncFailed(e: unknown): void {
    const msg = e instanceof Error ? e.message : String(e);
    this.lastSync = { ok: false, at: new Date().toISOString(), error: msg };
    this.updateReady();
  }

  // ---- changes ----

  async legacy(command: string, rules: readonly string[]): Promise<CommandOutput> {
    const known = (LEGACY_COMMANDS as readonly string[]).includes(command);
    // The engine stands for itself here; API tests give a fake one.
    const engine = this.engine as Engine;
    if (UNQUEUED.has(command) || !known) return runLegacy(engine, command, rules);
    // Through the batcher (which queues it); not inside a queue job, which would wait on itself.
    if (MERGEABLE.has(command)) return runLegacy(engine, command, rules, this.batcher.transact);
    return this.queue.run(() => runLegacy(engine, command, rules));
  }

  async replaceState(next: DesiredState, opts: { dryRun: boolean; ifMatch?: string }): Promise<ReplaceResult> {
    return this.queue.run(async () => {
      let change: StateChange | undefined;
      let prev: DesiredState | undefined;
      let digest: Promise<string> | undefined;
      const { state, report } = await this.engine.transact(
        ({ state: current }) => {
          prev = current;
          if (opts.ifMatch !== undefined && opts.ifMatch !== digestOf(current)) {
            throw new HttpError(412, 'precondition-failed', `If-Match: the desired state's digest is ${digestOf(current)}, not ${opts.ifMatch}`, {
              field: 'If-Match',
              in: 'header',
            });
          }
          // The change by identity key: a document written back unchanged changes nothing.
          change = diffStates(current, next);
          // The answer's digest: hashed at the next turn of the event loop, while the kernel applies.
          if (!opts.dryRun) digest = new Promise((resolve) => setImmediate(() => resolve(digestOf(next))));
          return { state: next, effects: effectsOf(change), change };
        },
        { dryRun: opts.dryRun, qos: true },
      );
      const { script, ...counts } = report;
      return {
        dryRun: opts.dryRun,
        plan: planOf(change ?? diffStates(prev ?? state, next)),
        report: counts,
        // Only a dry run's answer carries the script (SPEC §4.2): a bulk change's is ~1 MiB
        // (nftables) to 2.5 MiB (iptables) that the answer would serialise and the client parse.
        ...(opts.dryRun ? { script } : {}),
        generation: this.engine.generation,
        digest: digest !== undefined ? await digest : digestOf(prev ?? state),
      };
    });
  }

  /** Reconcile now (start, timer, link event). Records what the read-back found. */
  async resync(reason: string): Promise<ApplyReport> {
    return this.queue.run(async () => {
      // Only a resync that starts after the request sees the addresses the link event took back.
      const asked = this.announceAsked;
      let report: ApplyReport;
      try {
        report = await this.engine.resync(reason);
      } catch (e) {
        this.syncFailed(e);
        throw e;
      }
      const n = changesOf(report);
      // The start's sync puts the persisted state into a kernel that lost it (or never had it):
      // a restore, not drift — the counter and lastRepair are for changes made behind natgw's back.
      const repaired = n > 0 && reason !== 'start';
      this.lastReadBack = {
        at: new Date().toISOString(),
        reason,
        changes: { ...changesByPart(report), neighbours: report.neighbourChanges },
        repaired,
        script: report.script,
      };
      if (repaired) {
        void this.metrics.then((m) => m.driftRepairs.inc());
        this.repairs++;
        this.lastRepair = this.lastReadBack;
      }
      await this.afterResync(asked);
      return report;
    });
  }

  /** Announce every EIP after the next resync (the external interface came up or was recreated). */
  requestAnnounce(): void {
    this.announceAsked++;
  }

  private async afterResync(asked: number): Promise<void> {
    const hygiene = this.deps.hygiene;
    const state = this.engine.lastApplied;
    if (!hygiene || !state) return;
    if (this.hygienePending) {
      timelineMark('synced');
      try {
        await hygiene.afterFirstSync(state);
      } catch (e) {
        // Best effort: a failed cleanup must not keep the gateway unready for good.
        this.deps.log.warn({ err: e }, 'restart hygiene failed');
      }
      this.hygienePending = false;
      this.announceServed = asked;
      this.updateReady();
    } else if (asked > this.announceServed) {
      this.announceServed = asked;
      hygiene.announce(state, 'external interface up');
    }
  }

  // ---- reading ----

  /** A resync that only renders: queued like one, so it never reads the kernel mid-apply. */
  async checkDrift(): Promise<DriftCheck> {
    return this.queue.run(async () => {
      const { report } = await this.engine.transact(({ state }) => ({ state, effects: [] }), { qos: true, mode: 'full', dryRun: true });
      return { at: new Date().toISOString(), changes: changesByPart(report), drifted: changesOf(report) > 0, script: report.script };
    });
  }

  async stateDocument(): Promise<StateDocument> {
    const [desired, backend] = await Promise.all([this.engine.loadState(), this.engine.currentBackend()]);
    return {
      desired,
      lastApplied: this.engine.lastApplied ?? null,
      drift: { last: this.lastReadBack, lastRepair: this.lastRepair, repairs: this.repairs },
      backend: backend ?? null,
      mode: this.engine.config.mode,
      generation: this.engine.generation,
      digest: digestOf(desired),
    };
  }

  // ---- readiness ----

  /** Reasons other parts of the daemon hold readiness for (replica sync joining), by part. */
  private readonly holds = new Map<string, string>();

  /** Hold readiness with a reason, or release it (null). */
  hold(part: string, reason: string | null): void {
    if (reason === null) this.holds.delete(part);
    else this.holds.set(part, reason);
    this.updateReady();
  }

  setInterfaces(missing: readonly string[]): void {
    this.interfaces = { present: missing.length === 0, missing: [...missing] };
    this.updateReady();
  }

  private updateReady(): void {
    const why: string[] = [];
    if (!this.interfaces.present)
      why.push(this.interfaces.missing.length ? `waiting for interface(s) ${this.interfaces.missing.join(', ')}` : 'interfaces not checked yet');
    if (!this.lastSync) why.push('no sync yet');
    else if (!this.lastSync.ok) why.push(`last sync failed: ${this.lastSync.error ?? 'unknown error'}`);
    else if (this.hygienePending) why.push('restart hygiene: cleaning up conntrack entries after the first apply');
    for (const reason of this.holds.values()) why.push(reason);
    const changed = (why.length === 0) !== (this.notReadyWhy.length === 0);
    this.notReadyWhy = why;
    void this.metrics.then((m) => m.ready.set(why.length === 0 ? 1 : 0));
    if (changed) for (const l of this.readinessListeners) l(why.length === 0);
  }

  readiness(): Readiness {
    return { ready: this.notReadyWhy.length === 0, interfaces: this.interfaces, lastSync: this.lastSync, reasons: this.notReadyWhy };
  }

  private readonly readinessListeners = new Set<(ready: boolean) => void>();

  /** Called whenever readiness flips (BGP withdraws the EIPs at once); the function returned unsubscribes. */
  onReadiness(listener: (ready: boolean) => void): () => void {
    this.readinessListeners.add(listener);
    return () => this.readinessListeners.delete(listener);
  }

  whenReady(timeoutMs: number): Promise<void> {
    if (this.notReadyWhy.length === 0 || timeoutMs <= 0) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        unsubscribe();
        resolve();
      };
      const unsubscribe = this.onReadiness((ready) => {
        if (ready) done();
      });
      // Its connection keeps the process alive as long as it needs; the timer alone must not delay a shutdown.
      const timer = setTimeout(done, timeoutMs).unref();
    });
  }

  /** Refuse new jobs and wait for the ones accepted (the running apply included). */
  async close(): Promise<void> {
    await this.queue.close();
    this.unsubscribe();
  }
}

function changesByPart(report: ApplyReport): ReadBack['changes'] {
  return { netfilter: report.netfilterChanges, shareDnat: report.shareDnatChanges, link: report.linkChanges, qos: report.qosChanges };
}
