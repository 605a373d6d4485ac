/**
 * natgw's lock (`natgw.lock` in the state dir): one writer at a time across the daemon and the
 * in-process shim runs. The lock is a symbolic link whose target names
 * its holder — `natgw:<pid>:<start>:<boot>:<pidns>` — as Emacs and Mercurial lock files do:
 * `symlink()` takes it and records who in one call, and fails when it is taken; `unlink()` lets
 * it go. A directory with an owner file inside would cost four metadata
 * writes, two of them block allocations on ext4 (~0.2 ms a command, measured); a symlink this
 * short lives in its inode (~0.05 ms).
 *
 * A holder that no longer exists (killed mid-command) is seen at once: its pid runs no more, or
 * runs a process started at another time. A holder this process cannot judge (another boot or
 * pid namespace, a target it cannot read) keeps the lock until it goes stale: `STALE_MS` without
 * the refresh (`lutimes`) that every holder makes while it holds the lock.
 */
import { lstatSync, lutimesSync, readFileSync, readlinkSync, renameSync, rmSync, symlinkSync, unlinkSync } from 'node:fs';
import { bootId } from '../system/bootId.js';

export const LOCK_NAME = 'natgw.lock';
/** A holder that has not refreshed the lock for this long is taken over, whoever it is. */
export const STALE_MS = 10_000;
/** How often a holder refreshes the lock while it holds it (well inside STALE_MS). */
export const REFRESH_MS = 2_000;

interface Owner {
  readonly pid: number;
  readonly start: string;
  readonly boot: string;
  readonly pidns: string;
}

/** Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot. */
function startOf(pid: number | 'self'): string | undefined {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
}

let self: { readonly owner: Owner; readonly text: string } | undefined;
/** This process as an owner, and as the lock's target: under 60 bytes, so ext4 keeps it in the inode. */
function selfOwner(): { readonly owner: Owner; readonly text: string } {
  if (self === undefined) {
    let pidns = '';
    try {
      // `pid:[4026531836]`: the namespace's inode number is what tells namespaces apart.
      pidns = /\d+/.exec(readlinkSync('/proc/self/ns/pid'))?.[0] ?? '';
    } catch {}
    // Eight hex digits of the boot id tell two boots of one machine apart.
    const boot = bootId().replace(/-/g, '').slice(0, 8);
    const owner: Owner = { pid: process.pid, start: startOf('self') ?? '', boot, pidns };
    self = { owner, text: `natgw:${owner.pid}:${owner.start}:${owner.boot}:${owner.pidns}` };
  }
  return self;
}

const OWNER_TEXT = /^natgw:(\d+):(\d+):([0-9a-f]{8}):(\d+)$/;

/** Who holds the lock, as its target says; undefined when unreadable (it is then judged only by its age). */
function ownerOf(lock: string): Owner | undefined {
  let text: string;
  try {
    text = readlinkSync(lock);
  } catch {
    return undefined;
  }
  const m = OWNER_TEXT.exec(text);
  if (!m) return undefined;
  return { pid: Number(m[1]), start: m[2] as string, boot: m[3] as string, pidns: m[4] as string };
}

/** The owner is a process of this boot and pid namespace that no longer runs. */
function isDead(o: Owner | undefined): o is Owner {
  if (o === undefined) return false;
  const me = selfOwner().owner;
  if (!o.start || !me.boot || !me.pidns || o.boot !== me.boot || o.pidns !== me.pidns) return false;
  if (o.pid === process.pid) return false;
  const now = startOf(o.pid);
  return now === undefined || now !== o.start;
}

/** Take the lock when it is free: true when this process holds it now. Failures other than "taken" throw. */
export function tryLock(lock: string): boolean {
  try {
    symlinkSync(selfOwner().text, lock);
    return true;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw e;
  }
}

/** The lock is this process's (not taken over since it took it). */
export function holdsLock(lock: string): boolean {
  try {
    return readlinkSync(lock) === selfOwner().text;
  } catch {
    return false;
  }
}

/** Refresh a held lock's time (see STALE_MS): false when it is no longer this process's. */
export function refreshLock(lock: string): boolean {
  if (!holdsLock(lock)) return false;
  try {
    const now = new Date();
    lutimesSync(lock, now, now);
  } catch {}
  return true;
}

/** Let the lock go: false (and nothing removed) when it was not this process's any more. */
export function unlock(lock: string): boolean {
  if (!holdsLock(lock)) return false;
  try {
    unlinkSync(lock);
  } catch {}
  return true;
}

export type TakenOver = { readonly cleared: true; readonly pid?: number; readonly why: 'dead' | 'stale' } | { readonly cleared: false };

/**
 * Remove a lock whose holder is dead, or that went stale. The lock is first renamed aside
 * (atomic) and its owner read again there: only what was judged is removed. A lock taken
 * meanwhile by a live process (the judged one removed and re-created between the two reads) is
 * renamed back at once.
 */
export function clearDeadLock(lock: string, opts: { readonly staleMs?: number } = {}): TakenOver {
  let st: ReturnType<typeof lstatSync> | undefined;
  try {
    st = lstatSync(lock);
  } catch {
    return { cleared: false };
  }
  const seen = ownerOf(lock);
  const why = isDead(seen) ? 'dead' : opts.staleMs !== undefined && Date.now() - st.mtimeMs > opts.staleMs ? 'stale' : undefined;
  if (why === undefined) return { cleared: false };
  const aside = `${lock}.dead-${process.pid}-${Math.random().toString(36).slice(2, 10)}`;
  try {
    renameSync(lock, aside);
  } catch {
    return { cleared: false };
  }
  const again = ownerOf(aside);
  const sameMtime = lstatSync(aside, { throwIfNoEntry: false })?.mtimeMs === st.mtimeMs;
  if (JSON.stringify(again) !== JSON.stringify(seen) || !sameMtime) {
    putBack(aside, lock);
    return { cleared: false };
  }
  rmSync(aside, { recursive: true, force: true });
  return { cleared: true, why, ...(seen ? { pid: seen.pid } : {}) };
}

/**
 * A live holder's lock, renamed aside by mistake, goes back, unless the lock was taken since
 * (a symlink is re-created: a rename would replace the new taker's). Either way the aside copy
 * goes; a holder whose lock was lost this way finds it not its own at release (holdsLock).
 */
function putBack(aside: string, lock: string): void {
  try {
    symlinkSync(readlinkSync(aside), lock);
  } catch {}
  rmSync(aside, { recursive: true, force: true });
}
