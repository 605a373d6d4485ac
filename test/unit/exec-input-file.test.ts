/**
 * A large script reaches its tool through an unlinked temp file (stdin is a regular file), a
 * small one through a pipe: the tool reads exactly the bytes given either way, and no temp
 * file is left behind.
 */
import { createHash } from 'node:crypto';
import { readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { describe, expect, it } from 'vitest';
import { SystemExecutor } from '../../src/system/exec.js';

/** Prints what stdin is (`file` or `pipe`), then the sha256 of what it read. */
const probe = ['-c', 'if [ -f /dev/stdin ]; then echo file; else echo pipe; fi; sha256sum | cut -d" " -f1'];

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
});
