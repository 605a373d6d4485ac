/**
 * The keeper of long-lived children (src/system/supervised.ts), with real child processes:
 * restarts with backoff, failed starts, stop; and its line reader's turns and end.
 */
import { PassThrough } from 'node:stream';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { LINES_PER_TURN, readLines, Supervised, type SupervisedState } from '../../src/system/supervised.js';
import { waitFor } from '../helpers/poll.js';

const silent = pino({ level: 'silent' });

describe('readLines', () => {
  it('hands over every line, the unterminated last one too, and resolves at the end', async () => {
    const s = new PassThrough();
    const got: string[] = [];
    const done = readLines(s, (l) => got.push(l));
    s.write('a\nb');
    s.write('c\n\nd');
    s.end();
    await done;
    expect(got).toEqual(['a', 'bc', '', 'd']);
  });

  it('a burst is handed over LINES_PER_TURN lines per turn of the event loop, the stream paused meanwhile', async () => {
    const s = new PassThrough();
    const total = LINES_PER_TURN * 10;
    let handled = 0;
    const seenByTurns: number[] = [];
    const done = readLines(s, () => handled++);
    s.end(`${Array.from({ length: total }, (_, i) => `line ${i}`).join('\n')}\n`);
    // Something else that wants the event loop meanwhile: it gets turns while the burst drains.
    const tick = (): void => {
      seenByTurns.push(handled);
      if (handled < total) setImmediate(tick);
    };
    setImmediate(tick);
    await done;
    expect(handled).toBe(total);
    const during = seenByTurns.filter((n) => n > 0 && n < total);
    expect(during.length).toBeGreaterThanOrEqual(5);
    for (let i = 1; i < seenByTurns.length; i++) expect((seenByTurns[i] as number) - (seenByTurns[i - 1] as number)).toBeLessThanOrEqual(LINES_PER_TURN);
  });
});

describe('Supervised (a real child process)', () => {
  /** A child that waits until it is killed. */
  const sleeper = { file: 'sh', args: ['-c', 'exec sleep 600'] };

  it('restarts a child that dies, with a growing backoff, and stops for good', async () => {
    const pids: number[] = [];
    const states: SupervisedState[] = [];
    const sup = new Supervised({
      ...sleeper,
      log: silent,
      onSpawn: (pid) => pids.push(pid),
      onState: (s) => states.push(s),
      minBackoffMs: 5,
      maxBackoffMs: 40,
      stableMs: 60_000,
    });
    sup.start();
    try {
      await waitFor(async () => sup.state === 'running', { what: 'first start' });
      for (let i = 0; i < 4; i++) {
        process.kill(pids[pids.length - 1] as number, 'SIGKILL');
        await waitFor(async () => sup.state === 'running' && pids.length === i + 2, { what: `restart ${i + 1}` });
      }
      expect(sup.restarts).toBe(4);
      expect(sup.lastExit?.signal).toBe('SIGKILL');
      expect(new Set(pids).size).toBe(5);
    } finally {
      await sup.stop();
    }
    expect(sup.state).toBe('stopped');
    expect(sup.lastExit?.signal).toBe('SIGTERM');
    expect(() => process.kill(pids[pids.length - 1] as number, 0)).toThrow();
    expect(states.filter((s) => s === 'backoff')).toHaveLength(4);
  });

  it('hands each line to its owner, stdout and stderr apart; by default at debug level', async () => {
    const lines: { level: number; line?: string }[] = [];
    const log = pino({ level: 'debug' }, { write: (s: string) => lines.push(JSON.parse(s)) });
    const err: string[] = [];
    const script = "console.log('[ERROR] cannot bind'); console.error('[NOTICE] chatter'); setInterval(() => {}, 1000)";
    const sup = new Supervised({ file: process.execPath, args: ['-e', script], log, onStderr: (l) => err.push(l), stableMs: 60_000 });
    sup.start();
    try {
      await waitFor(async () => err.includes('[NOTICE] chatter') && lines.some((l) => l.line === '[ERROR] cannot bind'), { what: "the child's two lines" });
      expect(lines.find((l) => l.line === '[ERROR] cannot bind')?.level).toBe(20);
      expect(lines.some((l) => l.line === '[NOTICE] chatter')).toBe(false);
    } finally {
      await sup.stop();
    }
  });

  it('a failed start (binary gone, config refused) is retried too, never thrown', async () => {
    let attempts = 0;
    const sup = new Supervised({
      ...sleeper,
      log: silent,
      beforeStart: async () => {
        attempts++;
        if (attempts < 3) throw new Error('sync interface sync0 not found (yet)');
      },
      minBackoffMs: 1,
      maxBackoffMs: 2,
    });
    sup.start();
    try {
      await waitFor(async () => sup.state === 'running', { what: 'start after two failures' });
      expect(attempts).toBe(3);
      expect(sup.restarts).toBe(2);
      expect(sup.lastExit?.error).toMatch(/not found/);
    } finally {
      await sup.stop();
    }
  });

  it('a binary that is not there is a failed start, retried with backoff', async () => {
    const sup = new Supervised({ file: '/nonexistent/conntrackd', args: [], log: silent, minBackoffMs: 1, maxBackoffMs: 2 });
    sup.start();
    try {
      await waitFor(async () => sup.restarts >= 2, { what: 'two failed starts' });
      // Through setpriv (diesWithNatgw) the exec fails in the child, which says why on stderr.
      expect(sup.lastExit?.code).not.toBe(0);
      expect(sup.lastExit?.error).toMatch(/ENOENT|No such file|nonexistent/);
    } finally {
      await sup.stop();
    }
  });
});
