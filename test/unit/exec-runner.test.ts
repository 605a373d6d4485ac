/**
 * The executor's runner shell (SystemExecutor `runner`): a prestartable tool with a small
 * script is started by a long-lived shell instead of a fork of natgw. The tool must get its
 * script byte for byte (the lines are data, never shell text), its exit status and output must
 * come back as from a run of its own, a hang must be killed at the deadline with the tool, a
 * runner that died must be replaced, and a script too large for it takes the direct path.
 */
import { randomUUID } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { SystemExecutor, type ExecRequest } from '../../src/system/exec.js';
import { waitFor } from '../helpers/poll.js';

const executors: SystemExecutor[] = [];
afterEach(() => {
  executors.splice(0);
});

function executor(deadlineMs = 10_000): SystemExecutor {
  const e = new SystemExecutor(undefined, { deadlineMs, prestart: true });
  executors.push(e);
  return e;
}

/**
 * The tool: one fixed script (one runner per tool and arguments), whose first input line says
 * what to do; `cat` echoes the rest of its input.
 */
const TOOL = `IFS= read -r what
case $what in
  pids) cat > /dev/null; echo "$PPID $$" ;;
  fail) cat > /dev/null; echo "line 2 failed" >&2; exit 3 ;;
  hang) cat > /dev/null; echo $$; exec sleep 600 ;;
  die) cat > /dev/null; kill -9 $PPID; sleep 0.2 ;;
  *) cat ;;
esac`;

const tool = (input: string, name: string): ExecRequest => ({ file: 'sh', args: ['-c', TOOL, name], input, prestartable: true });
const newName = () => `natgw-runner-test-${randomUUID()}`;
/** [runner pid, tool pid] of a `pids` run. */
const pidsOf = (stderr: string): [number, number] => stderr.trim().split(' ').map(Number) as [number, number];

describe('SystemExecutor runner', () => {
  it('gives the tool its script byte for byte: shell syntax in it stays data', async () => {
    const script = [
      'cat',
      '*nat',
      '-A X -m comment --comment "$(touch /tmp/natgw-never) `id` $HOME \\n \\\\ \'q\'"',
      '  leading and trailing spaces  ',
      '',
      'natgw_end',
      'EOF',
      '\ttab\r',
      'COMMIT',
      '',
    ].join('\n');
    const r = await executor().run(tool(script, newName()));
    expect(r.exitCode).toBe(0);
    // stdout and stderr of the tool both come back on stderr.
    expect(r.stderr).toBe(script.slice('cat\n'.length));
    expect(r.stdout).toBe('');
  });

  it('answers with the exit status and what the tool wrote, every run in the same shell', async () => {
    const exec = executor();
    const name = newName();
    const [runnerA, toolA] = pidsOf((await exec.run(tool('pids\n', name))).stderr);
    const [runnerB, toolB] = pidsOf((await exec.run(tool('pids\n', name))).stderr);
    expect(runnerA).toBe(runnerB);
    expect(runnerA).not.toBe(process.pid);
    expect(toolA).not.toBe(toolB);
    const failed = await exec.run(tool('fail\nx\n', name));
    expect(failed.exitCode).toBe(3);
    expect(failed.stderr).toBe('line 2 failed\n');
    expect(failed.failedToStart).toBe(false);
  });

  it('keeps the tool of the next run started ahead, waiting for its input', async () => {
    const exec = executor();
    const name = newName();
    const [runner] = pidsOf((await exec.run(tool('pids\n', name))).stderr);
    // The tool of the next request is already there (the runner's pipeline, started at once;
    // its other child is the subshell waiting for the request).
    const waiting = await waitFor(
      async () => {
        const kids = readFileSync(`/proc/${runner}/task/${runner}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
        const tools = kids.filter((k) => existsSync(`/proc/${k}`) && readFileSync(`/proc/${k}/cmdline`, 'utf8').split('\0')[2] === TOOL);
        return tools.length === 1 ? tools[0] : undefined;
      },
      { what: 'the tool started ahead' },
    );
    const [, second] = pidsOf((await exec.run(tool('pids\n', name))).stderr);
    expect(second).toBe(waiting);
  });

  it('starts a spare of its own only once quiet after startSpares; a run meanwhile takes the runner', async () => {
    const exec = executor();
    const name = newName();
    const [runner] = pidsOf((await exec.run(tool('pids\n', name))).stderr);
    exec.startSpares();
    // At once (a command that follows its answer): the runner, and no spare was forked.
    const now = await exec.run(tool('pids\n', name));
    expect(pidsOf(now.stderr)[0]).toBe(runner);
    exec.startSpares();
    // After a quiet moment the daemon's own spare is there (its parent is this process) and is taken.
    const spare = await waitFor(
      async () => {
        const kids = readFileSync(`/proc/${process.pid}/task/${process.pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
        return kids.find((k) => existsSync(`/proc/${k}`) && readFileSync(`/proc/${k}/cmdline`, 'utf8').split('\0')[2] === TOOL);
      },
      { what: 'the spare started after a quiet moment' },
    );
    const later = await exec.run(tool('pids\n', name));
    expect(pidsOf(later.stdout)).toEqual([process.pid, spare]);
  });

  it('reports a missing binary as failedToStart with exit 127', async () => {
    const r = await executor().run({ file: `/nonexistent/natgw-${randomUUID()}`, args: [], input: 'x\n', prestartable: true });
    expect(r.exitCode).toBe(127);
    expect(r.failedToStart).toBe(true);
  });

  it('kills a hung tool at the deadline with its runner, and the next run gets a new runner', async () => {
    const exec = executor(500);
    const name = newName();
    const [runner] = pidsOf((await exec.run(tool('pids\n', name))).stderr);
    const hung = await exec.run(tool('hang\n', name));
    expect(hung.timedOut).toBe(true);
    expect(hung.exitCode).toBe(124);
    const sleeper = Number(hung.stderr.split('\n').find((l) => /^\d+$/.test(l)));
    expect(sleeper).toBeGreaterThan(0);
    await waitFor(async () => gone(sleeper) && gone(runner), { what: 'the hung tool and its runner to be gone' });
    const next = await exec.run(tool('pids\n', name));
    expect(next.exitCode).toBe(0);
    expect(pidsOf(next.stderr)[0]).not.toBe(runner);
  });

  it('a runner killed between runs is replaced; one that dies mid-run fails that run, never passes it', async () => {
    const exec = executor();
    const name = newName();
    const [runner] = pidsOf((await exec.run(tool('pids\n', name))).stderr);
    process.kill(runner, 'SIGKILL');
    await waitFor(async () => gone(runner), { what: 'the runner to be reaped' });
    const after = await exec.run(tool('pids\n', name));
    expect(after.exitCode).toBe(0);
    expect(pidsOf(after.stderr)[0]).not.toBe(runner);
    const mid = await exec.run(tool('die\n', name));
    expect(mid.exitCode).not.toBe(0);
    expect(mid.stderr).toMatch(/outcome is unknown/);
  });

  it('a script too large for the runner, or a run not prestartable, starts the tool directly', async () => {
    const exec = executor();
    const name = newName();
    const [runner] = pidsOf((await exec.run(tool('pids\n', name))).stderr);
    expect(runner).not.toBe(process.pid);
    // Started directly, the tool's parent is this process, and its stdout is its own.
    const large = await exec.run(tool(`pids\n${'y'.repeat(4096)}\n`, name));
    expect(large.exitCode).toBe(0);
    expect(pidsOf(large.stdout)[0]).toBe(process.pid);
    const plain = await exec.run({ ...tool('pids\n', name), prestartable: false });
    expect(pidsOf(plain.stdout)[0]).toBe(process.pid);
  });
});

/** Gone and reaped by its parent (a zombie is still there). */
function gone(pid: number): boolean {
  return !existsSync(`/proc/${pid}`);
}
