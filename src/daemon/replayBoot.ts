/**
 * The daemon's first act (bin/natgw.js runs this before it loads the daemon's bundle): replay
 * the applied-ruleset cache into the kernel, so that the apply runs while Node.js compiles and
 * loads the daemon's code. Everything up to the spawn is synchronous and small: the bundle's
 * load blocks the event loop, and the tools must already be running by then. Each tool reads
 * its script from a file descriptor (an unlinked temp file), not a pipe that would need the
 * blocked event loop to be fed.
 *
 * The outcome is left on globalThis for the engine's first full sync (AppliedRulesetCache),
 * which decides whether to trust it. Nothing here may stop the daemon from starting: any error
 * is an outcome "not replayed".
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { closeSync, lstatSync, openSync, readFileSync, readSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseEnvFile } from '../config/envFile.js';
import { DEFAULT_ENV_FILE, DEFAULT_STATE_DIR } from '../config/socketPath.js';
import { parseSave } from '../dataplane/netfilter/iptables/save.js';
import { type IptablesVariant, toolsFor } from '../dataplane/netfilter/iptables/tools.js';
import { phaseRun } from '../dataplane/netfilter/nft/phaseScript.js';
import { unlinkedFileWith } from '../system/unlinkedInput.js';
import {
  APPLIED_RULESET_FILE,
  type ColdCheck,
  type NftPhase,
  decodeAppliedRuleset,
  type ReplayOutcome,
  type RulesetHeader,
  replayVerdict,
  snapshotSeal,
} from '../state/appliedRuleset.js';
import { natgwVersion } from '../system/version.js';
import { clearDeadLock, LOCK_NAME, tryLock, unlockSync } from '../state/lock.js';

const KEY = Symbol.for('natgw.appliedRulesetReplay');

/** The replay started by this process's loader, if any (the engine awaits it once). */
export function takeBootReplay(): Promise<ReplayOutcome> | undefined {
  const g = globalThis as unknown as Record<symbol, Promise<ReplayOutcome> | undefined>;
  const p = g[KEY];
  g[KEY] = undefined;
  return p;
}

/** Start the replay (if the cache is valid now) and leave its outcome for the engine. */
export function startBootReplay(env: NodeJS.ProcessEnv = process.env): void {
  const t0 = performance.now();
  let outcome: Promise<ReplayOutcome>;
  try {
    outcome = begin(env, t0);
  } catch (e) {
    outcome = Promise.resolve({ replayed: false, ok: false, why: `not replayed: ${(e as Error).message}` });
  }
  (globalThis as unknown as Record<symbol, Promise<ReplayOutcome>>)[KEY] = outcome;
}

function begin(env: NodeJS.ProcessEnv, t0: number): Promise<ReplayOutcome> {
  const none = (why: string, header?: RulesetHeader) => Promise.resolve<ReplayOutcome>({ replayed: false, ok: false, why, header });
  // The same precedence as loadConfig: the env file's values over the environment's.
  const envFile = env.NATGW_ENV_FILE?.trim() || DEFAULT_ENV_FILE;
  let fromFile: Record<string, string> = {};
  try {
    fromFile = parseEnvFile(readFileSync(envFile, 'utf8'));
  } catch {}
  const get = (k: string, d: string) => (fromFile[k] ?? env[k] ?? d).trim() || d;
  const dir = get('NATGW_STATE_DIR', DEFAULT_STATE_DIR);
  let file: Buffer;
  try {
    file = readFileSync(path.join(dir, APPLIED_RULESET_FILE));
  } catch {
    return none('no applied-ruleset cache');
  }
  const decoded = decodeAppliedRuleset(file);
  if (!decoded.ok) return none(`cache ignored: ${decoded.why}`);
  const { header, scripts } = decoded;
  let record: unknown;
  try {
    record = JSON.parse(readFileSync(path.join(dir, 'backend.json'), 'utf8'));
  } catch {}
  // A lock left by a holder that is gone (killed mid-command) does not stop the replay.
  const lockFile = path.join(dir, LOCK_NAME);
  const dead = clearDeadLock(lockFile);
  const taken = (o: Promise<ReplayOutcome>) => (dead.cleared && dead.pid !== undefined ? o.then((r) => ({ ...r, lockTakenFrom: dead.pid })) : o);
  const verdict = replayVerdict(header, {
    snapshot: snapshotSeal(readHead(path.join(dir, 'state.json'))),
    // An empty journal holds no change (a refused first line is cut off to nothing, store.ts commitAhead).
    journal: (statSync(path.join(dir, 'state.journal'), { throwIfNoEntry: false })?.size ?? 0) > 0,
    locked: lstatSync(lockFile, { throwIfNoEntry: false }) !== undefined,
    natgwVersion: natgwVersion(import.meta.url),
    mode: get('GATEWAY_NETFILTER_MODE', 'auto'),
    iptablesVariant: get('NATGW_IPTABLES_VARIANT', 'auto'),
    backendRecord: record,
  });
  if (!verdict.replay) return taken(none(`not replayed: ${verdict.why}`, header));
  // natgw's lock (lock.ts, StateStore.withLock) is held while the tools run: a command run
  // in-process meanwhile (a shim that found no daemon answering) waits for the replay instead
  // of being overwritten by it. Released before the outcome is known to anyone.
  let locked = false;
  try {
    locked = tryLock(lockFile);
  } catch {}
  if (!locked) return taken(none("not replayed: natgw's lock is held by another process", header));
  const unlock = () => {
    try {
      unlockSync(lockFile);
    } catch {}
  };
  try {
    return taken(replay(header, scripts, dir, t0).finally(unlock));
  } catch (e) {
    unlock();
    throw e;
  }
}

function replay(header: RulesetHeader, scripts: readonly Buffer[], dir: string, t0: number): Promise<ReplayOutcome> {
  const none = (why: string) => Promise.resolve<ReplayOutcome>({ replayed: false, ok: false, why, header });
  const backend = header.backend;
  if (backend.kind === 'iptables') {
    const warm = warmChain(header.cold, backend.variant);
    if (warm) return none(`not replayed: natgw's chain ${warm} is already in the kernel (a full sync repairs it)`);
  }
  const run = (argv: string[], i: number) => {
    const child = spawnWithInput(argv, scripts[i] as Buffer, path.join(dir, `${APPLIED_RULESET_FILE}.replay-${process.pid}-${i}`));
    return exited(argv, child);
  };
  // The accounting's small `nft -f` first: a spawn returns only once the child has exec'd, and
  // once the NAT tools below run on both cores that child waited ~10 ms for one (measured).
  const at = header.steps.findIndex((s) => s.tool === 'accounting');
  // Refused (not applied at all) where the table exists: its `create table` (replayRender.ts).
  const accounting = at >= 0 ? run(['nft', '-f', '-'], at) : undefined;
  const nat: Promise<string | undefined>[] = [];
  const phased = header.steps.some((s) => s.tool === 'nft' && s.phase !== undefined);
  let nftPath: ReplayOutcome['nftPath'];
  if (phased) nat.push(runPhases(header, scripts, (p) => (nftPath = p)));
  header.steps.forEach((step, i) => {
    if (step.tool === 'nft' && !phased) nat.push(run(['nft', '-f', '-'], i));
    if (step.tool === 'iptables' && backend.kind === 'iptables') nat.push(run([toolsFor(backend.variant, step.family).restore, '--noflush', '--wait'], i));
  });
  // Milliseconds since the process started (performance's time origin): how early the apply began.
  const spawnedAt = Math.round(performance.now());
  return Promise.all([Promise.all(nat), accounting]).then(([natErrors, acctError]) => {
    const failed = natErrors.filter((e): e is string => e !== undefined);
    const ms = performance.now() - t0;
    // A refused accounting step (the table exists) only means the accounting is synced as ever.
    const acct = accounting !== undefined && acctError === undefined;
    return failed.length === 0
      ? { replayed: true, ok: true, why: 'replayed', header, ms, spawnedAt, accounting: acct, ...(nftPath ? { nftPath } : {}) }
      : { replayed: true, ok: false, why: `replay failed: ${failed.join('; ')}`, header, ms, spawnedAt, accounting: false };
  });
}

/**
 * A phased nft replay (replayRender.ts): the phases' scripts as files in a private directory,
 * sequenced by PHASES_SH (one bash process: this process's event loop is about to be blocked by
 * the bundle's load). Where natgw's tables exist, the first phase's `create table` is refused
 * and the whole replacing transaction (the prelude, then every phase) runs instead. A refused
 * later phase leaves tables that nothing is hooked to; the full sync that then runs repairs them.
 */
function runPhases(header: RulesetHeader, scripts: readonly Buffer[], took: (path: 'phases' | 'whole') => void): Promise<string | undefined> {
  const by = (phase: NftPhase) =>
    scripts.filter((_, i) => {
      const s = header.steps[i];
      return s?.tool === 'nft' && s.phase === phase;
    });
  const { dir, argv } = phaseRun(
    { prelude: by('prelude')[0], first: by('first')[0] as Buffer, groups: by('group'), last: by('last')[0] as Buffer },
    tmpdir(),
    'natgw-replay',
  );
  const child = spawn(argv[0] as string, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  return exited(['nft phases'], child).finally(() => {
    took(out.includes('natgw-phases-whole') ? 'whole' : 'phases');
    rmSync(dir, { recursive: true, force: true });
  });
}

function readHead(file: string): string {
  try {
    const fd = openSync(file, 'r');
    try {
      const b = Buffer.alloc(96);
      return b.subarray(0, readSync(fd, b, 0, b.length, 0)).toString('latin1');
    } finally {
      closeSync(fd);
    }
  } catch {
    return '';
  }
}

/** The script in an unlinked file whose descriptor is the tool's stdin (unlinkedInput.ts). */
function spawnWithInput(argv: string[], script: Buffer, tmp: string): ChildProcess {
  const fd = unlinkedFileWith(tmp, script);
  try {
    return spawn(argv[0] as string, argv.slice(1), { stdio: [fd, 'ignore', 'pipe'] });
  } finally {
    closeSync(fd);
  }
}

function exited(argv: readonly string[], child: ChildProcess): Promise<string | undefined> {
  return new Promise((resolve) => {
    let stderr = '';
    child.stderr?.on('data', (d: Buffer) => {
      if (stderr.length < 2000) stderr += d.toString();
    });
    child.once('error', (e) => resolve(`${argv[0]}: ${e.message}`));
    child.once('close', (code, signal) =>
      resolve(code === 0 ? undefined : `${argv.join(' ')} exited ${code ?? signal}: ${stderr.trim().split('\n').slice(0, 3).join(' / ')}`),
    );
  });
}

const SAVE_MAX_BYTES = 512 * 1024 * 1024;

/**
 * The first of natgw's iptables chains the kernel already holds, if any. A table that does not
 * exist (legacy: not in /proc/net/ip*_tables_names; nft variant: no such nft table) holds none.
 */
export function warmChain(checks: readonly ColdCheck[], variant: IptablesVariant): string | undefined {
  let nftTables: string | undefined;
  for (const c of checks) {
    const tools = toolsFor(variant, c.family);
    if (variant === 'legacy') {
      // No such file: the legacy tables' module is not loaded, so no legacy table exists.
      let names = '';
      try {
        names = readFileSync(c.family === 4 ? '/proc/net/ip_tables_names' : '/proc/net/ip6_tables_names', 'utf8');
      } catch {}
      if (!names.split('\n').includes(c.table)) continue;
    } else {
      nftTables ??= spawnSync('nft', ['list', 'tables'], { encoding: 'utf8' }).stdout ?? '';
      if (!nftTables.split('\n').includes(`table ${c.family === 4 ? 'ip' : 'ip6'} ${c.table}`)) continue;
    }
    // Every rule of the table comes back (2.5 MiB of nat at 10,000 DNATs): spawnSync's 1 MiB
    // default cut it off and the check answered "failed" for a table it could have read.
    const r = spawnSync(tools.save, ['-t', c.table], { encoding: 'utf8', maxBuffer: SAVE_MAX_BYTES });
    // Cannot tell: treated as warm (no replay), the full sync reads it back anyway.
    if (r.status !== 0 && c.family === 4) return `(${tools.save} failed)`;
    const { chains } = parseSave(r.stdout ?? '');
    const found = c.chains.find((n) => chains.has(n));
    if (found) return found;
  }
  return undefined;
}
