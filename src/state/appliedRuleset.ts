/**
 * The applied-ruleset cache (`applied-ruleset` in the state dir): the netfilter scripts that
 * rebuild natgw's own tables from nothing for the last PUBLISHED snapshot, as distributions
 * restore a saved firewall at boot. The daemon's loader replays it while Node.js still loads
 * the daemon's code (src/daemon/replayBoot.ts); the engine's first full sync then trusts it as
 * a full sync trusts its own apply, when everything the header records still holds.
 *
 * Pure: format, decode and the two verdicts. Hand-validated, not through zod: the loader runs
 * this before the daemon's bundle (and zod) is loaded, and every millisecond there delays the
 * replay. A cache is only ever a shortcut: whatever does not verify is ignored, and the full
 * sync of old is what runs.
 */
import { createHash } from 'node:crypto';

export const APPLIED_RULESET_FILE = 'applied-ruleset';
const MAGIC = '# natgw applied-ruleset ';
const FORMAT = 1;

export type RulesetBackend = { readonly kind: 'nftables' } | { readonly kind: 'iptables'; readonly variant: 'legacy' | 'nft' };

/** One tool run of the replay: `nft -f -`, or one `ip[6]tables-<variant>-restore --noflush` per family (nat and mangle, and raw for IPv4). */
/**
 * `accounting`: the per-EIP accounting table (`inet natgw_acct`) from scratch by `nft -f -`,
 * which refuses it where that table exists (a rebuild would restart a warm one's counters).
 */
export type StepTool =
  | { readonly tool: 'nft'; readonly phase?: NftPhase }
  | { readonly tool: 'iptables'; readonly family: 4 | 6 }
  | { readonly tool: 'accounting' };

/**
 * A large nft replay is cut in phases (nft/phases.ts) that load the element lists on several
 * cores, unhooked: `prelude` (natgw's tables deleted: only for the whole replacing transaction
 * that runs where the tables exist), `first` (`create table`, sets, regular chains), `group`
 * (element lists, all at once), `last` (base chains and their rules). The steps come in that order.
 */
export type NftPhase = 'prelude' | 'first' | 'group' | 'last';
const PHASE_ORDER: readonly NftPhase[] = ['prelude', 'first', 'group', 'last'];
export type ReplayStep = StepTool & { readonly bytes: number };

/**
 * iptables only: the scripts add natgw's jumps to the built-in chains, which a second copy
 * would duplicate, so they are replayed only where none of these chains exists yet (a fresh
 * network namespace). nft scripts replace natgw's tables wholesale and need no such check.
 */
export interface ColdCheck {
  readonly family: 4 | 6;
  readonly table: 'nat' | 'mangle' | 'raw';
  readonly chains: readonly string[];
}

export interface RulesetHeader {
  readonly format: number;
  /** natgw's package version and the identity of the code that rendered the scripts. */
  readonly natgw: string;
  readonly code: string;
  readonly backend: RulesetBackend;
  /** sha256 of the published snapshot's state text (the seal of state.json). */
  readonly snapshot: string;
  /** The journal was empty: the snapshot alone was the desired state. */
  readonly journalEmpty: true;
  /** The configuration that decides the backend and the render. */
  readonly config: { readonly mode: string; readonly iptablesVariant: string; readonly vpcInterface: string; readonly extInterface: string };
  readonly steps: readonly ReplayStep[];
  readonly cold: readonly ColdCheck[];
  readonly body: { readonly bytes: number; readonly sha256: string };
}

export type RulesetMeta = Omit<RulesetHeader, 'format' | 'journalEmpty' | 'steps' | 'body'>;

const sha256 = (b: Buffer | string): string => createHash('sha256').update(b).digest('hex');

/** The file: a comment line with the header (JSON), then every step's script, in order. */
export function encodeAppliedRuleset(meta: RulesetMeta, scripts: ReadonlyArray<{ step: StepTool; text: string }>): Buffer {
  const bodies = scripts.map((s) => Buffer.from(s.text, 'utf8'));
  const body = Buffer.concat(bodies);
  const header: RulesetHeader = {
    format: FORMAT,
    ...meta,
    journalEmpty: true,
    steps: scripts.map((s, i) => ({ ...s.step, bytes: (bodies[i] as Buffer).length }) as ReplayStep),
    body: { bytes: body.length, sha256: sha256(body) },
  };
  return Buffer.concat([Buffer.from(`${MAGIC}${JSON.stringify(header)}\n`, 'utf8'), body]);
}

export type Decoded = { readonly ok: true; readonly header: RulesetHeader; readonly scripts: readonly Buffer[] } | { readonly ok: false; readonly why: string };

/** Only the header (what the engine compares), without hashing the body. */
export function decodeHeader(file: Buffer): { header: RulesetHeader; bodyAt: number } | string {
  const nl = file.indexOf(10);
  if (nl < 0) return 'no header line';
  const line = file.subarray(0, nl).toString('utf8');
  if (!line.startsWith(MAGIC)) return 'not an applied-ruleset file';
  let raw: unknown;
  try {
    raw = JSON.parse(line.slice(MAGIC.length));
  } catch {
    return 'header is not JSON';
  }
  const header = checkHeader(raw);
  return typeof header === 'string' ? `header: ${header}` : { header, bodyAt: nl + 1 };
}

/** Decode and verify: a torn or altered file (length or hash) is refused, saying why. */
export function decodeAppliedRuleset(file: Buffer): Decoded {
  const h = decodeHeader(file);
  if (typeof h === 'string') return { ok: false, why: h };
  const { header, bodyAt } = h;
  const body = file.subarray(bodyAt);
  if (body.length !== header.body.bytes) return { ok: false, why: `body is ${body.length} bytes, the header says ${header.body.bytes} (torn)` };
  if (sha256(body) !== header.body.sha256) return { ok: false, why: 'body does not match its sha256 (corrupt)' };
  const scripts: Buffer[] = [];
  let at = 0;
  for (const s of header.steps) {
    scripts.push(body.subarray(at, at + s.bytes));
    at += s.bytes;
  }
  if (at !== body.length) return { ok: false, why: 'steps do not add up to the body' };
  return { ok: true, header, scripts };
}

const HEX64 = /^[0-9a-f]{64}$/;
/** Chain names as natgw's layout has them; anything else in a header is not natgw's. */
const CHAIN = /^[A-Z][A-Z0-9_]{0,28}$/;
const isObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
const isStr = (v: unknown): v is string => typeof v === 'string';
const isCount = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;

/** One prelude, one first, at least one group, one last, in that order, and no nft step without a phase. */
function phasesInOrder(phases: readonly NftPhase[], nftSteps: number): boolean {
  const rank = phases.map((p) => PHASE_ORDER.indexOf(p));
  const count = (p: NftPhase) => phases.filter((x) => x === p).length;
  return (
    phases.length === nftSteps &&
    rank.every((r, i) => i === 0 || r >= (rank[i - 1] as number)) &&
    count('prelude') === 1 &&
    count('first') === 1 &&
    count('group') >= 1 &&
    count('last') === 1
  );
}

function checkHeader(h: unknown): RulesetHeader | string {
  if (!isObj(h)) return 'not an object';
  if (h.format !== FORMAT) return `format ${String(h.format)}, not ${FORMAT}`;
  if (!isStr(h.natgw) || !isStr(h.code)) return 'no natgw version or code identity';
  const b = h.backend;
  if (!isObj(b) || !(b.kind === 'nftables' || (b.kind === 'iptables' && (b.variant === 'legacy' || b.variant === 'nft')))) return 'bad backend';
  if (!isStr(h.snapshot) || !HEX64.test(h.snapshot)) return 'bad snapshot digest';
  if (h.journalEmpty !== true) return 'journal not empty';
  const c = h.config;
  if (!isObj(c) || !isStr(c.mode) || !isStr(c.iptablesVariant) || !isStr(c.vpcInterface) || !isStr(c.extInterface)) return 'bad config';
  if (!Array.isArray(h.steps) || h.steps.length === 0) return 'no steps';
  const phases: NftPhase[] = [];
  for (const s of h.steps as unknown[]) {
    if (!isObj(s) || !isCount(s.bytes)) return 'bad step';
    if (s.tool === 'accounting') continue;
    if (b.kind === 'nftables' ? s.tool !== 'nft' : s.tool !== 'iptables' || (s.family !== 4 && s.family !== 6)) return 'step does not fit the backend';
    if (s.phase !== undefined) {
      if (!PHASE_ORDER.includes(s.phase as NftPhase)) return 'bad phase';
      phases.push(s.phase as NftPhase);
    }
  }
  if (phases.length > 0 && !phasesInOrder(phases, h.steps.filter((s) => (s as Record<string, unknown>).tool === 'nft').length)) return 'bad phases';
  if (!Array.isArray(h.cold)) return 'bad cold checks';
  for (const k of h.cold as unknown[]) {
    if (!isObj(k) || (k.family !== 4 && k.family !== 6) || (k.table !== 'nat' && k.table !== 'mangle' && k.table !== 'raw')) return 'bad cold check';
    if (!Array.isArray(k.chains) || !(k.chains as unknown[]).every((n) => isStr(n) && CHAIN.test(n))) return 'bad chain name';
  }
  const body = h.body;
  if (!isObj(body) || !isCount(body.bytes) || !isStr(body.sha256) || !HEX64.test(body.sha256)) return 'bad body digest';
  return h as unknown as RulesetHeader;
}

/** The seal of a state.json (its first bytes): `{"sha256":"<64 hex>","state":`. */
export function snapshotSeal(head: string): string | undefined {
  const m = /^\{"sha256":"([0-9a-f]{64})","state":/.exec(head);
  return m?.[1];
}

export interface BootFacts {
  /** The seal of state.json now (undefined: no file, or not sealed). */
  readonly snapshot: string | undefined;
  /** state.journal exists (a change after the snapshot, or one being written). */
  readonly journal: boolean;
  /** natgw's lock is held (another process is changing the state or the kernel right now). */
  readonly locked: boolean;
  readonly natgwVersion: string;
  /** GATEWAY_NETFILTER_MODE and NATGW_IPTABLES_VARIANT as configured now. */
  readonly mode: string;
  readonly iptablesVariant: string;
  /** backend.json as parsed (undefined: none or unreadable). */
  readonly backendRecord: unknown;
}

export type Verdict = { readonly replay: true } | { readonly replay: false; readonly why: string };

/**
 * Whether the loader may replay the cache now: only for the very snapshot it was written for,
 * with nothing after it, nobody changing the state, and a configuration that would choose the
 * same backend. Anything else is not replayed (the full sync runs as it always did).
 */
export function replayVerdict(h: RulesetHeader, f: BootFacts): Verdict {
  const no = (why: string): Verdict => ({ replay: false, why });
  if (f.snapshot === undefined) return no('state.json is missing or not sealed');
  if (f.snapshot !== h.snapshot) return no('written for another snapshot');
  if (f.journal) return no('the journal holds changes after the snapshot');
  if (f.locked) return no("natgw's lock is held by another process");
  if (f.natgwVersion !== h.natgw) return no(`written by natgw ${h.natgw}, this is ${f.natgwVersion}`);
  if (f.mode !== 'auto' && f.mode !== h.backend.kind) return no(`GATEWAY_NETFILTER_MODE=${f.mode}, the cache is for ${h.backend.kind}`);
  if (h.backend.kind === 'iptables' && f.iptablesVariant !== 'auto' && f.iptablesVariant !== h.backend.variant)
    return no(`NATGW_IPTABLES_VARIANT=${f.iptablesVariant}, the cache is for ${h.backend.variant}`);
  const rec = f.backendRecord;
  if (!isObj(rec)) return no('no backend record');
  if (rec.pendingCleanup !== undefined) return no('a backend switch is unfinished');
  if (rec.kind !== h.backend.kind || (h.backend.kind === 'iptables' && rec.variant !== h.backend.variant))
    return no('the backend record names another backend');
  return { replay: true };
}

export interface TrustFacts {
  /** The seal of the snapshot the engine loaded, and the journal entries replayed onto it. */
  readonly snapshot: string | undefined;
  readonly journalEntries: number;
  readonly journalTorn: boolean;
  readonly backend: RulesetBackend;
  readonly natgwVersion: string;
  readonly code: string;
}

/**
 * Whether the first full sync may count a successful replay as its own netfilter apply: the
 * state it loaded is the cache's snapshot, alone, and this very code chose the same backend.
 */
export function trustVerdict(h: RulesetHeader, f: TrustFacts): Verdict {
  const no = (why: string): Verdict => ({ replay: false, why });
  if (f.snapshot !== h.snapshot) return no('the state loaded is not the snapshot the cache was written for');
  if (f.journalEntries > 0 || f.journalTorn) return no('the state loaded has journal entries');
  if (f.backend.kind !== h.backend.kind || (f.backend.kind === 'iptables' && h.backend.kind === 'iptables' && f.backend.variant !== h.backend.variant))
    return no('another backend was selected');
  if (f.natgwVersion !== h.natgw || f.code !== h.code) return no('written by other code (an upgrade): its layout may differ');
  return { replay: true };
}

/** What makes two caches the same (a write is skipped when nothing in it changed). */
export function rulesetKey(m: RulesetMeta): string {
  return JSON.stringify([m.snapshot, m.backend, m.natgw, m.code, m.config]);
}

/** What the loader's replay (src/daemon/replayBoot.ts) did, for the engine's first full sync. */
export interface ReplayOutcome {
  /** The tools were run. */
  readonly replayed: boolean;
  /** They all exited 0. */
  readonly ok: boolean;
  /** Why not replayed, or what failed. */
  readonly why: string;
  /** The cache's header, when one verified (also when it was not replayed). */
  readonly header?: RulesetHeader;
  readonly ms?: number;
  /** When the tools were started, in ms since the process started. */
  readonly spawnedAt?: number;
  /** The accounting table was built from scratch too (it did not exist). */
  readonly accounting?: boolean;
  /** A phased nft cache: its phases applied (natgw's tables were absent), or the whole replacing transaction. */
  readonly nftPath?: 'phases' | 'whole';
  /** natgw's lock was held by a process that no longer exists (killed mid-command): its pid; the loader took it over. */
  readonly lockTakenFrom?: number;
}
