import path from 'node:path';
import type { Logger } from 'pino';
import type { Config } from '../config/config.js';
import { ReplicaRole } from './replicaRole.js';
import type { Executor } from '../system/exec.js';
import { NotInitializedError } from '../model/errors.js';
import { StateStore, type BackendRecord, type Commit } from '../state/store.js';
import { emptyState, type DesiredState } from '../state/state.js';
import type { Effect, OpResult, TxResult } from '../state/operations.js';
import { diffStates, type StateChange } from '../state/change.js';
import type { NetfilterBackend, SyncMode } from '../dataplane/netfilter/backend.js';
import { ShareDnatTable } from '../dataplane/netfilter/shareDnat.js';
import { SystemNftClient, type NftClient } from '../dataplane/netfilter/nft/client.js';
import { LinkManager } from '../dataplane/link.js';
import { Conntrack, type ConntrackFilter } from '../dataplane/conntrack.js';
import { QosManager } from '../dataplane/qos/manager.js';
import { EipCounters } from '../dataplane/eipCounters.js';
import { NeighbourManager } from '../dataplane/neighbours.js';
import { BackendSwitch } from './backendSwitch.js';
import { adoptState } from './adopt.js';
import { ctTimeoutsPart, linkPart, neighboursPart, netfilterPart, qosPart, shareDnatPart, uplinksPart, type Part, type PartName } from './parts.js';
import { UplinkRoutes } from '../dataplane/linkUplinks.js';
import { CtTimeouts } from '../dataplane/ctTimeouts.js';
import { timelineMark } from '../system/timeline.js';
import { eipInterface, hasSecondaryUplinks } from '../model/uplinks.js';

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
  /** Static neighbour entries added, replaced or removed. */
  readonly neighbourChanges: number;
  readonly script: string;
  readonly notes: readonly string[];
}

/** A change's conntrack flushes: run, and skipped because the kernel's conntrack table held no matching entry (conntrack.ts). */
export interface FlushCount {
  readonly ran: number;
  readonly noEntries: number;
}

/** How many objects an apply added, replaced or removed, all parts together. */
export const changesOf = (r: ApplyReport): number => r.netfilterChanges + r.shareDnatChanges + r.linkChanges + r.qosChanges + r.neighbourChanges;

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
 * What this process applied last and may plan the next change against without reading the
 * kernel back (kube-proxy's partial sync). Valid only while the durable files are exactly as
 * this process left them (`stamp`): another writer means a full sync.
 */
interface Applied {
  readonly state: DesiredState;
  readonly backend: NetfilterBackend;
  readonly stamp: string;
}

/**
 * The one record of what the engine trusts: what it applied last, or why the next transaction
 * must read the kernel back (kube-proxy's `needFullSync`). A transaction replaces it with a
 * marker of its own while it runs; a distrust from outside (a link event, a lock taken over)
 * replaces that marker in turn, and the transaction trusts what it applied only if its marker
 * is still there at the end.
 */
type Trust = { readonly applied: Applied } | { readonly fullSync: string };

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

/** The engine's transaction, as the script commands and the batcher call it. */
export type Transact = Engine['transact'];

export interface Transaction {
  readonly state: DesiredState;
  /** The init guard's answer for this transaction (SPEC §2), read from the kernel only in a full sync. */
  readonly initialized: () => Promise<boolean>;
}

/** What a transaction plans against, and how it syncs. */
interface Base {
  readonly state: DesiredState;
  readonly backend: NetfilterBackend;
  readonly kind: SyncMode;
  /** Why a full sync reads the kernel back (the log says so). */
  readonly why?: string;
}

/**
 * The engine: the only writer to the kernel. A change is a pure operation on the desired
 * state, applied to the kernel (a partial sync against what this process applied last, or a
 * full one that reads back and repairs drift), then persisted; only then is it acknowledged.
 */
export class Engine {
  readonly store: StateStore;
  readonly link: LinkManager;
  /** Whether this replica announces (src/ha/role.ts). */
  readonly role: ReplicaRole;
  readonly shareDnat: ShareDnatTable;
  readonly conntrack: Conntrack;
  readonly qos: QosManager;
  readonly eipCounters: EipCounters;
  readonly neighbours: NeighbourManager;
  /** Timeouts of the connections natgw translates (NATGW_CT_TIMEOUT_*). */
  readonly ctTimeouts: CtTimeouts;
  readonly uplinks: UplinkRoutes;
  readonly backends: BackendSwitch;
  /** The state as last applied by this process (for GET /v1/state and metrics). */
  lastApplied: DesiredState | undefined;
  /** See Trust. A new engine has applied nothing: its first transaction is a full sync. */
  private trust: Trust = { fullSync: 'start' };
  /**
   * The state a resync's interface wait read under the lock (stateForResync), handed to the next
   * full sync while the durable files keep its stamp: a daemon's start reads the state once.
   */
  private waitRead: { readonly state: DesiredState | undefined; readonly stamp: string } | undefined;
  /** Acknowledged changes so far (reported with the state: GET /v1/state, PUT /v1/state's answer). */
  generation = 0;
  /**
   * Observers of every apply (the daemon's metrics, readiness, flow classification; none in a
   * shim run), heard in the order they subscribed: the agent's readiness before the flow classifier.
   */
  private readonly listeners = new Set<SyncListener>();

  constructor(readonly deps: EngineDeps) {
    this.store =
      deps.store ??
      new StateStore(
        deps.config.stateDir,
        (file, reason) => deps.log.error({ file, reason }, 'state file unreadable: set aside; adopting the rules natgw owns from the kernel'),
        (err) => {
          deps.log.error({ err }, 'lock taken over while held (event loop stalled): the next transaction is a full sync');
          this.distrust('the lock was taken over while held');
        },
        (pid, why) => {
          // It may have died mid-transaction: what the kernel holds is read back, not trusted.
          if (why === 'dead')
            deps.log.warn({ pid }, "natgw's lock was held by a process that no longer exists: taken over; the next transaction is a full sync");
          else deps.log.warn({ pid }, "natgw's lock went stale (its holder has not refreshed it for 10 s): taken over; the next transaction is a full sync");
          this.distrust(`the lock was taken over from a ${why} holder`);
        },
      );
    const nft = deps.nft ?? new SystemNftClient(deps.exec);
    this.link = new LinkManager(deps.exec, deps.log, path.join(deps.config.stateDir, 'owned.json'));
    this.role = new ReplicaRole(deps.config, deps.log);
    this.shareDnat = new ShareDnatTable(deps.exec, deps.log, nft);
    this.conntrack = new Conntrack(deps.exec, deps.log);
    this.qos = new QosManager(deps.exec, deps.log, undefined, path.join(deps.config.stateDir, 'qos-intent.json'));
    this.eipCounters = new EipCounters(deps.exec, deps.log, nft);
    this.neighbours = new NeighbourManager(deps.exec, deps.log);
    this.ctTimeouts = new CtTimeouts(deps.exec, nft, deps.log, deps.config.ctTimeouts);
    this.uplinks = new UplinkRoutes(deps.exec, nft, deps.log, path.join(deps.config.stateDir, 'uplinks.marker'));
    this.backends = new BackendSwitch({ ...deps, nft, store: this.store, adopt: (b) => adoptState(this, b) });
  }

  /** Hear about every (non-dry-run) apply; the function returned unsubscribes. */
  onSync(listener: SyncListener): () => void {
    // A wrapper per subscription: the same function subscribed twice is heard twice and unsubscribed once.
    const entry: SyncListener = (e) => listener(e);
    this.listeners.add(entry);
    return () => this.listeners.delete(entry);
  }

  /** A listener that throws is logged and skipped: an observer must never turn an applied change into a failed one. */
  private emit(e: SyncEvent): void {
    for (const l of [...this.listeners]) {
      try {
        l(e);
      } catch (err) {
        this.log.error({ err }, 'a sync listener failed; the apply itself stands');
      }
    }
  }

  get config(): Config {
    return this.deps.config;
  }

  get log(): Logger {
    return this.deps.log;
  }

  /**
   * Stop trusting what this process applied: the next transaction is a full sync, and one
   * running now does not trust what it applies. Called when the kernel may have changed behind
   * natgw's back (a link event, the lock taken over).
   */
  distrust(why = 'the kernel may have changed outside natgw'): void {
    this.trust = { fullSync: why };
    this.forgetViews();
  }

  /** Every part drops what it remembers of the kernel: its next sync reads it back. */
  private forgetViews(): void {
    this.backends.forgetAll();
    this.shareDnat.forget();
    this.ctTimeouts.forget();
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
   * Run `fn` as one transaction under the cross-process lock. `fn` returns the next state (or
   * throws a typed error: nothing is applied). The sync is partial when this process can trust
   * what it applied last, full otherwise or when asked for; a partial sync the kernel refuses
   * is retried once as a full one (DESIGN.md, kube-proxy's model). Only a change that is in the
   * kernel and durable is acknowledged.
   */
  async transact(
    fn: (tx: Transaction) => Promise<TxResult> | TxResult,
    opts: TransactOptions = {},
  ): Promise<{ state: DesiredState; report: ApplyReport; effects: readonly Effect[] }> {
    // Announcing starts processes: that waits until the lock is free and the answer on its way.
    let announce: (() => void) | undefined;
    const out = await this.store.withLock(async () => {
      timelineMark('lock taken');
      try {
        const { base, change, running } = await this.begin(fn, opts);
        const next = change.state;
        if (opts.dryRun) {
          const report = await this.reconcile(next, base.state, base.backend, { dryRun: true, qos: opts.qos ?? true, mode: base.kind, change: change.change });
          return { state: next, report, effects: change.effects };
        }
        const started = performance.now();
        const durable = this.store.begin(base.state, next, change.change);
        const { report, kind } = await this.applyRetryingFull(next, change.change, base, durable, opts, started);
        const flushing = this.flushConntrack(change.effects);
        await this.persist(next, base, durable, opts).catch(async (e: unknown) => {
          // The change failed after its flush began: the flush finishes first.
          await flushing;
          throw this.failed(kind, started, e);
        });
        // Acknowledged: what the QoS part created for the change is now the state's.
        await this.qos.settle(next).catch((e: unknown) => this.log.warn({ err: e }, 'QoS intent record not cleared; the next change clears it'));
        this.trustApplied(next, base, running);
        this.notify(kind === base.kind ? base : { ...base, kind, why: 'the partial sync was refused' }, started, report, next, await flushing);
        announce = () => this.announce(next, change.effects);
        return { state: next, report, effects: change.effects };
      } finally {
        this.link.endTransaction();
      }
    });
    announce?.();
    return out;
  }

  /**
   * Decide the sync's mode, load what it plans against and build the next state; nothing is
   * applied yet. A change marks the trust record as its own while it runs (see Trust); one
   * that stops here (a refused operation) leaves the record as it decided it.
   */
  private async begin(fn: (tx: Transaction) => Promise<TxResult> | TxResult, opts: TransactOptions): Promise<{ base: Base; change: OpResult; running: Trust }> {
    const trust = this.trust;
    const running: Trust = { fullSync: 'the last change failed or was cut short' };
    // A dry run (a status drift check) changes nothing, what the engine trusts included.
    if (!opts.dryRun) this.trust = running;
    const decided = this.needFullSync(opts, trust);
    try {
      const base = 'applied' in decided ? this.reuse(decided.applied, opts) : await this.load(opts, decided.fullSync);
      return { base, change: await this.build(fn, base), running };
    } catch (e) {
      if (this.trust === running) this.trust = decided;
      throw e;
    }
  }

  /**
   * kube-proxy's needFullSync, decided in one place: why this transaction must read the kernel
   * back (asked for: start, resync timer, init; nothing trusted: start, a refusal, a link event,
   * a lock taken over; the durable files written by another process), or what it may plan against.
   */
  private needFullSync(opts: TransactOptions, trust: Trust): Trust {
    if (opts.mode === 'full') return { fullSync: 'asked for' };
    if ('fullSync' in trust) return trust;
    if (trust.applied.stamp !== this.store.stamp()) {
      this.log.info('durable state changed outside this process: full sync');
      return { fullSync: 'durable state changed outside this process' };
    }
    return trust;
  }

  /** A partial sync plans against what this process applied last. */
  private reuse(applied: Applied, opts: TransactOptions): Base {
    // The skeleton was in the kernel at the last full sync and every change since went
    // through this process: the state's own flag is the guard's evidence.
    if (opts.guarded && !applied.state.initialized) throw new NotInitializedError();
    return { state: applied.state, backend: applied.backend, kind: 'partial' };
  }

  /** A full sync loads the durable state (or adopts natgw's objects from the kernel) and resolves the backend. */
  private async load(opts: TransactOptions, why: string): Promise<Base> {
    const read = this.waitRead;
    this.waitRead = undefined;
    // The store's record of its files (the journal's base) is still the one that read set while they keep its stamp.
    const saved = read !== undefined && read.stamp === this.store.stamp() ? read.state : await this.store.load();
    // A dry run changes nothing: no switch of backends, no record written.
    const { backend, adopted } = opts.dryRun ? { backend: await this.backends.choose(), adopted: undefined } : await this.backends.resolve(saved);
    if (opts.guarded && !(await backend.isInitialized())) throw new NotInitializedError();
    const state = saved ?? adopted ?? (await this.adoptOrEmpty(backend));
    timelineMark('loaded');
    return { state, backend, kind: 'full', why };
  }

  /**
   * The operation: the next state, its effects and what it changed (found by identity key for a
   * state built otherwise). Addresses it releases are removed by this transaction's link sync.
   */
  private async build(fn: (tx: Transaction) => Promise<TxResult> | TxResult, base: Base): Promise<OpResult> {
    const { state, backend } = base;
    const initialized = base.kind === 'partial' ? () => Promise.resolve(state.initialized) : () => backend.isInitialized();
    const r = await fn({ state, initialized });
    const change = { ...r, change: r.change ?? diffStates(state, r.state) };
    timelineMark('state built');
    for (const e of change.effects) if (e.kind === 'release') this.link.release({ addresses: e.address ? [e.address] : [], routes: e.route ? [e.route] : [] });
    return change;
  }

  /** Apply the change; a refused partial sync is retried once as a full one. A refused change is not persisted. */
  private async applyRetryingFull(
    next: DesiredState,
    change: StateChange,
    base: Base,
    durable: Commit,
    opts: TransactOptions,
    started: number,
  ): Promise<{ report: ApplyReport; kind: SyncMode }> {
    const apply = (mode: SyncMode) => this.reconcile(next, base.state, base.backend, { qos: opts.qos ?? true, mode, change });
    if (base.kind === 'partial') {
      try {
        return { kind: 'partial', report: await apply('partial') };
      } catch (e) {
        this.log.warn({ err: e }, 'partial sync refused; retrying once as a full sync');
        this.emit({ ok: false, kind: 'partial', ms: performance.now() - started, error: e });
        this.forgetViews();
      }
    }
    try {
      return { kind: 'full', report: await apply('full') };
    } catch (e) {
      await this.discard(durable);
      throw this.failed('full', started, e);
    }
  }

  /** Acknowledge nothing that is not durable: if the change cannot be persisted, the kernel goes back to the state that is. */
  private async persist(next: DesiredState, base: Base, durable: Commit, opts: TransactOptions): Promise<void> {
    timelineMark('reconciled');
    try {
      await durable.commit();
    } catch (e) {
      await this.discard(durable);
      this.log.error({ err: e }, 'could not persist the change: putting the kernel back as it was');
      this.forgetViews();
      await this.reconcile(base.state, next, base.backend, { qos: opts.qos ?? true, mode: 'full' }).catch((undo: unknown) =>
        this.log.error({ err: undo }, 'could not put the kernel back; the next full sync repairs it'),
      );
      throw e;
    }
    timelineMark('durable');
  }

  /** Nothing of a failed change may survive a restart. */
  private async discard(durable: Commit): Promise<void> {
    if (!(await durable.discard()))
      this.log.error({ file: this.store.journalFile }, 'could not remove the refused change from the journal: a restart would apply it; fix the state dir');
  }

  /** Trust what was applied, unless a distrust from outside replaced this change's mark while it ran. */
  private trustApplied(next: DesiredState, base: Base, running: Trust): void {
    if (this.trust === running) this.trust = { applied: { state: next, backend: base.backend, stamp: this.store.stamp() } };
    this.lastApplied = next;
    this.generation++;
  }

  /** A change failed: every part reads the kernel back next time, and the observers hear of it. Returns `err`. */
  private failed(kind: SyncMode, started: number, err: unknown): unknown {
    this.forgetViews();
    this.emit({ ok: false, kind, ms: performance.now() - started, error: err });
    return err;
  }

  /** Tell the observers (metrics, readiness) and the log how the apply went. */
  private notify({ kind, why }: Base, started: number, report: ApplyReport, next: DesiredState, flushes: FlushCount | undefined): void {
    const ms = performance.now() - started;
    this.emit({ ok: true, kind, ms, report, state: next, ...(flushes ? { flushes } : {}) });
    // Full syncs are rare and say why the kernel was read back; partial ones are every command.
    const line = { kind, ms: Math.round(ms), changes: changesOf(report), ...(why ? { why } : {}) };
    if (kind === 'full') this.log.info(line, 'full sync: read back and reconciled everything natgw owns');
    else this.log.debug(line, 'partial sync');
  }

  /** The parts in the order they are applied: NAT before the addresses it translates go up. */
  private parts(backend: NetfilterBackend): readonly Part[] {
    return [
      netfilterPart(backend, this.eipCounters),
      shareDnatPart(this.shareDnat),
      ctTimeoutsPart(this.ctTimeouts, backend),
      linkPart(this.link),
      uplinksPart(this.uplinks, backend),
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
  private async reconcile(
    want: DesiredState,
    previous: DesiredState,
    backend: NetfilterBackend,
    opts: { mode: SyncMode; qos: boolean; dryRun?: boolean; change?: StateChange },
  ): Promise<ApplyReport> {
    const { mode } = opts;
    // What changed, as the operation said; found by identity key where the caller did not say.
    const change = opts.change ?? diffStates(previous, want);
    const changes: Record<PartName, number> = { netfilter: 0, shareDnat: 0, ctTimeouts: 0, link: 0, uplinks: 0, qos: 0, neighbours: 0 };
    const notes: string[] = [];
    let script = '';
    const applied: Part[] = [];
    const parts = this.parts(backend).filter((part) => !(part.name === 'qos' && !opts.qos) && part.runs(want, previous, mode, change));
    for (const part of parts) {
      try {
        const r = await part.sync(want, previous, {
          mode,
          dryRun: opts.dryRun,
          change,
        });
        applied.push(part);
        timelineMark(`part ${part.name}`);
        changes[part.name] = r.changes;
        script += r.script;
        notes.push(...(r.notes ?? []));
      } catch (e) {
        // The failed part too: `ip -batch` and `tc -batch` stop half-way with the lines before
        // the error applied (an atomic part finds nothing to put back).
        if (!opts.dryRun) await this.rollBack([...applied, part], previous, want, mode);
        throw e;
      }
    }
    return {
      // The timeout policies are netfilter objects of natgw's too.
      netfilterChanges: changes.netfilter + changes.ctTimeouts,
      shareDnatChanges: changes.shareDnat,
      // Policy routing of secondary uplinks: routes and rules beside the addresses.
      linkChanges: changes.link + changes.uplinks,
      qosChanges: changes.qos,
      neighbourChanges: changes.neighbours,
      script,
      notes,
    };
  }

  private async rollBack(applied: readonly Part[], previous: DesiredState, from: DesiredState, mode: SyncMode): Promise<void> {
    // Rare: the way back is found by identity key.
    const undo = diffStates(from, previous);
    for (const part of [...applied].reverse()) {
      if (!part.runs(previous, from, mode, undo)) continue;
      try {
        await part.sync(previous, from, { mode, change: undo });
        this.log.info({ part: part.name }, 'put back as it was before the failed change');
      } catch (e) {
        // The part's view is gone with the failure; the full sync that follows repairs it.
        this.log.error({ err: e, part: part.name }, 'could not put back a part of a failed change; the next full sync repairs it');
      }
    }
  }

  /** ARP is sent without waiting (queued, a few at a time). */
  private announce(state: DesiredState, effects: readonly Effect[]): void {
    const ips = effects.flatMap((e) => (e.kind === 'garp' ? [e.ip] : []));
    if (ips.length === 0 || !this.role.mayAnnounce('new EIPs', ips)) return;
    // Each EIP on its own uplink (several external interfaces); the primary otherwise.
    const on = hasSecondaryUplinks(state.interfaces) ? new Map(state.eips.map((e) => [e.address, eipInterface(state.interfaces, e)])) : undefined;
    for (const ip of ips) this.link.announce(on?.get(ip) ?? state.interfaces.ext, ip);
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
    const drift = changesOf(report);
    // At start, changes are the persisted state put back (a fresh network namespace holds
    // nothing of it): a restore, not drift.
    if (drift > 0 && reason === 'start') this.log.info({ reason, ...report, script: undefined }, 'start: the persisted state restored into the kernel');
    else if (drift > 0) this.log.warn({ reason, ...report, script: undefined }, 'resync repaired drift');
    await this.conntrack.retryFailed();
    return report;
  }

  /** The persisted state, or what natgw owns in the kernel where no state file survived. */
  async loadState(): Promise<DesiredState> {
    const before = this.store.stamp();
    const t = 'applied' in this.trust ? this.trust.applied : undefined;
    if (t && t.stamp === before) return t.state;
    let saved = await this.store.load();
    // Outside the lock a commit may replace the files mid-read (a snapshot, then the journal of
    // a newer one): what was read may lack changes acknowledged before this call. Read again
    // under the lock, where no commit runs.
    if (this.store.stamp() !== before) saved = await this.store.withLock(() => this.store.load());
    return saved ?? this.adoptOrEmpty(await this.backends.choose());
  }

  /**
   * The state a resync is about to apply, for the daemon's wait for its interfaces. Where nothing
   * applied is trusted (the start, a link event) it is read under the lock, as a full sync reads
   * it, and handed to the next full sync (waitRead).
   */
  async stateForResync(): Promise<DesiredState> {
    if ('applied' in this.trust && this.trust.applied.stamp === this.store.stamp()) return this.trust.applied.state;
    const read = await this.store.withLock(async () => ({ state: await this.store.load(), stamp: this.store.stamp() }));
    this.waitRead = read;
    return read.state ?? this.adoptOrEmpty(await this.backends.choose());
  }

  async currentBackend(): Promise<BackendRecord | undefined> {
    return this.store.loadBackend();
  }
}
