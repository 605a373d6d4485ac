/**
 * Executor.start: a tool started ahead of its script (a bulk change's `ip -batch`, started while
 * the NAT transaction applies). The script reaches it only when fed; cancelled or never fed,
 * it reads nothing and ends, and it never outlives the deadline.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { SystemExecutor } from '../../src/system/exec.js';
import { waitFor } from '../helpers/poll.js';
import { testTempDir } from '../helpers/tempDir.js';

/** A shell that records its pid, then what it read on stdin (only once stdin ends). */
function recorder(dir: string): { args: string[]; pid: () => Promise<number>; read: () => string | undefined } {
  const pidFile = join(dir, 'pid');
  const outFile = join(dir, 'read');
  return {
    args: ['-c', `echo $$ > ${pidFile}; cat > ${outFile}.part; mv ${outFile}.part ${outFile}; echo ok`],
    pid: () => waitFor(async () => (existsSync(pidFile) ? Number(readFileSync(pidFile, 'utf8')) || undefined : undefined), { what: 'the pid file' }),
    read: () => (existsSync(outFile) ? readFileSync(outFile, 'utf8') : undefined),
  };
}

const gone = (pid: number) => async () => !existsSync(`/proc/${pid}`) || readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.startsWith('Z');

describe('SystemExecutor.start', () => {
  it('runs the tool at once and gives it its script only when fed', async () => {
    const rec = recorder(testTempDir('natgw-start-'));
    const run = new SystemExecutor(undefined, { deadlineMs: 10_000 }).start({ file: 'bash', args: rec.args });
    const pid = await rec.pid();
    expect(existsSync(`/proc/${pid}`)).toBe(true);
    expect(rec.read()).toBeUndefined();
    const r = await run.feed('addr add 192.0.2.1/24 dev net1\n');
    expect(r).toMatchObject({ exitCode: 0, stdout: 'ok\n', stderr: '', timedOut: false, failedToStart: false });
    expect(r.command).toBe(`bash ${rec.args.join(' ')}`);
    expect(rec.read()).toBe('addr add 192.0.2.1/24 dev net1\n');
  });

  it('cancelled, the tool reads nothing and ends', async () => {
    const rec = recorder(testTempDir('natgw-start-'));
    const run = new SystemExecutor(undefined, { deadlineMs: 10_000 }).start({ file: 'bash', args: rec.args });
    const pid = await rec.pid();
    run.cancel();
    await waitFor(gone(pid), { what: 'the cancelled tool to end', timeoutMs: 5000, intervalMs: 20 });
    expect(rec.read()).toBe('');
  });

  it('never fed, it is killed at the deadline', async () => {
    const rec = recorder(testTempDir('natgw-start-'));
    new SystemExecutor(undefined, { deadlineMs: 300 }).start({ file: 'bash', args: rec.args });
    const pid = await rec.pid();
    await waitFor(gone(pid), { what: 'the unfed tool to be killed', timeoutMs: 5000, intervalMs: 20 });
    expect(rec.read()).toBeUndefined();
  });

  it('a missing binary: fed, it reports it failed to start', async () => {
    const r = await new SystemExecutor(undefined, { deadlineMs: 5000 }).start({ file: 'natgw-no-such-tool', args: [] }).feed('x\n');
    expect(r.failedToStart).toBe(true);
  });
});
