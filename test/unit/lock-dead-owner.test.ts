/**
 * natgw's lock (StateStore.withLock, proper-lockfile's directory) left by a holder killed with
 * SIGKILL: its owner file (src/state/lockOwner.ts) shows the holder gone, so the next taker
 * takes it over at once instead of waiting ~10 s for it to go stale (a daemon restarted after a
 * crash mid-command was not ready for that long, and skipped its replay). A live holder, and an
 * owner this process cannot judge (another pid namespace, no owner file), keep the lock.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { clearDeadLock } from '../../src/state/lockOwner.js';
import { StateStore } from '../../src/state/store.js';

const root = new URL('../../', import.meta.url).pathname;
const dirs: string[] = [];
const children: ChildProcess[] = [];
afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

const stateDir = (): string => {
  const d = mkdtempSync(path.join(tmpdir(), 'natgw-deadlock-'));
  dirs.push(d);
  return d;
};

/** A process (the built StateStore) that takes the lock and holds it until killed; resolves once it holds it. */
async function holder(dir: string): Promise<ChildProcess> {
  const store = JSON.stringify(path.join(root, 'dist', 'src', 'state', 'store.js'));
  const script = `const { StateStore } = await import(${store});
    setInterval(() => {}, 1000);
    await new StateStore(${JSON.stringify(dir)}).withLock(async () => { process.stdout.write('held\\n'); await new Promise(() => {}); });`;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(child);
  await new Promise<void>((resolve, reject) => {
    let out = '';
    child.stdout?.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('held')) resolve();
    });
    child.once('exit', (code) => reject(new Error(`holder exited ${code} before it held the lock`)));
  });
  return child;
}

const killed = (c: ChildProcess): Promise<void> =>
  new Promise((resolve) => {
    c.once('exit', () => resolve());
    c.kill('SIGKILL');
  });

describe("natgw's lock and its owner", () => {
  it('is taken over at once from a holder killed with SIGKILL, and the taker is told whose it was', async () => {
    const dir = stateDir();
    const child = await holder(dir);
    const lockDir = path.join(dir, 'natgw.lock');
    const owner = JSON.parse(readFileSync(path.join(lockDir, 'owner'), 'utf8')) as { pid: number };
    expect(owner.pid).toBe(child.pid);
    await killed(child);
    expect(existsSync(lockDir)).toBe(true);
    const dead: number[] = [];
    const store = new StateStore(dir, undefined, undefined, (pid) => dead.push(pid));
    // Without the owner check this waits for `stale` (10 s): past this test's 5 s.
    const got = await store.withLock(async () => 'ran');
    expect(got).toBe('ran');
    expect(dead).toEqual([child.pid]);
    // Released as ever (the owner file with it); nothing set aside is left.
    await store.withLock(async () => undefined);
    await new Promise((r) => setTimeout(r, 50));
    expect(existsSync(lockDir)).toBe(false);
    expect(existsSync(path.join(dir, 'natgw.lock.dead'))).toBe(false);
  }, 5_000);

  it('stays with a live holder', async () => {
    const dir = stateDir();
    const child = await holder(dir);
    const lockDir = path.join(dir, 'natgw.lock');
    expect(clearDeadLock(lockDir)).toEqual({ cleared: false });
    expect(JSON.parse(readFileSync(path.join(lockDir, 'owner'), 'utf8')).pid).toBe(child.pid);
    // A taker waits for it: still waiting after 300 ms, done once the holder is gone.
    const dead: number[] = [];
    const store = new StateStore(dir, undefined, undefined, (pid) => dead.push(pid));
    let done = false;
    const taking = store.withLock(async () => {
      done = true;
    });
    await new Promise((r) => setTimeout(r, 300));
    expect(done).toBe(false);
    await killed(child);
    await taking;
    expect(done).toBe(true);
    expect(dead).toEqual([child.pid]);
  }, 8_000);

  it('is not judged where the owner is of another pid namespace or boot, or unknown', () => {
    const dir = stateDir();
    const lockDir = path.join(dir, 'natgw.lock');
    mkdirSync(lockDir);
    // No owner file (an older natgw, or a write that failed): alive until stale.
    expect(clearDeadLock(lockDir)).toEqual({ cleared: false });
    const self = (f: string) => readFileSync(f, 'utf8').trim();
    const boot = self('/proc/sys/kernel/random/boot_id');
    // A pid that does not run here, named from elsewhere: not ours to judge.
    for (const o of [
      { pid: 2 ** 22 + 7, start: '1', boot, pidns: 'pid:[1]' },
      { pid: 2 ** 22 + 7, start: '1', boot: '00000000-0000-0000-0000-000000000000', pidns: 'x' },
      'not json',
    ]) {
      writeFileSync(path.join(lockDir, 'owner'), typeof o === 'string' ? o : JSON.stringify(o));
      expect(clearDeadLock(lockDir)).toEqual({ cleared: false });
      expect(existsSync(lockDir)).toBe(true);
    }
  });
});
