import { AsyncLocalStorage } from 'node:async_hooks';
import {
  appendFileSync,
  closeSync,
  existsSync,
  statSync,
  fdatasync,
  fstatSync,
  fsync,
  ftruncateSync,
  mkdirSync,
  openSync,
  promises as fs,
  readFileSync,
  rmSync,
  writeSync,
} from 'node:fs';
import path from 'node:path';
import { createHash } from 'node:crypto';
import { promisify } from 'node:util';
import { z } from 'zod';
import { desiredStateSchema, type DesiredState } from './state.js';
import { SystemError } from '../model/errors.js';
import { bootId } from '../system/bootId.js';
import { clearDeadLock, LOCK_NAME, REFRESH_MS, refreshLock, STALE_MS, tryLock, unlock } from './lock.js';
import { COLLECTIONS, applyRecords, asChangeRecord, changeSize, diffStates, isNoChange, recordOf, type ChangeRecord, type StateChange } from './change.js';
import { timelineMark } from '../system/timeline.js';

/**
 * Durable files in the state dir. Writes are atomic (temp file, fsync, rename, fsync of the
 * directory) so a crash leaves either the old or the new document, never half of one.
 */
export async function writeFileAtomic(file: string, data: string): Promise<void> {
  const tmp = `${file}.tmp-${process.pid}-${Date.now()}`;
  try {
    await writeTemp(tmp, (write) => write(data));
    await publish(tmp, file);
  } catch (e) {
    throw durableError(file, e);
  }
}

/**
 * `tmp` written by `fill` and synced; nothing half-written stays behind a failure (a full disk,
 * a vanished directory). The writes are made synchronously (to the page cache: they do not
 * wait for the disk), only the sync on the thread pool: each trip through the pool costs a
 * wake-up of a pool thread and of the event loop, milliseconds on a busy node.
 */
async function writeTemp(tmp: string, fill: (write: (text: string, at?: number) => void) => void): Promise<void> {
  try {
    mkdirSync(path.dirname(tmp), { recursive: true });
    const fd = openSync(tmp, 'w', 0o600);
    try {
      fill((text, at) => {
        const bytes = Buffer.from(text, 'utf8');
        for (let off = 0; off < bytes.length; ) off += writeSync(fd, bytes, off, bytes.length - off, at === undefined ? null : at + off);
      });
      await promisify(fsync)(fd);
    } finally {
      closeSync(fd);
    }
  } catch (e) {
    try {
      rmSync(tmp, { force: true });
    } catch {
      // the write already failed; that is the error to report
    }
    throw e;
  }
}

/** The commit point: the temp file becomes `file`, and the rename is made durable. */
async function publish(tmp: string, file: string): Promise<void> {
  try {
    await fs.rename(tmp, file);
  } catch (e) {
    await fs.rm(tmp, { force: true }).catch(() => undefined);
    throw e;
  }
  await syncDir(path.dirname(file));
}

/**
 * A write to the state dir failed (a full or read-only disk): nothing was acknowledged. The
 * message names the file and the key that places it, so the user knows where to look.
 */
export function durableError(file: string, e: unknown): SystemError {
  if (e instanceof SystemError) return e;
  const code = (e as NodeJS.ErrnoException).code;
  const why = code === 'ENOSPC' ? 'no space left on device' : code === 'EROFS' ? 'read-only file system' : (e as Error).message;
  return new SystemError(`Error: cannot write ${file} (NATGW_STATE_DIR): ${why}; the change was not applied`);
}

/** A change on its way to durability, begun before the kernel applies it (StateStore.begin). */
export interface Commit {
  /** A whole new snapshot (a bulk change), not a journal line. */
  readonly bulk: boolean;
  /** The kernel took the change: make it durable (the commit point). Rejects with a durableError: the change is then not acknowledged. */
  commit(): Promise<void>;
  /**
   * The kernel refused the change, or commit() failed: nothing of it may survive a restart.
   * Never rejects; false when the change could not be taken out of the journal.
   */
  discard(): Promise<boolean>;
}

/**
 * The first half of a snapshot's atomic write: `{"sha256":"<sha>","state":<text>}` and a newline
 * durable in a temp file nobody reads, where <text> is JSON.stringify(state) and <sha> its
 * sha256. The text is written and hashed member by member, so that the largest piece held at
 * once is one collection's (a whole state's text and its bytes were two 2.5 MiB copies at
 * 21,000 objects); the seal is written into its place once the hash is known. Returns the sha.
 */
async function writeSnapshotTemp(tmp: string, state: DesiredState): Promise<string> {
  const hash = createHash('sha256');
  let sha = '';
  await writeTemp(tmp, (write) => {
    const put = (text: string): void => {
      hash.update(text);
      write(text);
    };
    write(`${SEAL_HEAD}${'0'.repeat(64)}${SEAL_TAIL}`);
    let first = true;
    for (const [key, value] of Object.entries(state)) {
      const text = JSON.stringify(value);
      if (text === undefined) continue;
      put(`${first ? '{' : ','}${JSON.stringify(key)}:`);
      put(text);
      first = false;
    }
    put(first ? '{}' : '}');
    write('}\n');
    sha = hash.digest('hex');
    write(sha, SEAL_HEAD.length);
  });
  return sha;
}

function closeQuietly(fd: number): void {
  try {
    closeSync(fd);
  } catch {
    // the write already failed; that is the error to report
  }
}

/** fdatasync on the thread pool: the event loop goes on (a tool's output, a process start) meanwhile. */
const dataSync = promisify(fdatasync);

/** A directory's entries made durable: the open and close made synchronously, only the fsync on the thread pool. */
async function syncDir(dir: string): Promise<void> {
  const fd = openSync(dir, 'r');
  try {
    await promisify(fsync)(fd);
  } finally {
    closeSync(fd);
  }
}

/** The largest change a journal line describes; a larger one is a new snapshot. */
function budget(s: DesiredState): number {
  let n = 0;
  for (const k of COLLECTIONS) n += s[k].length;
  return Math.max(64, n / 4);
}

/** The backend natgw chose in this network namespace, and a switch still to be finished. */
const backendRecordSchema = z.object({
  kind: z.enum(['iptables', 'nftables']),
  variant: z.enum(['legacy', 'nft']).optional(),
  /** The previous backend whose objects still wait to be removed (SPEC §4.3 switching). */
  pendingCleanup: z.object({ kind: z.enum(['iptables', 'nftables']), variant: z.enum(['legacy', 'nft']).optional() }).optional(),
});
export type BackendRecord = z.infer<typeof backendRecordSchema>;

/** A journal grows at most this many entries before it is folded into a new snapshot. */
const JOURNAL_MAX_ENTRIES = 2000;

/** What a load learnt about the files, for the next commit: which snapshot, how long its journal. */
interface JournalBook {
  snapshotSha: string | undefined;
  journalEntries: number;
  journalTorn: boolean;
  /** Where the journal's last line starts when it is an unanswered change (StateStore.begin) of this boot. */
  pendingAt?: number;
}

/** The line that marks the pending line before it as answered (StateStore.begin). */
const PENDING_MARK = '+';

const SEAL_HEAD = '{"sha256":"';
const SEAL_TAIL = '","state":';
const SEAL_PREFIX_LEN = SEAL_HEAD.length + 64 + SEAL_TAIL.length;
const SEALED = /^\{"sha256":"([0-9a-f]{64})","state":$/;
const sha256 = (s: string): string => createHash('sha256').update(s).digest('hex');

/** How long a command waits for natgw's lock before it fails (a holder alive and holding it). */
const LOCK_WAIT_MS = 60_000;

export class StateStore {
  readonly stateFile: string;
  readonly backendFile: string;
  /** natgw's lock (lock.ts). */
  readonly lockFile: string;
  readonly journalFile: string;
  /** sha256 of the snapshot body last loaded or written here: the journal's base. */
  private snapshotSha: string | undefined;
  private journalEntries = 0;
  /**
   * Set inside withLock's callback, and only there: a counter would also be non-zero for a
   * reader that runs beside the holder in the same process (GET /v1/state, the reconciler's
   * interface check), and such a reader must neither set files aside nor reset the writer's
   * journal bookkeeping (a reset count made the next append truncate the journal, losing
   * acknowledged changes).
   */
  private readonly holder = new AsyncLocalStorage<true>();
  /**
   * The journal ends in a line that did not verify (a crash while appending). A line appended
   * after it would be glued to the torn text and fail to verify too, losing that change and
   * every later one at the next load: the next commit writes a snapshot instead.
   */
  private journalTorn = false;

  constructor(
    readonly dir: string,
    /** Told when a state file could not be read and was set aside (it is then adopted anew). */
    private readonly onCorrupt?: (file: string, reason: string) => void,
    /** Told when the lock was found taken over while held (a stalled event loop). */
    private readonly onCompromised?: (err: Error) => void,
    /** Told when a lock was taken over: its holder no longer exists, or it went stale (pid: its holder, when known). */
    private readonly onDeadLock?: (pid: number | undefined, why: 'dead' | 'stale') => void,
  ) {
    this.stateFile = path.join(dir, 'state.json');
    this.backendFile = path.join(dir, 'backend.json');
    this.lockFile = path.join(dir, LOCK_NAME);
    this.journalFile = path.join(dir, 'state.journal');
  }

  /**
   * The identity of the durable files as this process last saw them. A command may trust what
   * it applied last only while the files are exactly as it left them: any other writer (an
   * in-process shim run, a person, a restored backup) changes one of these: a file's inode,
   * size and mtime. Three stat calls, made synchronously (a round trip through libuv's pool
   * takes a tenth of a millisecond or more on a busy node): cheap enough for every command.
   */
  stamp(): string {
    return [this.stateFile, this.journalFile, this.backendFile]
      .map((file) => {
        const st = statSync(file, { bigint: true, throwIfNoEntry: false });
        return st === undefined ? '-' : `${st.ino}:${st.size}:${st.mtimeNs}`;
      })
      .join('|');
  }

  /**
   * Load the desired state. The file carries the sha256 of its state text: a match proves it
   * is the document natgw itself wrote (already validated and canonical), so the full schema
   * check — hundreds of milliseconds at ten thousand rules — runs only for a file someone
   * edited or an older format.
   */
  async load(): Promise<DesiredState | undefined> {
    const read: JournalBook = { snapshotSha: undefined, journalEntries: 0, journalTorn: false };
    const snapshot = await this.loadSnapshot(read);
    const state = snapshot === undefined || read.snapshotSha === undefined ? snapshot : await this.replayJournal(snapshot, read.snapshotSha, read);
    // Only the lock holder's load is what its next commit builds on.
    if (this.holds()) {
      ({ snapshotSha: this.snapshotSha, journalEntries: this.journalEntries, journalTorn: this.journalTorn } = read);
      // An unanswered change's line goes now: a line appended after it would make it count.
      if (read.pendingAt !== undefined && !(await this.cutJournal(read.pendingAt))) this.journalTorn = true;
    }
    return state;
  }

  private holds(): boolean {
    return this.holder.getStore() === true;
  }

  private async loadSnapshot(read: JournalBook): Promise<DesiredState | undefined> {
    let text: string;
    try {
      text = await fs.readFile(this.stateFile, 'utf8');
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw e;
    }
    const sealed = SEALED.exec(text.slice(0, SEAL_PREFIX_LEN));
    if (sealed && text.endsWith('}\n')) {
      const body = text.slice(SEAL_PREFIX_LEN, -2);
      if (sha256(body) === sealed[1]) {
        const state = JSON.parse(body) as DesiredState;
        // Sealed by this schema version: trusted as written. An older one is validated below.
        if (state.schema === 1) {
          read.snapshotSha = sealed[1];
          return state;
        }
      }
    }
    let raw: { state?: unknown };
    try {
      raw = JSON.parse(text) as { state?: unknown };
    } catch (e) {
      return this.setAside(`not JSON: ${(e as Error).message}`);
    }
    const parsed = desiredStateSchema.safeParse(sealed ? raw.state : raw);
    return parsed.success ? parsed.data : this.setAside(parsed.error.message);
  }

  /**
   * A state file that cannot be read must not wedge the gateway (every command would fail
   * until someone intervened): it is kept beside, for a person to look at, and the state is
   * adopted from the kernel as after a lost file.
   */
  private async setAside(reason: string): Promise<undefined> {
    // Only the lock holder moves files: a reader outside the lock (GET /v1/state) could
    // otherwise rename a file a writer is replacing, or set aside its fresh snapshot.
    if (!this.holds()) return undefined;
    const aside = `${this.stateFile}.unreadable-${Date.now()}`;
    await fs.rename(this.stateFile, aside).catch(() => undefined);
    this.onCorrupt?.(aside, reason);
    return undefined;
  }

  /** Write the whole state as a new snapshot; the journal of the old one is dropped. */
  async save(state: DesiredState): Promise<void> {
    await (await this.prepare(state)).publish();
  }

  /**
   * A new snapshot in two steps: prepare() serialises it and makes it durable in a temp file
   * (the bulk of a large state's cost), publish() renames it into place — the commit point — and
   * drops the old journal. Only the lock holder calls it; the temp file's fixed name is replaced
   * by the next one.
   */
  private async prepare(state: DesiredState): Promise<{ publish(): Promise<void>; discard(): Promise<void> }> {
    const tmp = `${this.stateFile}.tmp-prepared`;
    let sha: string;
    try {
      sha = await writeSnapshotTemp(tmp, state);
    } catch (e) {
      throw durableError(this.stateFile, e);
    }
    return {
      publish: async () => {
        try {
          await publish(tmp, this.stateFile);
        } catch (e) {
          throw durableError(this.stateFile, e);
        }
        this.snapshotSha = sha;
        this.journalEntries = 0;
        this.journalTorn = false;
        // A crash before this unlink leaves a journal whose base is the old snapshot: load ignores it.
        await fs.rm(this.journalFile, { force: true });
      },
      discard: () => fs.rm(tmp, { force: true }).catch(() => undefined),
    };
  }

  /**
   * Begin persisting `after`, which `change` made from `before` (the state this store last
   * loaded or wrote), before the kernel applies it, so that the write runs while the tool does.
   * A large change (or one onto a snapshot that is not this store's own, or a long journal) is a
   * new snapshot: prepared from the next turn (once the kernel tool runs, not before its render)
   * and put in place by commit(). A small one is one journal line, written now and synced on the
   * thread pool, marked answered by commit(), cut off again by discard().
   */
  begin(before: DesiredState, after: DesiredState, change: StateChange = diffStates(before, after)): Commit {
    // Without a sealed snapshot of its own (no file yet, an adopted state, a hand-edited or
    // set-aside file, a journal line it could not read) the store writes one, even for an unchanged state.
    const bulk = this.snapshotSha === undefined || this.journalTorn || changeSize(change) > budget(after);
    if (bulk || this.journalEntries >= JOURNAL_MAX_ENTRIES) {
      const prepared = new Promise<void>((r) => setImmediate(r)).then(() => this.prepare(after));
      prepared.catch(() => undefined);
      return {
        bulk,
        commit: async () => (await prepared).publish(),
        discard: () =>
          prepared.then(
            (p) => p.discard().then(() => true),
            () => true,
          ),
      };
    }
    if (isNoChange(change)) return { bulk, commit: async () => undefined, discard: async () => true };
    const payload = JSON.stringify(recordOf(change));
    return this.lineAhead(`~${bootId()} ${sha256(payload)} ${payload}\n`, before);
  }

  /**
   * A pending journal line (`~<boot id> ...`). A process that dies before its mark leaves a
   * pending line that the next load of this boot drops (the change was never answered, and the
   * restart's full sync takes it out of the kernel); after a reboot a pending line counts, since
   * its mark may have been lost with the page cache after the answer.
   */
  private lineAhead(line: string, before: DesiredState): Commit {
    let from: number | undefined;
    const durable = this.writeLine(line, (at) => {
      from = at;
    });
    durable.catch(() => undefined);
    return {
      bulk: false,
      commit: async () => {
        await durable;
        // The mark is not synced: a process that dies leaves it in the page cache, and a machine
        // that goes down with it unsynced leaves a line of another boot, which a load counts.
        try {
          appendFileSync(this.journalFile, `${PENDING_MARK}\n`);
        } catch (e) {
          throw durableError(this.journalFile, e);
        }
      },
      discard: async () => {
        const written = await durable.then(
          () => true,
          () => false,
        );
        // Nothing written. A line whose sync failed may still be whole in the page cache: it goes too.
        if (from === undefined) return true;
        if (await this.cutJournal(from)) {
          if (written) this.journalEntries--;
          return true;
        }
        // The line could not be cut off: the state before it, as a snapshot, drops the journal.
        return this.save(before).then(
          () => true,
          () => false,
        );
      },
    };
  }

  /**
   * One journal line (after the header naming the snapshot it extends, in a fresh journal, so
   * that a journal left over from an older snapshot is never replayed onto a newer one), written
   * now and synced on the thread pool; `at` hears where it starts. A failure leaves the journal
   * to the next snapshot: a torn line is ignored on load, and the next commit must not append after it.
   */
  private async writeLine(line: string, at: (from: number) => void): Promise<void> {
    const fresh = this.journalEntries === 0;
    let fd: number | undefined;
    try {
      fd = openSync(this.journalFile, fresh ? 'w' : 'a', 0o600);
      at(fresh ? 0 : fstatSync(fd).size);
      const bytes = Buffer.from(fresh ? `{"base":"${this.snapshotSha ?? ''}"}\n${line}` : line, 'utf8');
      for (let off = 0; off < bytes.length; ) off += writeSync(fd, bytes, off);
      timelineMark('journal: line written');
      await dataSync(fd);
      timelineMark('journal: line synced');
      const done = fd;
      fd = undefined;
      closeSync(done);
      if (fresh) await syncDir(this.dir);
    } catch (e) {
      if (fd !== undefined) closeQuietly(fd);
      this.snapshotSha = undefined;
      throw durableError(this.journalFile, e);
    }
    this.journalEntries++;
  }

  /** Cut the journal at `at` (an unanswered change's line) and sync; false when that failed. */
  private async cutJournal(at: number): Promise<boolean> {
    try {
      const fd = openSync(this.journalFile, 'r+');
      try {
        ftruncateSync(fd, at);
        await dataSync(fd);
      } finally {
        closeQuietly(fd);
      }
      return true;
    } catch {
      return false;
    }
  }

  /**
   * Replay the journal onto its snapshot. A torn last line (a crash while appending, before
   * the change was acknowledged) ends the replay; so does any line that does not verify.
   */
  private async replayJournal(snapshot: DesiredState, sha: string, read: JournalBook): Promise<DesiredState> {
    // Most loads find no journal (a snapshot was just written): a stat says so without an open
    // through libuv's pool, which waits its turn on a busy event loop (a restore: ~4 ms).
    if (!existsSync(this.journalFile)) return snapshot;
    let text: string;
    try {
      text = await fs.readFile(this.journalFile, 'utf8');
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return snapshot;
      throw e;
    }
    const lines = text.split('\n');
    if (lines[0] !== `{"base":"${sha}"}`) return snapshot;
    // Records are replayed together (change.ts: one pass over each collection they touch).
    const records: ChangeRecord[] = [];
    let entries = 0;
    let torn = !text.endsWith('\n');
    let at = Buffer.byteLength(lines[0] ?? '') + 1;
    for (let i = 1; i < lines.length; i++) {
      const line = lines[i] as string;
      const start = at;
      at += Buffer.byteLength(line) + 1;
      // A pending line's mark (StateStore.begin) was read with its line.
      if (line === '' || line === PENDING_MARK) continue;
      let entry = line;
      if (line.startsWith('~')) {
        const boot = line.slice(1, line.indexOf(' '));
        entry = line.slice(boot.length + 2);
        // Marked, or followed by a later change: acknowledged. Unmarked and last, from this boot:
        // the process died before the kernel took it or before it was answered; it goes. From
        // an earlier boot its mark may have been lost with the page cache: it stays.
        const next = lines[i + 1];
        if ((next === undefined || next === '') && boot === bootId()) {
          read.pendingAt = start;
          break;
        }
      }
      const sp = entry.indexOf(' ');
      const payload = entry.slice(sp + 1);
      if (sp !== 64 || sha256(payload) !== entry.slice(0, 64)) {
        torn = true;
        break;
      }
      let record: ChangeRecord | undefined;
      try {
        record = asChangeRecord(JSON.parse(payload));
      } catch {}
      if (record === undefined) {
        torn = true;
        break;
      }
      records.push(record);
      entries++;
    }
    read.journalEntries = entries;
    read.journalTorn = torn;
    return records.length ? applyRecords(snapshot, records) : snapshot;
  }

  /**
   * A record of a few bytes, read synchronously: through libuv's pool its open, read and close
   * each wait for a turn of the event loop, ~20 ms in all on the first sync of a busy restore.
   */
  async loadBackend(): Promise<BackendRecord | undefined> {
    let text: string;
    try {
      text = readFileSync(this.backendFile, 'utf8');
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw e;
    }
    const parsed = backendRecordSchema.safeParse(JSON.parse(text));
    return parsed.success ? parsed.data : undefined;
  }

  async saveBackend(rec: BackendRecord): Promise<void> {
    await writeFileAtomic(this.backendFile, `${JSON.stringify(rec)}\n`);
  }

  /**
   * One attempt at a time, then a wait growing from 5 to 100 ms, for up to a minute. The lock
   * is nearly always free; when it is held, each wait first asks whether its holder still exists
   * or went stale (lock.ts), so a holder killed meanwhile costs a retry, not a wait.
   */
  private async acquire(): Promise<void> {
    const deadline = Date.now() + LOCK_WAIT_MS;
    for (let delay = 5; ; delay = Math.min(100, delay * 1.2)) {
      if (tryLock(this.lockFile)) return;
      const taken = clearDeadLock(this.lockFile, { staleMs: STALE_MS });
      if (taken.cleared) {
        this.onDeadLock?.(taken.pid, taken.why);
        continue;
      }
      if (Date.now() > deadline) {
        throw new SystemError(`Error: natgw's lock ${this.lockFile} has been held by another process for ${LOCK_WAIT_MS / 1000} s; the change was not applied`);
      }
      await new Promise((r) => setTimeout(r, delay));
    }
  }

  /**
   * One writer at a time across processes (daemon, in-process shim runs). A holder killed
   * with SIGKILL leaves a lock that is taken over at once when its owner shows the holder gone
   * (lock.ts), else once it goes stale after STALE_MS without the holder's refresh.
   */
  async withLock<T>(fn: () => Promise<T>): Promise<T> {
    // Synchronous, as the lock's own calls: microseconds on a local directory.
    mkdirSync(this.dir, { recursive: true });
    await this.acquire();
    // A hold past REFRESH_MS (a bulk change) keeps its lock fresh. A lock found taken over (this
    // process's event loop stalled past STALE_MS) is reported, not fatal: the transaction in hand
    // finishes, the next one takes the lock anew, and the journal's checksums keep a concurrent
    // writer from going unnoticed.
    let lost = false;
    const taken = () => {
      if (!lost) this.onCompromised?.(new Error(`natgw's lock ${this.lockFile} was taken over while held`));
      lost = true;
    };
    const refresh = setInterval(() => {
      if (!lost && !refreshLock(this.lockFile)) taken();
    }, REFRESH_MS);
    refresh.unref();
    try {
      return await this.holder.run(true, fn);
    } finally {
      clearInterval(refresh);
      // Synchronous, as the lock's other calls: a readlink and an unlink, ~10 µs.
      if (!unlock(this.lockFile)) taken();
    }
  }
}
