import type { Logger } from 'pino';
import type { Config } from '../config/config.js';
import type { Executor } from '../system/exec.js';
import { NotInitializedError } from '../model/errors.js';
import { StateStore, type BackendRecord, type FilesStamp } from '../state/store.js';
import { emptyState, type DesiredState } from '../state/state.js';
import type { Effect, OpResult } from '../state/operations.js';
import { natTablesOf, type NetfilterBackend, type SyncMode } from '../dataplane/netfilter/backend.js';
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
  | { readonly ok: true; readonly kind: SyncMode; readonly ms: number; readonly report: ApplyReport; readonly state: DesiredState }
  | { readonly ok: false; readonly kind: SyncMode; readonly ms: number; readonly error: unknown };

/**
 * What this process applied last and may plan the next change against without reading the
 * kernel back (kube-proxy's partial sync). Valid only while the durable files are exactly as
 * this process left them (`stamp`): another writer means a full sync.
 */
interface Trusted {
  readonly state: DesiredState;
  readonly choice: BackendChoice;
  readonly backend: NetfilterBackend;
  readonly stamp: FilesStamp;
}

export interface TransactOptions {
  /** Refused with NotInitializedError until init has run (SPEC §2 guard). */
  readonly guarded?: boolean;
  readonly dryRun?: boolean;
  /** The change touches QoS (tc is synced too). */
  readonly qos?: boolean;
  /**
   * `full` reads back and repairs everything natgw owns (start, resync, init, link events);
   * the default plans against what this process applied last when it can trust that.
   */
  readonly mode?: SyncMode;
}

export interface Transaction {
  readonly state: DesiredState;
  readonly backend: NetfilterBackend;
  readonly choice: BackendChoice;
  /** The init guard's answer for this transaction (SPEC §2), read from the kernel only in a full sync. */
  readonly initialized: () => Promise<boolean>;
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
  private trusted: Trusted | undefined;
  /** One backend object per choice: each keeps the view it last applied (partial syncs plan against it). */
  private readonly backends = new Map<string, NetfilterBackend>();
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
    return this.backendFor(choice);
  }

  private backendFor(choice: BackendChoice): NetfilterBackend {
    const key = `${choice.kind}/${choice.variant ?? ''}`;
    let b = this.backends.get(key);
    if (!b) {
      b = instantiate(choice, this.deps.exec, this.log);
      this.backends.set(key, b);
    }
    return b;
  }

  /**
   * Stop trusting what this process applied: the next transaction is a full sync. Called when
   * the kernel may have changed behind natgw's back (a link event) or an apply failed.
   */
  distrust(): void {
    this.trusted = undefined;
    for (const b of this.backends.values()) b.forget();
    this.link.forget();
    this.shareDnat.forget();
    this.qos.forget();
    this.eipCounters.forget();
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
    const backend = this.backendFor(choice);
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
   *
   * The sync is partial when this process can trust what it applied last (same durable files,
   * nothing refused since): the change is planned against that, and nothing is read back. It
   * is full otherwise, or when asked for. A partial sync the kernel refuses is retried once as
   * a full one (DESIGN.md, kube-proxy's model).
   */
  async transact(
    fn: (tx: Transaction) => Promise<OpResult> | OpResult,
    opts: TransactOptions = {},
  ): Promise<{ state: DesiredState; report: ApplyReport; effects: readonly Effect[] }> {
    return this.store.withLock(async () => {
      const stamp = await this.store.stamp();
      const trusted = opts.mode !== 'full' && this.trusted?.stamp.key === stamp.key ? this.trusted : undefined;
      if (!trusted && this.trusted) this.log.info('durable state changed outside this process: full sync');
      let state: DesiredState;
      /** No state file: what was adopted (or the empty state) is written whole once applied. */
      let unsaved = false;
      let backend: NetfilterBackend;
      let choice: BackendChoice;
      if (trusted) {
        ({ state, backend, choice } = trusted);
        // The skeleton was in the kernel at the last full sync and every change since went
        // through this process: the state's own flag is the guard's evidence.
        if (opts.guarded && !state.initialized) throw new NotInitializedError();
      } else {
        this.trusted = undefined;
        const saved = await this.store.load();
        const resolved = await this.resolveBackend(saved);
        ({ backend, choice } = resolved);
        if (opts.guarded && !(await backend.isInitialized({ reuseForSync: true }))) throw new NotInitializedError();
        state = saved ?? resolved.adopted ?? (await this.adoptOrEmpty(backend));
        unsaved = saved === undefined;
      }
      const initialized = trusted ? () => Promise.resolve(state.initialized) : () => backend.isInitialized({ reuseForSync: true });
      const { state: next, effects } = await fn({ state, backend, choice, initialized });
      let kind: SyncMode = trusted ? 'partial' : 'full';
      const started = performance.now();
      let report: ApplyReport;
      try {
        try {
          report = await this.reconcile(next, state, backend, { dryRun: opts.dryRun, qos: opts.qos ?? true, mode: kind });
        } catch (e) {
          if (kind === 'full' || opts.dryRun) throw e;
          this.log.warn({ err: e }, 'partial sync refused; retrying once as a full sync');
          this.onSync?.({ ok: false, kind, ms: performance.now() - started, error: e });
          this.distrust();
          kind = 'full';
          report = await this.reconcile(next, state, backend, { qos: opts.qos ?? true, mode: kind });
        }
        if (!opts.dryRun) await (unsaved ? this.store.save(next) : this.store.commit(state, next));
      } catch (e) {
        if (!opts.dryRun) {
          this.distrust();
          this.onSync?.({ ok: false, kind, ms: performance.now() - started, error: e });
        }
        throw e;
      }
      if (!opts.dryRun) {
        this.trusted = { state: next, backend, choice, stamp: await this.store.stamp() };
        this.lastApplied = next;
        this.generation++;
        this.onSync?.({ ok: true, kind, ms: performance.now() - started, report, state: next });
        this.log.debug({ kind, ms: Math.round(performance.now() - started) }, 'sync');
        await this.runEffects(next, effects);
      }
      return { state: next, report, effects };
    });
  }

  /**
   * Make the kernel hold `want`. Netfilter first, so NAT is in place before addresses go up.
   * In a partial sync a part whose inputs did not change is not touched at all.
   */
  async reconcile(
    want: DesiredState,
    previous: DesiredState | undefined,
    backend: NetfilterBackend,
    opts: { dryRun?: boolean; qos?: boolean; mode?: SyncMode } = {},
  ): Promise<ApplyReport> {
    const mode = opts.mode ?? 'full';
    const partial = mode === 'partial' && previous !== undefined;
    const same = <K extends keyof DesiredState>(...keys: K[]): boolean => partial && keys.every((k) => want[k] === previous[k]);
    const notes: string[] = [];
    let script = '';
    let netfilterChanges = 0;
    const linkSame = same('eips', 'routes', 'defaultRoutes', 'interfaces');
    // Addresses and routes are read while netfilter is being synced: independent, and each
    // process spawn is a noticeable part of a command's time.
    const linkView = linkSame || mode === 'partial' ? undefined : this.link.view(want);
    linkView?.catch(() => undefined);
    // Per-EIP accounting runs alongside; it never fails a change (EipCounters logs and retries).
    const accounting =
      want.initialized && !opts.dryRun && !same('eips') ? this.eipCounters.sync(want.eips.map((e) => e.address), { mode }) : undefined;
    if (want.initialized && !same('eips', 'snats', 'dnats', 'fips', 'interfaces')) {
      const nf = await backend.sync(natTablesOf(want), { dryRun: opts.dryRun, mode });
      netfilterChanges = nf.changes;
      script += nf.script;
    }
    let shareDnatChanges = 0;
    if ((want.shareDnats.length > 0 || (previous?.shareDnats.length ?? 0) > 0) && !same('shareDnats')) {
      const sd = await this.shareDnat.sync(want.shareDnats, { dryRun: opts.dryRun, mode });
      shareDnatChanges = sd.changes;
      script += sd.script;
    }
    let linkChanges = 0;
    if (!linkSame) {
      try {
        const view = await linkView;
        const l = await this.link.sync(want, previous, { dryRun: opts.dryRun, mode, ...(view ? { view } : {}) });
        linkChanges = l.changes;
        script += l.script;
      } catch (e) {
        // Put netfilter back as it was, so a failed change stays all-or-nothing.
        if (previous?.initialized && !opts.dryRun) await backend.sync(natTablesOf(previous), { mode }).catch(() => undefined);
        throw e;
      }
    }
    let qosChanges = 0;
    const hasQos = want.eipQos.length > 0 || want.qos.length > 0 || (previous?.eipQos.length ?? 0) > 0 || (previous?.qos.length ?? 0) > 0;
    if (opts.qos && hasQos && !same('eipQos', 'qos', 'interfaces')) {
      const q = await this.qos.sync(want, { dryRun: opts.dryRun, mode });
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
    const { report } = await this.transact(({ state }) => ({ state, effects: [] }), { qos: true, mode: 'full' });
    const drift = report.netfilterChanges + report.shareDnatChanges + report.linkChanges + report.qosChanges;
    if (drift > 0) this.log.warn({ reason, ...report, script: undefined }, 'resync repaired drift');
    return report;
  }

  async isInitialized(): Promise<boolean> {
    return (await this.peekBackend()).isInitialized();
  }

  /** The persisted state, or what natgw owns in the kernel where no state file survived. */
  async loadState(): Promise<DesiredState> {
    const t = this.trusted;
    if (t && t.stamp.key === (await this.store.stamp()).key) return t.state;
    return (await this.store.load()) ?? this.adoptOrEmpty(await this.peekBackend());
  }

  async currentBackend(): Promise<BackendRecord | undefined> {
    return this.store.loadBackend();
  }
}
