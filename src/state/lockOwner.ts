/**
 * Who holds natgw's lock (proper-lockfile's directory `natgw.lock`, StateStore.withLock; the
 * start's replay takes it too), so that a holder that no longer exists does not keep everyone
 * waiting for its lock to go stale. Each holder writes an `owner` file into the directory as it
 * creates it: its pid, the start time the kernel gives that process (a pid reused later has
 * another), the boot and the pid namespace it was seen in. Without such a file, or with one
 * from another boot or another pid namespace (a process this one cannot see), a holder counts
 * as alive: the lock goes stale after proper-lockfile's `stale` as before (10 s).
 *
 * Synchronous and free of imports beyond node's own: the replay's loader uses it before the
 * daemon's code is loaded.
 */
import { readFileSync, readlinkSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';

const OWNER = 'owner';

interface Owner {
  readonly pid: number;
  readonly start: string;
  readonly boot: string;
  readonly pidns: string;
}

const read = (file: string): string | undefined => {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return undefined;
  }
};

/** Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot. */
function startOf(pid: number | 'self'): string | undefined {
  const stat = read(`/proc/${pid}/stat`);
  if (stat === undefined) return undefined;
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
}

let self: Owner | undefined;
function selfOwner(): Owner {
  if (self === undefined) {
    let pidns = '';
    try {
      pidns = readlinkSync('/proc/self/ns/pid');
    } catch {}
    self = { pid: process.pid, start: startOf('self') ?? '', boot: (read('/proc/sys/kernel/random/boot_id') ?? '').trim(), pidns };
  }
  return self;
}

/** Written by a holder right after it created the lock directory; a failure only leaves the lock ownerless. */
export function writeLockOwner(lockDir: string): void {
  try {
    writeFileSync(path.join(lockDir, OWNER), JSON.stringify(selfOwner()), { mode: 0o600 });
  } catch {}
}

/** Before the holder (or whoever takes a dead holder's lock over) removes the directory. */
export function removeLockOwner(lockDir: string): void {
  rmSync(path.join(lockDir, OWNER), { force: true });
}

/** The owner text names a process of this boot and pid namespace that no longer runs. */
function isDead(text: string | undefined): boolean {
  if (text === undefined) return false;
  let o: Partial<Owner>;
  try {
    o = JSON.parse(text) as Partial<Owner>;
  } catch {
    return false;
  }
  const me = selfOwner();
  if (typeof o.pid !== 'number' || !o.start || !me.boot || !me.pidns || o.boot !== me.boot || o.pidns !== me.pidns) return false;
  if (o.pid === process.pid) return false;
  const now = startOf(o.pid);
  return now === undefined || now !== o.start;
}

export type DeadLockOutcome = { readonly cleared: true; readonly pid: number } | { readonly cleared: false };

/**
 * Remove the lock directory when its owner file names a dead process. The directory is first
 * renamed aside (atomic) and its owner read again there: only what was seen dead is removed. A
 * lock taken meanwhile by a live process (the dead one's removed and re-created between the two
 * reads) is renamed back at once.
 */
export function clearDeadLock(lockDir: string): DeadLockOutcome {
  const seen = read(path.join(lockDir, OWNER));
  if (!isDead(seen)) return { cleared: false };
  const aside = `${lockDir}.dead-${process.pid}-${Math.random().toString(36).slice(2, 10)}`;
  try {
    renameSync(lockDir, aside);
  } catch {
    return { cleared: false };
  }
  if (read(path.join(aside, OWNER)) !== seen) {
    try {
      renameSync(aside, lockDir);
    } catch {}
    return { cleared: false };
  }
  rmSync(aside, { recursive: true, force: true });
  return { cleared: true, pid: (JSON.parse(seen as string) as Owner).pid };
}
