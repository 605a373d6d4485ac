import type { Logger } from 'pino';
import type { Config } from '../config/config.js';
import type { Executor } from '../system/exec.js';
import { NotInitializedError } from '../model/errors.js';
import { StateStore, type BackendRecord } from '../state/store.js';
import { emptyState, type DesiredState } from '../state/state.js';
import type { Effect, OpResult } from '../state/operations.js';
import { natTablesOf, type NetfilterBackend } from '../dataplane/netfilter/backend.js';
import { ShareDnatTable } from '../dataplane/netfilter/shareDnat.js';
import { LinkManager } from '../dataplane/link.js';
import { Conntrack, type ConntrackFilter } from '../dataplane/conntrack.js';
import { QosManager } from '../dataplane/qos/manager.js';
import { EipCounters } from '../dataplane/eipCounters.js';
import { BackendProbe, decideBackend, instantiate, ownedElsewhere, sameChoice, type BackendChoice } from './backendSelect.js';
import { adoptState } from './adopt.js';

/** Conntrack flushes run side by side, this many at a time. */
const FLUSH_PARALLELISM = 8;

export interface EngineDeps {
  readonly config: Config;
  readonly exec: Executor;
  readonly log: Logger;
  readonly store?: StateStore;
}

export interface ApplyReport {
  readonly netfilterChanges: number;
  readonly shareDnatChanges: number;
  readonly linkChanges: number;
  readonly qosChanges: number;
  readonly script: string;
  readonly notes: readonly string[];
}

/** What the engine tells an observer after each (non-dry-run) apply: metrics, readiness. */
export type SyncEvent =
  | { readonly ok: true; readonly ms: number; readonly report: ApplyReport; readonly state: DesiredState }
  | { readonly ok: false; readonly ms: number; readonly error: unknown };

export interface Transaction {
  readonly state: DesiredState;
  readonly backend: NetfilterBackend;
  readonly choice: BackendChoice;
}

/**
 * The engine: the only writer to the kernel. A change is a pure operation on the desired
 * state, reconciled against what the kernel holds (read back every time, so drift is repaired
 * as a side effect), then persisted; only then is it acknowledged.
 */
export class Engine {
  readonly store: StateStore;
  readonly link: LinkManager;
  readonly shareDnat: ShareDnatTable;
  readonly conntrack: Conntrack;
  readonly qos: QosManager;
  readonly eipCounters: EipCounters;
  private readonly probe: BackendProbe;
  /** The state as last applied by this process (for GET /v1/state and metrics). */
  lastApplied: DesiredState | undefined;
  generation = 0;
  /** Observer of every apply (the daemon's metrics and readiness); unset in a shim run. */
  onSync?: (e: SyncEvent) => void;

  constructor(readonly deps: EngineDeps) {
    this.store =
      deps.store ??
      new StateStore(deps.config.stateDir, (file, reason) =>
        deps.log.error({ file, reason }, 'state file unreadable: set aside; adopting the rules natgw owns from the kernel'),
      );
    this.link = new LinkManager(deps.exec, deps.log);
    this.shareDnat = new ShareDnatTable(deps.exec, deps.log);
    this.conntrack = new Conntrack(deps.exec, deps.log);
    this.qos = new QosManager(deps.exec, deps.log);
    this.eipCounters = new EipCounters(deps.exec, deps.log);
    this.probe = new BackendProbe(deps.exec);
  }

  get config(): Config {
    return this.deps.config;
  }

  get log(): Logger {
    return this.deps.log;
  }

  /** The backend without taking the lock or recording anything (get-iptables-version). */
  async peekBackend(): Promise<NetfilterBackend> {
    const choice = await decideBackend(this.config, await this.store.loadBackend(), this.probe);
    return instantiate(choice, this.deps.exec, this.log);
  }

  /**
   * Resolve the backend under the lock: record the choice, and carry out a switch (prepare
   * and fill the new backend, then remove the old one's objects; a failed removal stays
   * recorded as pendingCleanup and is retried by the next transaction).
   *
   * The backend switched from is the recorded one, or, with no record (the state dir was lost
   * with the container, or the script ran here before), whichever other backend holds natgw's
   * objects. Without a state file the new backend is filled with what the old one holds, and
   * that adopted state is returned for the transaction to build on.
   */
  private async resolveBackend(
    state: DesiredState | undefined,
  ): Promise<{ backend: NetfilterBackend; choice: BackendChoice; adopted?: DesiredState }> {
    const record = await this.store.loadBackend();
    const choice = await decideBackend(this.config, record, this.probe);
    const backend = instantiate(choice, this.deps.exec, this.log);
    const previous: BackendChoice | undefined = record
      ? { kind: record.kind, variant: record.variant }
      : await ownedElsewhere(this.probe, choice);
    let pending: BackendChoice | undefined = record?.pendingCleanup;
    let adopted: DesiredState | undefined;
    if (previous && !sameChoice(previous, choice)) {
      this.log.info({ from: previous, to: choice }, 'switching netfilter backend');
      if (!state) {
        adopted = await adoptState(this, instantiate(previous, this.deps.exec, this.log));
        if (adopted) this.log.info('no state file: adopted the rules natgw owns from the backend switched from');
      }
      const fill = state ?? adopted;
      if (fill?.initialized) await backend.sync(natTablesOf(fill));
      // An earlier switch's cleanup that is still pending is not forgotten: it is tried now,
      // and whatever it leaves is found again by the read-back after the next cleanup.
      if (pending && !sameChoice(pending, choice) && !sameChoice(pending, previous)) {
        await this.removeBackend(pending);
      }
      pending = previous;
      await this.store.saveBackend({ ...choice, pendingCleanup: pending });
    } else if (!record) {
      await this.store.saveBackend(choice);
    }
    if (pending && !sameChoice(pending, choice)) {
      if (await this.removeBackend(pending)) {
        // Anything natgw still owns outside the chosen backend (a cleanup an earlier switch
        // could not finish) becomes the next pending cleanup: two backends never stay mixed.
        const left = await ownedElsewhere(this.probe, choice);
        await this.store.saveBackend(left ? { ...choice, pendingCleanup: left } : choice);
      }
    } else if (pending) {
      await this.store.saveBackend(choice);
    }
    return { backend, choice, ...(adopted ? { adopted } : {}) };
  }

  /** Remove an old backend's objects; false (logged, retried later) when that fails. */
  private async removeBackend(old: BackendChoice): Promise<boolean> {
    try {
      await instantiate(old, this.deps.exec, this.log).removeAll();
      this.log.info({ removed: old }, 'old netfilter backend cleaned');
      return true;
    } catch (e) {
      this.log.warn({ err: e, pending: old }, 'old backend not cleaned yet; will retry');
      return false;
    }
  }

  /** What natgw owns in the kernel (no state file survived), or an empty state. */
  private async adoptOrEmpty(backend: NetfilterBackend): Promise<DesiredState> {
    const adopted = await adoptState(this, backend);
    if (adopted) {
      this.log.info({ eips: adopted.eips.length, dnats: adopted.dnats.length, snats: adopted.snats.length, fips: adopted.fips.length }, 'no state file: adopted the rules natgw owns from the kernel');
      return adopted;
    }
    return emptyState(this.config.vpcInterface, this.config.extInterface);
  }

  /**
   * Run `fn` as one transaction under the cross-process lock: load, change, reconcile,
   * persist. `fn` returns the next state (or throws a typed error: nothing is applied).
   */
  async transact(
    fn: (tx: Transaction) => Promise<OpResult> | OpResult,
    opts: { guarded?: boolean; dryRun?: boolean; qos?: boolean } = {},
  ): Promise<{ state: DesiredState; report: ApplyReport; effects: readonly Effect[] }> {
    return this.store.withLock(async () => {
      const saved = await this.store.load();
      const { backend, choice, adopted } = await this.resolveBackend(saved);
      if (opts.guarded && !(await backend.isInitialized({ reuseForSync: true }))) throw new NotInitializedError();
      const state = saved ?? adopted ?? (await this.adoptOrEmpty(backend));
      const { state: next, effects } = await fn({ state, backend, choice });
      const started = performance.now();
      let report: ApplyReport;
      try {
        report = await this.reconcile(next, state, backend, { dryRun: opts.dryRun, qos: opts.qos ?? true });
        if (!opts.dryRun) await this.store.save(next);
      } catch (e) {
        if (!opts.dryRun) this.onSync?.({ ok: false, ms: performance.now() - started, error: e });
        throw e;
      }
      if (!opts.dryRun) {
        this.lastApplied = next;
        this.generation++;
        this.onSync?.({ ok: true, ms: performance.now() - started, report, state: next });
        await this.runEffects(next, effects);
      }
      return { state: next, report, effects };
    });
  }

  /** Make the kernel hold `want`. Netfilter first, so NAT is in place before addresses go up. */
  async reconcile(
    want: DesiredState,
    previous: DesiredState | undefined,
    backend: NetfilterBackend,
    opts: { dryRun?: boolean; qos?: boolean } = {},
  ): Promise<ApplyReport> {
    const notes: string[] = [];
    let script = '';
    let netfilterChanges = 0;
    // Addresses and routes are read while netfilter is being synced: independent, and each
    // process spawn is a noticeable part of a command's time.
    const linkView = this.link.view(want);
    linkView.catch(() => undefined);
    // Per-EIP accounting runs alongside; it never fails a change (EipCounters logs and retries).
    const accounting = want.initialized && !opts.dryRun ? this.eipCounters.sync(want.eips.map((e) => e.address)) : undefined;
    if (want.initialized) {
      const nf = await backend.sync(natTablesOf(want), { dryRun: opts.dryRun });
      netfilterChanges = nf.changes;
      script += nf.script;
    }
    let shareDnatChanges = 0;
    if (want.shareDnats.length > 0 || (previous?.shareDnats.length ?? 0) > 0) {
      const sd = await this.shareDnat.sync(want.shareDnats, { dryRun: opts.dryRun });
      shareDnatChanges = sd.changes;
      script += sd.script;
    }
    let linkChanges = 0;
    try {
      const l = await this.link.sync(want, previous, { dryRun: opts.dryRun, view: await linkView });
      linkChanges = l.changes;
      script += l.script;
    } catch (e) {
      // Put netfilter back as it was, so a failed change stays all-or-nothing.
      if (previous?.initialized && !opts.dryRun) await backend.sync(natTablesOf(previous)).catch(() => undefined);
      throw e;
    }
    let qosChanges = 0;
    if (opts.qos && (want.eipQos.length > 0 || want.qos.length > 0 || (previous?.eipQos.length ?? 0) > 0 || (previous?.qos.length ?? 0) > 0)) {
      const q = await this.qos.sync(want, { dryRun: opts.dryRun });
      qosChanges = q.changes;
      notes.push(...q.notes);
    }
    await accounting;
    return { netfilterChanges, shareDnatChanges, linkChanges, qosChanges, script, notes };
  }

  /**
   * ARP is sent without waiting; conntrack flushes run a few at a time side by side (a batch
   * may carry thousands, and each is a process).
   */
  private async runEffects(state: DesiredState, effects: readonly Effect[]): Promise<void> {
    const flushes: ConntrackFilter[] = [];
    for (const e of effects) {
      if (e.kind === 'garp') this.link.announce(state.interfaces.ext, e.ip);
      else flushes.push(e);
    }
    let next = 0;
    const worker = async () => {
      while (next < flushes.length) {
        const f = flushes[next++];
        if (f) await this.conntrack.flush(f);
      }
    };
    await Promise.all(Array.from({ length: Math.min(FLUSH_PARALLELISM, flushes.length) }, worker));
  }

  /** Re-apply the persisted state (daemon start, periodic resync, link events). */
  async resync(reason: string): Promise<ApplyReport> {
    const { report } = await this.transact(({ state }) => ({ state, effects: [] }), { qos: true });
    const drift = report.netfilterChanges + report.shareDnatChanges + report.linkChanges + report.qosChanges;
    if (drift > 0) this.log.warn({ reason, ...report, script: undefined }, 'resync repaired drift');
    return report;
  }

  async isInitialized(): Promise<boolean> {
    return (await this.peekBackend()).isInitialized();
  }

  /** The persisted state, or what natgw owns in the kernel where no state file survived. */
  async loadState(): Promise<DesiredState> {
    return (await this.store.load()) ?? this.adoptOrEmpty(await this.peekBackend());
  }

  async currentBackend(): Promise<BackendRecord | undefined> {
    return this.store.loadBackend();
  }
}
