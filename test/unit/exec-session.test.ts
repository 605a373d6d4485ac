/**
 * The executor's long-lived tool sessions (`nft -i` in production), with small shell tools
 * standing in: an exchange is answered at its marker, with the stderr written before it; a
 * session that stalls past the deadline is killed and replaced; one that dies is replaced; a
 * run settled by its output answers before the tool exits.
 */
import { describe, expect, it } from 'vitest';
import { SystemExecutor } from '../../src/system/exec.js';

/** Writes every line it reads to stderr; `die` exits 3, `hang` stops reading. */
const ECHO = ['-c', 'while IFS= read -r l; do case $l in die) exit 3;; hang) sleep 30;; esac; printf "%s\\n" "$l" >&2; done'];

describe('SystemExecutor sessions', () => {
  it('answers each exchange at its marker, with what came before it, in call order', async () => {
    const exec = new SystemExecutor(undefined, { deadlineMs: 5000 });
    const s = exec.session('sh', ECHO);
    try {
      const [a, b] = await Promise.all([s.exchange('one\ntwo\nM1\n', 'M1\n'), s.exchange('three\nM2\n', 'M2\n')]);
      expect(a).toEqual({ stderr: 'one\ntwo\n', timedOut: false, died: false });
      expect(b).toEqual({ stderr: 'three\n', timedOut: false, died: false });
      // The same process for the same tool and arguments.
      expect(exec.session('sh', ECHO)).toBe(s);
    } finally {
      s.recycle();
    }
  });

  it('kills a session that stalls past the deadline, and starts a new one next time', async () => {
    const exec = new SystemExecutor(undefined, { deadlineMs: 300 });
    const s = exec.session('sh', ECHO);
    try {
      const r = await s.exchange('hang\nM1\n', 'M1\n');
      expect(r).toMatchObject({ timedOut: true, died: true });
      expect(await s.exchange('again\nM2\n', 'M2\n')).toEqual({ stderr: 'again\n', timedOut: false, died: false });
    } finally {
      s.recycle();
    }
  });

  it('reports a session that died before its marker, and replaces it', async () => {
    const exec = new SystemExecutor(undefined, { deadlineMs: 5000 });
    const s = exec.session('sh', ECHO);
    try {
      const r = await s.exchange('last words\ndie\nM1\n', 'M1\n');
      expect(r).toEqual({ stderr: 'last words\n', timedOut: false, died: true });
      expect(await s.exchange('alive\nM2\n', 'M2\n')).toEqual({ stderr: 'alive\n', timedOut: false, died: false });
    } finally {
      s.recycle();
    }
  });

  it('a missing tool is a session that died', async () => {
    const exec = new SystemExecutor(undefined, { deadlineMs: 5000 });
    expect(await exec.session('natgw-no-such-tool', []).exchange('x\n', 'M\n')).toMatchObject({ died: true, timedOut: false });
  });

  it('a run settled by its output answers before the tool exits', async () => {
    const exec = new SystemExecutor(undefined, { deadlineMs: 60_000 });
    const r = await exec.run({
      file: 'sh',
      args: ['-c', 'echo "3 flow entries have been deleted." >&2; exec sleep 30'],
      settledBy: /flow entries have been deleted/,
      single: true,
    });
    // Had it waited for the exit, the test would time out.
    expect(r).toMatchObject({ exitCode: 0, timedOut: false, stderr: '3 flow entries have been deleted.\n' });
  }, 10_000);
});
