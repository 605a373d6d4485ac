import { renameSync, statSync } from 'node:fs';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Logger } from 'pino';
import type { Config } from '../config/config.js';
import type { DesiredState } from '../state/state.js';
import type { StateStore } from '../state/store.js';
import type { NetfilterBackend } from '../dataplane/netfilter/backend.js';
import { natTablesOf } from '../dataplane/netfilter/backend.js';
import { replayScripts } from '../dataplane/netfilter/replayRender.js';
import {
  APPLIED_RULESET_FILE,
  encodeAppliedRuleset,
  type ReplayOutcome,
  type RulesetBackend,
  type RulesetHeader,
  type RulesetMeta,
  rulesetKey,
  trustVerdict,
} from '../state/appliedRuleset.js';
import { natgwVersion } from '../system/version.js';
import type { BackendChoice } from './backendSelect.js';

const WRITE_DELAY_MS = 500;

/** What the replay put in place, for the netfilter part (PartSync.assumeApplied). */
export interface Assumed {
  /** The accounting table too (it did not exist before the replay). */
  readonly accounting: boolean;
}

/** How the first full sync treated the loader's replay (the `path` label of natgw_start_replays_total). */
export type ReplayPath = 'trusted' | 'fallback' | 'skipped' | 'none';

/**
 * The engine's side of the applied-ruleset cache (src/state/appliedRuleset.ts): decides once,
 * at the first full sync, whether the loader's replay counts as that sync's netfilter apply,
 * and rewrites the cache whenever a published snapshot with an empty journal was applied and
 * differs from what the cache holds. The write runs in the background (a render of the whole
 * ruleset); `flush` waits for it (shutdown).
 */
export class AppliedRulesetCache {
  private decided = false;
  /** How long the first full sync waited for the replay to finish (the log line says): 0 when the daemon's own start was the longer. */
  private waitedMs = 0;
  private lastKey: string | undefined;
  private writing: Promise<void> = Promise.resolve();
  private readonly version: string;
  /** The identity of the code that renders (the bundle, or this module): a new build renders anew. */
  private readonly code: string;
  readonly file: string;

  constructor(
    private readonly o: {
      readonly config: Config;
      readonly store: StateStore;
      readonly log: Logger;
      readonly boot: Promise<ReplayOutcome> | undefined;
      readonly onDecision?: (path: ReplayPath) => void;
    },
  ) {
    this.version = natgwVersion(import.meta.url);
    this.code = codeIdentity(import.meta.url);
    this.file = path.join(o.config.stateDir, APPLIED_RULESET_FILE);
  }

  /** Resolves once the loader's replay (if any) has finished; never rejects. */
  async settled(): Promise<void> {
    if (!this.o.boot) return;
    const t = performance.now();
    await this.o.boot.catch(() => undefined);
    // The engine waits here, before its lock, not in decide: counted until the decision is logged.
    if (!this.decided) this.waitedMs += Math.round(performance.now() - t);
  }

  /**
   * At the first full sync only (the first transaction that writes): the replay ran, succeeded, and was written for the state this
   * sync loaded, by this code, for the backend it selected. Awaits a replay still running.
   */
  async decide(choice: BackendChoice, backend: NetfilterBackend): Promise<Assumed | undefined> {
    if (this.decided) return undefined;
    this.decided = true;
    const boot = this.o.boot;
    if (!boot) return this.report('none', 'no replay at start (not started through the loader)');
    const t = performance.now();
    const out = await boot;
    this.waitedMs += Math.round(performance.now() - t);
    if (out.header) this.lastKey = rulesetKey(metaOf(out.header));
    if (out.lockTakenFrom !== undefined)
      this.o.log.warn({ pid: out.lockTakenFrom }, "start: natgw's lock was held by a process that no longer exists: taken over");
    if (!out.replayed) return this.report('skipped', out.why);
    if (!out.ok || !out.header) return this.report('fallback', out.why);
    const rb = rulesetBackend(choice);
    if (!rb || !backend.assumeApplied) return this.report('fallback', 'the backend selected cannot take a replay');
    const verdict = trustVerdict(out.header, { ...this.o.store.loadedSnapshot(), backend: rb, natgwVersion: this.version, code: this.code });
    if (!verdict.replay) return this.report('fallback', verdict.why);
    this.report(
      'trusted',
      `replayed in ${Math.round(out.ms ?? 0)} ms, started ${out.spawnedAt ?? '?'} ms after the process${out.nftPath ? `, nft ${out.nftPath === 'phases' ? 'in phases' : 'as one replacing transaction'}` : ''}${out.accounting ? ', accounting table included' : ''}`,
    );
    return { accounting: out.accounting === true };
  }

  private report(p: ReplayPath, why: string): undefined {
    const trusted = p === 'trusted';
    this.o.log.info(
      { replay: p, why, waitedMs: this.waitedMs },
      trusted
        ? 'start: the applied-ruleset replay counts as the netfilter apply (nothing read back)'
        : 'start: netfilter by a full sync (read back and repair)',
    );
    this.o.onDecision?.(p);
    return undefined;
  }

  /** After an apply: rewrite the cache when `applied` is the published snapshot alone and the cache holds anything else. */
  afterApply(applied: DesiredState, choice: BackendChoice): void {
    const snap = this.o.store.loadedSnapshot();
    const backend = rulesetBackend(choice);
    if (!applied.initialized || !backend || snap.snapshot === undefined || snap.journalEntries > 0 || snap.journalTorn) return;
    const c = this.o.config;
    const meta: Omit<RulesetMeta, 'cold'> = {
      natgw: this.version,
      code: this.code,
      backend,
      snapshot: snap.snapshot,
      config: { mode: c.mode, iptablesVariant: c.iptablesVariant, vpcInterface: c.vpcInterface, extInterface: c.extInterface },
    };
    const key = rulesetKey({ ...meta, cold: [] });
    if (key === this.lastKey) return;
    this.lastKey = key;
    // Later, off the answer's and the start's way (the render blocks the event loop ~0.1 s at
    // 10,000 objects); a burst of changes writes only the last.
    this.pending = { applied, meta };
    if (!this.timer) {
      this.timer = setTimeout(() => this.kick(), WRITE_DELAY_MS);
      this.timer.unref();
    }
  }

  private pending: { applied: DesiredState; meta: Omit<RulesetMeta, 'cold'> } | undefined;
  private timer: NodeJS.Timeout | undefined;

  private kick(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    const p = this.pending;
    this.pending = undefined;
    if (!p) return;
    this.writing = this.writing
      .then(() => this.write(p.applied, p.meta))
      .catch((e: unknown) => {
        this.lastKey = undefined;
        this.o.log.warn({ err: e, file: this.file }, 'applied-ruleset cache not written; the next start runs a full sync');
      });
  }

  private async write(applied: DesiredState, meta: Omit<RulesetMeta, 'cold'>): Promise<void> {
    const { scripts, cold } = replayScripts(natTablesOf(applied), meta.backend);
    const data = encodeAppliedRuleset({ ...meta, cold }, scripts);
    // A cache: atomic (a reader sees the old file or the new one), not fsynced; a torn one fails its hash.
    const tmp = `${this.file}.tmp-${process.pid}`;
    await fs.writeFile(tmp, data, { mode: 0o600 });
    renameSync(tmp, this.file);
    this.o.log.debug({ bytes: data.length }, 'applied-ruleset cache written');
  }

  /** Write what is pending now and wait for it (the daemon's shutdown). */
  flush(): Promise<void> {
    this.kick();
    return this.writing;
  }
}

function rulesetBackend(c: BackendChoice): RulesetBackend | undefined {
  if (c.kind === 'nftables') return { kind: 'nftables' };
  return c.variant ? { kind: 'iptables', variant: c.variant } : undefined;
}

const metaOf = (h: RulesetHeader): RulesetMeta => ({ natgw: h.natgw, code: h.code, backend: h.backend, snapshot: h.snapshot, config: h.config, cold: [] });

function codeIdentity(url: string): string {
  try {
    const st = statSync(fileURLToPath(url));
    return `${st.size}:${Math.round(st.mtimeMs)}`;
  } catch {
    return 'unknown';
  }
}
