/**
 * A large script reaches its tool through an unlinked temp file (stdin is a regular file), a
 * small one through a pipe: the tool reads exactly the bytes given either way, and no temp
 * file is left behind.
 */
import { createHash, randomUUID } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { describe, expect, it } from 'vitest';
import { SystemExecutor, type ExecRequest } from '../../src/system/exec.js';
import { waitFor } from '../helpers/poll.js';

/** Prints what stdin is (`file` or `pipe`), then the sha256 of what it read. */
const probe = ['-c', 'if [ -f /dev/stdin ]; then echo file; else echo pipe; fi; sha256sum | cut -d" " -f1'];

/** This process's children whose command line holds `name` (the spare started for it). */
function childrenNamed(name: string): number[] {
  const pids: number[] = [];
  for (const task of readdirSync(`/proc/${process.pid}/task`)) {
    let list = '';
    try {
      list = readFileSync(`/proc/${process.pid}/task/${task}/children`, 'utf8');
    } catch {
      continue;
    }
    for (const p of list.trim().split(/\s+/).filter(Boolean).map(Number)) {
      try {
        if (readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0').includes(name)) pids.push(p);
      } catch {
        // gone meanwhile
      }
    }
  }
  return pids;
}

const sha = (s: string) => createHash('sha256').update(s, 'utf8').digest('hex');
const leftovers = () => readdirSync(tmpdir()).filter((f) => f.startsWith(`natgw-stdin-${process.pid}-`));

describe('SystemExecutor: a script on stdin', () => {
  it('a large one comes from a file, byte for byte, and the file is gone', async () => {
    // Multi-byte characters too: the file holds the UTF-8 bytes, as the pipe would carry them.
    const input = `${'add element ip natgw fip_dnat { 172.20.0.1 : 10.0.0.1 }\n'.repeat(3000)}# é ü\n`;
    const r = await new SystemExecutor(undefined, { deadlineMs: 10_000 }).run({ file: 'bash', args: probe, input });
    expect(r).toMatchObject({ exitCode: 0, stderr: '', timedOut: false, failedToStart: false });
    expect(r.stdout).toBe(`file\n${sha(input)}\n`);
    expect(leftovers()).toEqual([]);
  });

  it('a small one still comes through a pipe', async () => {
    const input = 'add table ip natgw\n';
    const r = await new SystemExecutor(undefined, { deadlineMs: 10_000 }).run({ file: 'bash', args: probe, input });
    expect(r.stdout).toBe(`pipe\n${sha(input)}\n`);
  });

  it('a tool that does not start is reported as before, its file closed and gone', async () => {
    const r = await new SystemExecutor(undefined, { deadlineMs: 10_000 }).run({ file: 'natgw-no-such-tool', args: [], input: 'x'.repeat(100_000) });
    expect(r).toMatchObject({ exitCode: 127, failedToStart: true });
    expect(leftovers()).toEqual([]);
  });

  it('a large one does not take a spare process (its pipe would need the event loop); the spare waits for the next small one', async () => {
    const name = `natgw-spare-${randomUUID()}`;
    const req = (input: string): ExecRequest => ({
      file: 'sh',
      args: ['-c', 'if [ -f /dev/stdin ]; then k=file; else k=pipe; fi; cat > /dev/null; echo "$$ $k"', name],
      input,
      prestartable: true,
      single: true,
    });
    const exec = new SystemExecutor(undefined, { deadlineMs: 10_000, prestart: true, runner: false });
    expect((await exec.run(req('small\n'))).stdout).toMatch(/ pipe\n$/);
    exec.startSpares();
    const [spare] = await waitFor(
      async () => {
        const pids = childrenNamed(name);
        return pids.length === 1 ? pids : undefined;
      },
      { what: 'the spare process' },
    );
    const large = await exec.run(req('x'.repeat(200_000)));
    expect(large.stdout).toMatch(/^\d+ file\n$/);
    expect(Number(large.stdout.split(' ')[0])).not.toBe(spare);
    expect((await exec.run(req('small\n'))).stdout).toBe(`${spare} pipe\n`);
  });
});
