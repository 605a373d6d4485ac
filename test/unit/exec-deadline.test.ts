/**
 * The one door to processes puts a deadline on every run (NATGW_TOOL_TIMEOUT): a tool that
 * hangs is killed with its whole process group — a wrapper's grandchild that holds the output
 * pipe open too — and the run reports timedOut with a message naming the key.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import { ExecError, runChecked, SystemExecutor } from '../../src/system/exec.js';
import { RecordingExecutor } from '../helpers/execCalls.js';
import { SystemError } from '../../src/model/errors.js';
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
    const e = new ExecError(r, 'the test script');
    expect(e.message).toMatch(/^Error: bash -c .* refused the test script: bash -c .* timed out after 1000 ms/);
    expect(e).toMatchObject({ timedOut: true, exitCode: 124, shortMessage: expect.stringMatching(/timed out$/) });
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

  it('a large script reaches the tool byte for byte', async () => {
    // Multi-byte characters too: the pipe carries the UTF-8 bytes.
    const input = `${'add element ip natgw fip_dnat { 172.20.0.1 : 10.0.0.1 }\n'.repeat(20_000)}# é ü\n`;
    const r = await new SystemExecutor(undefined, { deadlineMs: 10_000 }).run({ file: 'bash', args: ['-c', 'sha256sum | cut -d" " -f1'], input });
    expect(r.stdout).toBe(`${createHash('sha256').update(input, 'utf8').digest('hex')}\n`);
  });

  it('runs the tool in the C locale (parsers read its messages)', async () => {
    const r = await new SystemExecutor().run({ file: 'bash', args: ['-c', 'echo "$LC_ALL"'] });
    expect(r.stdout).toBe('C\n');
  });
});

describe('ExecError: the one tool error, built from the result', () => {
  it('carries the result and names what was refused', async () => {
    const exec = new RecordingExecutor(() => ({ exitCode: 1, stderr: 'Error: Could not process rule: No such file or directory\nline 2\n' }));
    const e = await runChecked(exec, { file: 'nft', args: ['-f', '-'], input: 'add rule ip t c accept\n' }, 'the transaction').catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ExecError);
    expect(e).toBeInstanceOf(SystemError);
    expect(e).toMatchObject({
      command: 'nft -f -',
      exitCode: 1,
      timedOut: false,
      failedToStart: false,
      stdout: '',
      shortMessage: 'nft -f - failed with exit code 1',
      script: 'add rule ip t c accept\n',
      message: 'Error: nft -f - refused the transaction: Error: Could not process rule: No such file or directory',
    });
  });

  it('a tool that could not start says so', () => {
    const e = new ExecError({ command: 'conntrack -L', exitCode: 127, stdout: '', stderr: '', timedOut: false, failedToStart: true }, 'the listing');
    expect(e.shortMessage).toBe('conntrack -L could not start');
    expect(e.message).toBe('Error: conntrack -L refused the listing: conntrack -L could not start');
  });
});
