import * as fs from 'node:fs';
import { removeLockOwner, writeLockOwner } from './lockOwner.js';

type Callback<T = void> = (err: NodeJS.ErrnoException | null, value?: T) => void;

/** Run `op` now and hand its outcome to `cb` on the next tick (proper-lockfile expects callbacks to come later). */
function now<T>(op: () => T, cb: Callback<T>): void {
  let value: T;
  try {
    value = op();
  } catch (e) {
    process.nextTick(cb, e as NodeJS.ErrnoException);
    return;
  }
  process.nextTick(cb, null, value);
}

/**
 * The file system proper-lockfile locks through, with every call made synchronously: the lock
 * is taken and released on every command (a mkdir, a stat, an rmdir of one local directory,
 * microseconds each), and through the thread pool each call cost a round trip of the event loop
 * on the command's critical path. One object for the process: proper-lockfile caches the file
 * system's mtime precision on it.
 */
export const lockFs = {
  // The directory is the lock; its owner file says whose (lockOwner.ts), written in the same turn.
  mkdir: (p: string, cb: Callback) =>
    now(() => {
      fs.mkdirSync(p);
      writeLockOwner(p);
    }, cb),
  // The release, after the answer (StateStore.withLock): on the thread pool, an ext4 rmdir
  // (~0.3 ms) overlaps the next request's parse and validation instead of preceding them.
  // proper-lockfile removes a stale lock through this too.
  rmdir: (p: string, cb: Callback) => {
    removeLockOwner(p);
    fs.rmdir(p, cb);
  },
  rmdirSync: (p: string) => {
    removeLockOwner(p);
    fs.rmdirSync(p);
  },
  stat: (p: string, cb: Callback<fs.Stats>) => now(() => fs.statSync(p), cb),
  utimes: (p: string, atime: Date, mtime: Date, cb: Callback) => now(() => fs.utimesSync(p, atime, mtime), cb),
  realpath: (p: string, cb: Callback<string>) => now(() => fs.realpathSync(p), cb),
};
