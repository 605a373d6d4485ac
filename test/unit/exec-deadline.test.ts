/**
 * The one door to processes puts a deadline on every run (NATGW_TOOL_TIMEOUT): a tool that
 * hangs is killed with its whole process group — a wrapper's grandchild that holds the output
 * pipe open too — and the run reports timedOut with a message naming the key.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { SystemExecutor } from '../../src/system/exec.js';
import { ToolError } from '../../src/model/errors.js';
import { waitFor } from '../helpers/poll.js';
import { testTempDir } from '../helpers/tempDir.js';

describe('SystemExecutor deadline', () => {
  it('kills a hung tool and its grandchildren at the deadline', async () => {
    const dir = testTempDir('natgw-exec-');
    const pidFile = join(dir, 'grandchild.pid');
    const exec = new SystemExecutor(undefined, { deadlineMs: 1000 });
    // The grandchild keeps stdout open: without a group kill the run would not end.
    const r = await exec.run({ file: 'bash', args: ['-c', `sleep 300 & echo $! > ${pidFile}; wait`], timeoutMs: 60_000 });
    expect(r.timedOut).toBe(true);
    expect(r.exitCode).not.toBe(0);
    expect(r.stderr).toMatch(/timed out after 1000 ms \(NATGW_TOOL_TIMEOUT\) and was killed/);
    const e = new ToolError('bash -c', 'the test script', r.exitCode, r.stderr, undefined, r.timedOut);
    expect(e.message).toMatch(/^Error: bash -c refused the test script: bash -c .* timed out after 1000 ms/);
    const pid = Number(readFileSync(pidFile, 'utf8'));
    await waitFor(async () => !existsSync(`/proc/${pid}`) || readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.startsWith('Z'), {
      what: 'the grandchild to be gone',
      timeoutMs: 5000,
    });
  });

  it('a run within its deadline is untouched', async () => {
    const r = await new SystemExecutor(undefined, { deadlineMs: 5000 }).run({ file: 'bash', args: ['-c', 'echo hi; echo err >&2; exit 3'] });
    expect(r).toMatchObject({ exitCode: 3, stdout: 'hi\n', stderr: 'err\n', timedOut: false, failedToStart: false });
  });

  it('a missing binary fails to start', async () => {
    const r = await new SystemExecutor(undefined, { deadlineMs: 5000 }).run({ file: 'natgw-no-such-tool', args: [] });
    expect(r.failedToStart).toBe(true);
    expect(r.exitCode).not.toBe(0);
  });
});
