import path from 'node:path';
import type { Logger } from 'pino';
import type { Config } from '../config/config.js';
import type { Executor } from '../system/exec.js';
import { NotInitializedError } from '../model/errors.js';
import { StateStore, type BackendRecord, type FilesStamp, type PendingCommit, type PreparedSnapshot } from '../state/store.js';
import { emptyState, type DesiredState } from '../state/state.js';
import type { Effect, OpResult } from '../state/operations.js';
import type { NetfilterBackend, SyncMode } from '../dataplane/netfilter/backend.js';
import { ShareDnatTable } from '../dataplane/netfilter/shareDnat.js';
import { SystemNftClient, type NftClient } from '../dataplane/netfilter/nft/client.js';
import { LinkManager } from '../dataplane/link.js';
import { Conntrack, type ConntrackFilter } from '../dataplane/conntrack.js';
import { QosManager } from '../dataplane/qos/manager.js';
import { EipCounters } from '../dataplane/eipCounters.js';
import { NeighbourManager } from '../dataplane/neighbours.js';
import type { BackendChoice } from './backendSelect.js';
import { BackendSwitch } from './backendSwitch.js';
import { adoptState } from './adopt.js';
import { linkPart, neighboursPart, netfilterPart, qosPart, shareDnatPart, type Part, type PartName } from './parts.js';
import { timelineMark } from '../system/timeline.js';

export interface EngineDeps {
  readonly config: Config;
  readonly exec: Executor;
  readonly log: Logger;
  readonly store?: StateStore;
  /** nftables for every part that uses it; by default `nft` through `exec` (tests: a fake kernel). */
  readonly nft?: NftClient;
}

export interface ApplyReport {
  readonly netfilterChanges: number;
  readonly shareDnatChanges: number;
  readonly linkChanges: number;
  readonly qosChanges: number;
  /** Static neighbour entries added, replaced or removed (absent where the engine has no such part). */
  readonly neighbourChanges?: number;
  readonly script: string;
  readonly notes: readonly string[];
}

/** A change's conntrack flushes: run, and skipped because the kernel's conntrack table held no matching entry (conntrack.ts). */
export interface FlushCount {
  readonly ran: number;
  readonly noEntries: number;
}

/** What the engine tells an observer after each (non-dry-run) apply: metrics, readiness. */
export type SyncEvent =
  | {
      readonly ok: true;
      readonly kind: SyncMode;
      readonly ms: number;
      readonly report: ApplyReport;
      readonly state: DesiredState;
      readonly flushes?: FlushCount;
    }
  | { readonly ok: false; readonly kind: SyncMode; readonly ms: number; readonly error: unknown };

/** Who hears about every apply. */
export type SyncListener = (e: SyncEvent) => void;

/**
 * The observers of every apply, in the order they subscribed (the agent's readiness before
 * the flow classifier). A listener that throws is logged and skipped: an observer must never
 * turn an applied change into a failed one.
 */
export class SyncListeners {
  private readonly listeners = new Set<SyncListener>();

  constructor(private readonly log?: Logger) {}

  /** Subscribe; the function returned unsubscribes. */
  add(listener: SyncListener): () => void {
    // A wrapper per subscription: the same function subscribed twice is heard twice and unsubscribed once.
    const entry: SyncListener = (e) => listener(e);
    this.listeners.add(entry);
    return () => {
      this.listeners.delete(entry);
    };
  }

  emit(e: SyncEvent): void {
    for (const l of [...this.listeners]) {
      try {
        l(e);
      } catch (err) {
        this.log?.error({ err }, 'a sync listener failed; the apply itself stands');
      }
    }
  }
}

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
 * state, applied to the kernel (a partial sync against what this process applied last, or a
 * full one that reads back and repairs drift), then persisted; only then is it acknowledged.
 */
export class Engine {
  readonly store: StateStore;
  readonly link: LinkManager;
  readonly shareDnat: ShareDnatTable;
  readonly conntrack: Conntrack;
  readonly qos: QosManager;
  readonly eipCounters: EipCounters;
  readonly neighbours: NeighbourManager;
  readonly backends: BackendSwitch;
  /** The state as last applied by this process (for GET /v1/state and metrics). */
  lastApplied: DesiredState | undefined;
  private trusted: Trusted | undefined;
  /**
   * Bumped by every distrust from outside a transaction (a link event, a lock takeover). A
   * transaction re-trusts what it applied only if no such distrust came while it ran: its
   * parts may have planned against views the event invalidated, then kept views of their own.
   */
  private epoch = 0;
  generation = 0;
  /** Observers of every apply (the daemon's metrics, readiness, flow classification); none in a shim run. */
  private readonly syncListeners: SyncListeners;

  constructor(readonly deps: EngineDeps) {
    this.syncListeners = new SyncListeners(deps.log);
    this.store =
      deps.store ??
      new StateStore(
        deps.config.stateDir,
        (file, reason) => deps.log.error({ file, reason }, 'state file unreadable: set aside; adopting the rules natgw owns from the kernel'),
        (err) => {
          deps.log.error({ err }, 'lock taken over while held (event loop stalled): the next transaction is a full sync');
          this.distrust();
        },
        (pid, why) => {
          // It may have died mid-transaction: what the kernel holds is read back, not trusted.
          if (why === 'dead')
            deps.log.warn({ pid }, "natgw's lock was held by a process that no longer exists: taken over; the next transaction is a full sync");
          else deps.log.warn({ pid }, "natgw's lock went stale (its holder has not refreshed it for 10 s): taken over; the next transaction is a full sync");
          this.distrust();
        },
      );
    const nft = deps.nft ?? new SystemNftClient(deps.exec);
    this.link = new LinkManager(deps.exec, deps.log, path.join(deps.config.stateDir, 'owned.json'));
    this.shareDnat = new ShareDnatTable(deps.exec, deps.log, nft);
    this.conntrack = new Conntrack(deps.exec, deps.log);
    this.qos = new QosManager(deps.exec, deps.log, undefined, path.join(deps.config.stateDir, 'qos-intent.json'));
    this.eipCounters = new EipCounters(deps.exec, deps.log, nft);
    this.neighbours = new NeighbourManager(deps.exec, deps.log);
    this.backends = new BackendSwitch({ ...deps, nft, store: this.store, adopt: (b) => adoptState(this, b) });
  }

  /** Hear about every (non-dry-run) apply; the function returned unsubscribes. */
  onSync(listener: SyncListener): () => void {
    return this.syncListeners.add(listener);
  }

  get config(): Config {
    return this.deps.config;
  }

  get log(): Logger {
    return this.deps.log;
  }

  /** The backend without taking the lock or recording anything (get-iptables-version). */
  peekBackend(): Promise<NetfilterBackend> {
    return this.backends.peek();
  }

  /**
   * Stop trusting what this process applied: the next transaction is a full sync. Called when
   * the kernel may have changed behind natgw's back (a link event) or an apply failed.
   */
  distrust(): void {
    this.epoch++;
    this.forgetViews();
  }

  /** distrust() without the epoch: a transaction's own failures must not block its own re-trust. */
  private forgetViews(): void {
    this.trusted = undefined;
    this.backends.forgetAll();
    this.link.forget();
    this.shareDnat.forget();
    this.eipCounters.forget();
    this.neighbours.forget();
  }

  /** What natgw owns in the kernel (no state file survived), or an empty state. */
  private async adoptOrEmpty(backend: NetfilterBackend): Promise<DesiredState> {
    const adopted = await adoptState(this, backend);
    if (adopted) {
      this.log.info(
        { eips: adopted.eips.length, dnats: adopted.dnats.length, snats: adopted.snats.length, fips: adopted.fips.length },
        'no state file: adopted the rules natgw owns from the kernel',
      );
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
    // Announcing starts processes: that waits until the lock is free and the answer on its way.
    let announce: (() => void) | undefined;
    const out = await this.store.withLock(async () => {
      timelineMark('lock taken');
      const epoch = this.epoch;
      this.backends.dropGuardReads();
      const stamp = await this.store.stamp();
      const sameFiles = this.trusted?.stamp.key === stamp.key;
      if (this.trusted && !sameFiles) this.log.info('durable state changed outside this process: full sync');
      const trusted = opts.mode !== 'full' && sameFiles ? this.trusted : undefined;
      let state: DesiredState;
      let backend: NetfilterBackend;
      let choice: BackendChoice;
      if (trusted) {
        ({ state, backend, choice } = trusted);
        // The skeleton was in the kernel at the last full sync and every change since went
        // through this process: the state's own flag is the guard's evidence.
        if (opts.guarded && !state.initialized) throw new NotInitializedError();
      } else {
        // A dry run (a status drift check) leaves what this process applied last trusted.
        if (!opts.dryRun) this.trusted = undefined;
        const saved = await this.store.load();
        // A dry run changes nothing: no switch of backends, no record written.
        const resolved: { backend: NetfilterBackend; choice: BackendChoice; adopted?: DesiredState } = opts.dryRun
          ? await this.backends.choose()
          : await this.backends.resolve(saved);
        ({ backend, choice } = resolved);
        if (opts.guarded && !(await backend.isInitialized({ reuseForSync: true }))) throw new NotInitializedError();
        state = saved ?? resolved.adopted ?? (await this.adoptOrEmpty(backend));
        timelineMark('loaded');
      }
      const initialized = trusted ? () => Promise.resolve(state.initialized) : () => backend.isInitialized({ reuseForSync: true });
      timelineMark('locked');
      const { state: next, effects } = await fn({ state, backend, choice, initialized });
      timelineMark('state built');
      for (const e of effects) if (e.kind === 'release') this.link.release({ addresses: e.address ? [e.address] : [], routes: e.route ? [e.route] : [] });
      let kind: SyncMode = trusted ? 'partial' : 'full';
      const started = performance.now();
      let report: ApplyReport;
      let flushing: Promise<FlushCount | undefined> | undefined;
      // A whole new snapshot (a bulk change) is prepared while the kernel applies (serialised
      // once the kernel tool runs, the next turn, not before the render) and put in place only
      // once the kernel took the change; a refused change's snapshot is dropped.
      const prepared =
        !opts.dryRun && this.store.writesSnapshot(state, next) ? new Promise<void>((r) => setImmediate(r)).then(() => this.store.prepare(next)) : undefined;
      prepared?.catch(() => undefined);
      // A small change's journal line is written now and synced while the kernel applies; a
      // change the kernel refuses has it revoked before the refusal is answered.
      const ahead = !opts.dryRun && !prepared ? this.store.commitAhead(state, next) : undefined;
      try {
        try {
          report = await this.reconcile(next, state, backend, {
            dryRun: opts.dryRun,
            qos: opts.qos ?? true,
            mode: kind,
            bulk: prepared !== undefined,
          });
        } catch (e) {
          if (kind === 'full' || opts.dryRun) throw await this.discard(prepared, e, ahead);
          this.log.warn({ err: e }, 'partial sync refused; retrying once as a full sync');
          this.syncListeners.emit({ ok: false, kind, ms: performance.now() - started, error: e });
          this.forgetViews();
          kind = 'full';
          report = await this.reconcile(next, state, backend, { qos: opts.qos ?? true, mode: kind }).catch(async (e2: unknown) => {
            throw await this.discard(prepared, e2, ahead);
          });
        }
        if (!opts.dryRun) {
          // The old translations are out of the kernel: their conntrack entries go while the
          // change is made durable (a process of its own either way, and neither waits on the other).
          timelineMark('reconciled');
          flushing = this.flushConntrack(effects);
          try {
            await (prepared ? (await prepared).publish() : ahead ? ahead.durable.then(() => ahead.confirm()) : this.store.commit(state, next));
          } catch (e) {
            // Not durable, so not acknowledged: the kernel goes back to the state that is.
            this.log.error({ err: e }, 'could not persist the change: putting the kernel back as it was');
            await this.discard(undefined, e, ahead);
            this.forgetViews();
            await this.reconcile(state, next, backend, { qos: opts.qos ?? true, mode: 'full' }).catch((undo: unknown) =>
              this.log.error({ err: undo }, 'could not put the kernel back; the next full sync repairs it'),
            );
            throw e;
          }
          timelineMark('durable');
          // Acknowledged: what the QoS part created for it is now the state's (its intent settles).
          await this.qos.settle(next).catch((e: unknown) => this.log.warn({ err: e }, 'QoS intent record not cleared; the next change clears it'));
        }
      } catch (e) {
        // The change failed after its flush began: the flush finishes first.
        await flushing;
        if (!opts.dryRun) {
          this.forgetViews();
          this.syncListeners.emit({ ok: false, kind, ms: performance.now() - started, error: e });
        }
        throw e;
      } finally {
        this.link.endTransaction();
      }
      if (!opts.dryRun) {
        const after = await this.store.stamp();
        this.trusted = this.epoch === epoch ? { state: next, backend, choice, stamp: after } : undefined;
        this.lastApplied = next;
        this.generation++;
        const ms = performance.now() - started;
        // The answer waits for the flush anyway; its listeners hear how it went.
        const flushes = await flushing;
        this.syncListeners.emit({ ok: true, kind, ms, report, state: next, ...(flushes ? { flushes } : {}) });
        // Full syncs are rare and say why the kernel was read back; partial ones are every command.
        const line = {
          kind,
          ms: Math.round(performance.now() - started),
          changes: report.netfilterChanges + report.shareDnatChanges + report.linkChanges + report.qosChanges + (report.neighbourChanges ?? 0),
        };
        if (kind === 'full') this.log.info(line, 'full sync: read back and reconciled everything natgw owns');
        else this.log.debug(line, 'partial sync');
        announce = () => this.announce(next, effects);
      }
      return { state: next, report, effects };
    });
    announce?.();
    return out;
  }

  /** A change the kernel refused is not persisted: its prepared snapshot or journal line goes. Resolves with `err`. */
  private async discard(prepared: Promise<PreparedSnapshot> | undefined, err: unknown, ahead?: PendingCommit): Promise<unknown> {
    await prepared?.then(
      (p) => p.discard(),
      () => undefined,
    );
    if (ahead && !(await ahead.revoke())) {
      this.log.error({ file: this.store.journalFile }, 'could not remove the refused change from the journal: a restart would apply it; fix the state dir');
    }
    return err;
  }

  /** The parts in the order they are applied: NAT before the addresses it translates go up. */
  private parts(backend: NetfilterBackend): readonly Part[] {
    return [
      netfilterPart(backend, this.eipCounters, this.log),
      shareDnatPart(this.shareDnat),
      linkPart(this.link),
      qosPart(this.qos),
      neighboursPart(this.neighbours),
    ];
  }

  /**
   * Make the kernel hold `want`, part by part. In a partial sync a part whose inputs did not
   * change is not touched at all. When a part fails, it and the parts already applied are put
   * back as they were (synced to `previous`, in reverse order), so a failed change stays
   * all-or-nothing; what a crash interrupts is finished by the next start's full sync (the
   * netfilter parts own whole tables, the link part its ownership record, QoS its intent record).
   */
  async reconcile(
    want: DesiredState,
    previous: DesiredState | undefined,
    backend: NetfilterBackend,
    opts: { dryRun?: boolean; qos?: boolean; mode?: SyncMode; bulk?: boolean } = {},
  ): Promise<ApplyReport> {
    const mode = opts.mode ?? 'full';
    const changes: Record<PartName, number> = { netfilter: 0, shareDnat: 0, link: 0, qos: 0, neighbours: 0 };
    const notes: string[] = [];
    let script = '';
    const applied: Part[] = [];
    const runs = (part: Part): boolean =>
      !(part.name === 'qos' && !opts.qos) &&
      (part.concerns(want, previous) || (mode === 'full' && part.repairsInFull === true)) &&
      !(mode === 'partial' && previous && !part.pending?.() && part.inputs.every((k) => want[k] === previous[k]));
    const parts = this.parts(backend).filter(runs);
    // Reads that need not wait for the parts before them start at once (a full sync's read-backs).
    for (const part of parts) part.prefetch?.(want, { mode, dryRun: opts.dryRun, bulk: opts.bulk }, previous);
    for (const part of parts) {
      try {
        const r = await part.sync(want, previous, {
          mode,
          dryRun: opts.dryRun,
          ...(opts.bulk ? { bulk: true } : {}),
        });
        applied.push(part);
        timelineMark(`part ${part.name}`);
        changes[part.name] = r.changes;
        script += r.script;
        notes.push(...r.notes);
      } catch (e) {
        // What a prefetch started for a part the change never reached (a tool waiting for its script) ends.
        for (const p of parts) p.abandon?.();
        // The failed part too: `ip -batch` and `tc -batch` stop half-way with the lines before
        // the error applied (an atomic part finds nothing to put back).
        if (!opts.dryRun) await this.rollBack([...applied, part], previous, want, mode);
        throw e;
      }
    }
    return {
      netfilterChanges: changes.netfilter,
      shareDnatChanges: changes.shareDnat,
      linkChanges: changes.link,
      qosChanges: changes.qos,
      neighbourChanges: changes.neighbours,
      script,
      notes,
    };
  }

  private async rollBack(applied: readonly Part[], previous: DesiredState | undefined, from: DesiredState, mode: SyncMode): Promise<void> {
    if (!previous) return;
    for (const part of [...applied].reverse()) {
      if (!part.concerns(previous, from)) continue;
      try {
        await part.sync(previous, from, { mode });
        this.log.info({ part: part.name }, 'put back as it was before the failed change');
      } catch (e) {
        // The part's view is gone with the failure; the full sync that follows repairs it.
        this.log.error({ err: e, part: part.name }, 'could not put back a part of a failed change; the next full sync repairs it');
      }
    }
  }

  /** ARP is sent without waiting (queued, a few at a time). */
  private announce(state: DesiredState, effects: readonly Effect[]): void {
    for (const e of effects) if (e.kind === 'garp') this.link.announce(state.interfaces.ext, e.ip);
  }

  /**
   * Conntrack flushes are the Conntrack part's (a batch may carry thousands). Never rejects: it
   * runs beside the commit, and the change is applied whatever the flush's outcome.
   */
  private async flushConntrack(effects: readonly Effect[]): Promise<FlushCount | undefined> {
    const flushes: ConntrackFilter[] = [];
    for (const e of effects) if (e.kind === 'conntrack-flush') flushes.push(e);
    if (flushes.length === 0) return undefined;
    let noEntries = 0;
    try {
      noEntries = (await this.conntrack.flushOwed(flushes)).skipped.length;
    } catch (e) {
      this.log.error({ err: e }, 'conntrack flush failed: connections may keep the old translation');
    }
    return { ran: flushes.length - noEntries, noEntries };
  }

  /** Re-apply the persisted state (daemon start, periodic resync, link events). */
  async resync(reason: string): Promise<ApplyReport> {
    const { report } = await this.transact(({ state }) => ({ state, effects: [] }), { qos: true, mode: 'full' });
    const drift = report.netfilterChanges + report.shareDnatChanges + report.linkChanges + report.qosChanges + (report.neighbourChanges ?? 0);
    // At start, changes are the persisted state put back (a fresh network namespace holds
    // nothing of it): a restore, not drift.
    if (drift > 0 && reason === 'start') this.log.info({ reason, ...report, script: undefined }, 'start: the persisted state restored into the kernel');
    else if (drift > 0) this.log.warn({ reason, ...report, script: undefined }, 'resync repaired drift');
    await this.conntrack.retryFailed();
    return report;
  }

  async isInitialized(): Promise<boolean> {
    return (await this.peekBackend()).isInitialized();
  }

  /** The persisted state, or what natgw owns in the kernel where no state file survived. */
  async loadState(): Promise<DesiredState> {
    const before = (await this.store.stamp()).key;
    const t = this.trusted;
    if (t && t.stamp.key === before) return t.state;
    let saved = await this.store.load();
    // Outside the lock a commit may replace the files mid-read (a snapshot, then the journal of
    // a newer one): what was read may lack changes acknowledged before this call. Read again
    // under the lock, where no commit runs.
    if ((await this.store.stamp()).key !== before) saved = await this.store.withLock(() => this.store.load());
    return saved ?? this.adoptOrEmpty(await this.peekBackend());
  }

  async currentBackend(): Promise<BackendRecord | undefined> {
    return this.store.loadBackend();
  }
}
