import type { ApplyReport, Engine, Transact, Transaction } from './engine.js';
import type { DesiredState } from '../state/state.js';
import type { Effect, TxResult } from '../state/operations.js';
import { compose, type StateChange } from '../state/change.js';
import { NotInitializedError } from '../model/errors.js';
import { timelineMark } from '../system/timeline.js';

/**
 * The daemon's one queue. Every change (a legacy command, an API change, a resync) runs as
 * one job, one at a time, in arrival order; the engine's file lock serialises the daemon
 * with in-process shim runs on top of that. The daemon takes that lock only inside a job's
 * transaction, never between jobs.
 */
export class SerialQueue {
  private tail: Promise<unknown> = Promise.resolve();
  private waiting = 0;
  private running = false;
  private closed = false;

  /** Jobs queued or running. */
  get size(): number {
    return this.waiting + (this.running ? 1 : 0);
  }

  /** Run `job` after every job queued before it. Its result (or error) is the job's own. */
  run<T>(job: () => Promise<T>): Promise<T> {
    if (this.closed) return Promise.reject(new QueueClosedError());
    this.waiting++;
    const result = this.tail.then(async () => {
      this.waiting--;
      this.running = true;
      try {
        return await job();
      } finally {
        this.running = false;
      }
    });
    this.tail = result.catch(() => undefined);
    return result;
  }

  /** Refuse new jobs; resolves when every job already accepted has finished. */
  async close(): Promise<void> {
    this.closed = true;
    await this.tail;
  }
}

export class QueueClosedError extends Error {
  override readonly name = 'QueueClosedError';
  constructor() {
    super('natgw is shutting down');
  }
}

/** One change to the desired state, as a pure operation (see state/operations.ts). */
export interface ChangeRequest {
  /** Refused with NotInitializedError until init has run (SPEC §2 guard). */
  readonly guarded: boolean;
  /** The change touches tc (QoS): the apply syncs QoS too. Only requests alike in this share a batch. */
  readonly qos: boolean;
  /** The operation, on the state the requests before it in the batch produced. */
  readonly op: (s: DesiredState, tx: Transaction) => TxResult | Promise<TxResult>;
}

export interface ChangeResult {
  /** The desired state just after this request's own operation. */
  readonly after: DesiredState;
  /** What this request's own operation changed (undefined: a state built by hand). */
  readonly change: StateChange | undefined;
  readonly report: ApplyReport;
  /** How many requests shared this request's transaction. */
  readonly batchSize: number;
}

interface Pending {
  readonly req: ChangeRequest;
  readonly resolve: (r: ChangeResult) => void;
  readonly reject: (e: unknown) => void;
}

type Outcome = { ok: true; after: DesiredState; change: StateChange | undefined } | { ok: false; error: unknown };

/** The most requests one transaction carries. */
const MAX_BATCH = 64;

/** Thrown inside a transaction whose every operation was refused: abort it, apply nothing. */
class NothingToApply extends Error {}

/**
 * Merges state changes that arrive while another job runs into the next transaction. Each
 * request keeps its own outcome: its operation runs on the state the earlier requests of the
 * batch produced; a refused operation (conflict, validation, guard) is skipped without
 * affecting the others. If the batch's apply itself fails, every request of it is retried
 * alone, so one request's bad value cannot fail another.
 */
export class ChangeBatcher {
  private pending: Pending[] = [];
  private scheduled = false;
  /** Requests that shared a transaction with another. */
  merged = 0;

  constructor(
    private readonly queue: SerialQueue,
    private readonly engine: Pick<Engine, 'transact'>,
  ) {}

  /** Requests accepted and not yet taken into a batch (lets a test see that they are all queued). */
  get waiting(): number {
    return this.pending.length;
  }

  /**
   * The engine's `transact`, merged: the transaction function becomes one request of the next
   * merged transaction, with its own outcome (what a mergeable script command runs with). A
   * dry run is a queued transaction of its own. The sync's mode is the batch's (partial when
   * it can): no mergeable command asks for a full one.
   */
  readonly transact: Transact = async (fn, opts = {}) => {
    if (opts.dryRun) return this.queue.run(() => this.engine.transact(fn, opts));
    const r = await this.submit({ guarded: opts.guarded ?? false, qos: opts.qos ?? true, op: (_s, tx) => fn(tx) });
    return { state: r.after, report: r.report, effects: [] };
  };

  submit(req: ChangeRequest): Promise<ChangeResult> {
    return new Promise<ChangeResult>((resolve, reject) => {
      this.pending.push({ req, resolve, reject });
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.scheduled || this.pending.length === 0) return;
    this.scheduled = true;
    this.queue
      .run(async () => {
        this.scheduled = false;
        // A batch: the longest run of waiting requests alike in `qos` (order is kept), so a
        // QoS apply's notes are never reported to a request that did not touch QoS.
        const qos = this.pending[0]?.req.qos;
        let n = 0;
        while (n < this.pending.length && n < MAX_BATCH && this.pending[n]!.req.qos === qos) n++;
        const batch = this.pending.splice(0, n);
        // Anything left (or arriving meanwhile) goes into the next job, behind whatever is queued.
        this.schedule();
        await this.drain(batch);
      })
      .catch((e: unknown) => {
        // The queue refused the job (shutting down): fail everything still waiting.
        this.scheduled = false;
        for (const p of this.pending.splice(0)) p.reject(e);
      });
  }

  private async drain(batch: Pending[]): Promise<void> {
    if (batch.length === 0) return;
    if (batch.length > 1) this.merged += batch.length;
    try {
      await this.apply(batch);
    } catch (e) {
      if (batch.length === 1) {
        batch[0]!.reject(e);
        return;
      }
      // The merged apply failed as a whole: give each request its own transaction.
      for (const p of batch) {
        await this.apply([p]).catch((err: unknown) => p.reject(err));
      }
    }
  }

  /** One transaction for `batch`; settles each request, or throws if the apply failed. */
  private async apply(batch: Pending[]): Promise<void> {
    let outcomes: Outcome[] = [];
    timelineMark('dequeued');
    try {
      const { report } = await this.engine.transact(
        async (tx) => {
          const { state } = tx;
          outcomes = [];
          const initialized = batch.some((p) => p.req.guarded) ? await tx.initialized() : true;
          let acc = state;
          let change: StateChange | undefined = { scalars: {}, lists: {} };
          const effects: Effect[] = [];
          const seen = new Set<string>();
          for (const { req } of batch) {
            if (req.guarded && !initialized) {
              outcomes.push({ ok: false, error: new NotInitializedError() });
              continue;
            }
            try {
              const r = await req.op(acc, { ...tx, state: acc });
              outcomes.push({ ok: true, after: r.state, change: r.change });
              acc = r.state;
              change = change && r.change ? compose(change, r.change) : undefined;
              // The same flush or announcement twice in one batch is done once.
              for (const e of r.effects) {
                const key = JSON.stringify(e);
                if (!seen.has(key)) {
                  seen.add(key);
                  effects.push(e);
                }
              }
            } catch (error) {
              outcomes.push({ ok: false, error });
            }
          }
          if (!outcomes.some((o) => o.ok)) throw new NothingToApply();
          return { state: acc, effects, change };
        },
        { qos: batch.some((p) => p.req.qos) },
      );
      batch.forEach((p, i) => {
        const o = outcomes[i]!;
        if (o.ok) p.resolve({ after: o.after, change: o.change, report, batchSize: batch.length });
        else p.reject(o.error);
      });
    } catch (e) {
      if (!(e instanceof NothingToApply)) throw e;
      batch.forEach((p, i) => {
        const o = outcomes[i];
        p.reject(o && !o.ok ? o.error : e);
      });
    }
  }
}
