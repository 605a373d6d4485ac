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
import { Conntrack } from '../dataplane/conntrack.js';
import { QosManager } from '../dataplane/qos/manager.js';
import { BackendProbe, decideBackend, instantiate, sameChoice, type BackendChoice } from './backendSelect.js';
import { adoptState } from './adopt.js';

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
  private readonly probe: BackendProbe;
  /** The state as last applied by this process (for GET /v1/state and metrics). */
  lastApplied: DesiredState | undefined;
  generation = 0;
  /** Observer of every apply (the daemon's metrics and readiness); unset in a shim run. */
  onSync?: (e: SyncEvent) => void;

  constructor(readonly deps: EngineDeps) {
    this.store = deps.store ?? new StateStore(deps.config.stateDir);
    this.link = new LinkManager(deps.exec, deps.log);
    this.shareDnat = new ShareDnatTable(deps.exec, deps.log);
    this.conntrack = new Conntrack(deps.exec, deps.log);
    this.qos = new QosManager(deps.exec, deps.log);
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
   * and fill the new backend, then remove the old one's objects; a failed removal is
   * retried by the next transaction).
   */
  private async resolveBackend(state: DesiredState | undefined): Promise<{ backend: NetfilterBackend; choice: BackendChoice }> {
    const record = await this.store.loadBackend();
    const choice = await decideBackend(this.config, record, this.probe);
    const backend = instantiate(choice, this.deps.exec, this.log);
    let pending: BackendChoice | undefined = record?.pendingCleanup;
    if (record && !sameChoice(record, choice)) {
      this.log.info({ from: record, to: choice }, 'switching netfilter backend');
      if (state?.initialized) await backend.sync(natTablesOf(state));
      pending = { kind: record.kind, variant: record.variant };
      await this.store.saveBackend({ ...choice, pendingCleanup: pending });
    } else if (!record) {
      await this.store.saveBackend(choice);
    }
    if (pending && !sameChoice(pending, choice)) {
      try {
        await instantiate(pending, this.deps.exec, this.log).removeAll();
        await this.store.saveBackend(choice);
        this.log.info({ removed: pending }, 'old netfilter backend cleaned');
      } catch (e) {
        this.log.warn({ err: e, pending }, 'old backend not cleaned yet; will retry');
      }
    } else if (pending) {
      await this.store.saveBackend(choice);
    }
    return { backend, choice };
  }

  /** The persisted state, or what natgw owns in the kernel where no state file survived. */
  private async loadOrAdopt(backendHint?: NetfilterBackend): Promise<DesiredState> {
    const saved = await this.store.load();
    if (saved) return saved;
    const backend = backendHint ?? (await this.peekBackend());
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
      const { backend, choice } = await this.resolveBackend(saved);
      if (opts.guarded && !(await backend.isInitialized())) throw new NotInitializedError();
      const state = saved ?? (await this.loadOrAdopt(backend));
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
    return { netfilterChanges, shareDnatChanges, linkChanges, qosChanges, script, notes };
  }

  private async runEffects(state: DesiredState, effects: readonly Effect[]): Promise<void> {
    for (const e of effects) {
      if (e.kind === 'garp') this.link.announce(state.interfaces.ext, e.ip);
      else await this.conntrack.flush(e);
    }
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

  async loadState(): Promise<DesiredState> {
    return this.loadOrAdopt();
  }

  async currentBackend(): Promise<BackendRecord | undefined> {
    return this.store.loadBackend();
  }
}
