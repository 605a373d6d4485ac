/**
 * An in-memory stand-in for the Engine, for driving the HTTP API without a kernel: the real
 * pure operations and the real legacy command runner run against it; "applying" just keeps
 * the state. It can refuse applies (as a kernel would) and slow them down (to make requests
 * queue up and merge).
 */
import pino from 'pino';
import { loadConfig, type Config } from '../../src/config/config.js';
import type { ApplyReport, SyncEvent, SyncListener, Transaction } from '../../src/engine/engine.js';
import { NotInitializedError, SystemError } from '../../src/model/errors.js';
import type { Effect, TxResult } from '../../src/state/operations.js';
import { emptyState, type DesiredState } from '../../src/state/state.js';
import type { BackendRecord } from '../../src/state/store.js';
import type { EngineLike } from '../../src/api/agent.js';
import { Agent } from '../../src/api/agent.js';

export class FakeEngine implements EngineLike {
  readonly log = pino({ level: 'silent' });
  /** One external interface: no uplink networks to look up. */
  readonly link = { uplinkNetworks: async () => [] };
  lastApplied: DesiredState | undefined;
  generation = 0;
  private readonly listeners = new Set<SyncListener>();
  state: DesiredState;
  /** The init guard's evidence. */
  initialized = true;
  /** Milliseconds each apply takes. */
  applyDelayMs = 0;
  /** While set, every apply waits for it: a test holds a transaction open until it has queued what it needs. */
  gate: Promise<void> | undefined;
  /** Return an error to make the "kernel" refuse this state. */
  refuse: (s: DesiredState) => Error | undefined = () => undefined;
  transactions = 0;
  readonly effects: Effect[] = [];
  private busy = false;

  onSync(listener: SyncListener): () => void {
    const entry: SyncListener = (e) => listener(e);
    this.listeners.add(entry);
    return () => this.listeners.delete(entry);
  }

  private emit(e: SyncEvent): void {
    for (const l of [...this.listeners]) l(e);
  }

  constructor(readonly config: Config) {
    this.state = { ...emptyState('eth0', 'net1'), initialized: true };
  }

  static async create(env: Record<string, string> = {}): Promise<FakeEngine> {
    return new FakeEngine(await loadConfig({ NATGW_ENV_FILE: '/nonexistent/natgw-test.env', ...env }));
  }

  async transact(
    fn: (tx: Transaction) => Promise<TxResult> | TxResult,
    opts: { guarded?: boolean; dryRun?: boolean; qos?: boolean } = {},
  ): Promise<{ state: DesiredState; report: ApplyReport; effects: readonly Effect[] }> {
    // The engine's file lock: one transaction at a time, whoever calls.
    if (this.busy) throw new Error('FakeEngine: overlapping transactions (the queue should prevent this)');
    this.busy = true;
    try {
      if (opts.guarded && !this.initialized) throw new NotInitializedError();
      const { state: next, effects } = await fn({
        state: this.state,
        initialized: async () => this.initialized,
      });
      this.transactions++;
      const started = performance.now();
      if (this.applyDelayMs) await new Promise((r) => setTimeout(r, this.applyDelayMs));
      if (this.gate) await this.gate;
      const changed = JSON.stringify(next) !== JSON.stringify(this.state);
      const report: ApplyReport = {
        netfilterChanges: changed ? 1 : 0,
        shareDnatChanges: 0,
        linkChanges: 0,
        qosChanges: 0,
        neighbourChanges: 0,
        script: changed ? `# would apply\n${JSON.stringify(next.dnats)}\n` : '',
        notes: [],
      };
      const refused = this.refuse(next);
      if (refused) {
        if (!opts.dryRun) this.emit({ ok: false, kind: 'partial', ms: performance.now() - started, error: refused });
        throw refused instanceof SystemError ? refused : new SystemError(refused.message);
      }
      if (!opts.dryRun) {
        this.state = next;
        this.lastApplied = next;
        this.generation++;
        this.effects.push(...effects);
        this.emit({ ok: true, kind: 'partial', ms: performance.now() - started, report, state: next });
      }
      return { state: next, report, effects };
    } finally {
      this.busy = false;
    }
  }

  async resync(_reason: string): Promise<ApplyReport> {
    return (await this.transact(({ state }) => ({ state, effects: [] }))).report;
  }

  async loadState(): Promise<DesiredState> {
    return this.state;
  }

  async currentBackend(): Promise<BackendRecord | undefined> {
    return { kind: 'iptables', variant: 'legacy' };
  }
}

/** An Agent over a FakeEngine, running script commands with the real runLegacy. */
export function fakeAgent(engine: FakeEngine): Agent {
  return new Agent({ engine, log: engine.log });
}
