/**
 * The atomic write of a small record (the ownership, QoS intent and backend records): the whole
 * new document or an error naming the file, never a temp file left behind; a missing state
 * directory is made.
 */
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { writeFileAtomic } from '../../src/state/store.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});
const scratch = (): string => {
  const d = mkdtempSync(path.join(tmpdir(), 'natgw-record-'));
  dirs.push(d);
  return d;
};

describe('writeFileAtomic', () => {
  it('replaces the record whole and leaves no temp file', async () => {
    const dir = scratch();
    const file = path.join(dir, 'owned.json');
    writeFileSync(file, '{"old":true}\n');
    await writeFileAtomic(file, '{"addresses":["172.20.0.10"]}\n');
    expect(readFileSync(file, 'utf8')).toBe('{"addresses":["172.20.0.10"]}\n');
    expect(readdirSync(dir)).toEqual(['owned.json']);
  });

  it('makes a missing state directory', async () => {
    const file = path.join(scratch(), 'state', 'sub', 'owned.json');
    await writeFileAtomic(file, '{}\n');
    expect(readFileSync(file, 'utf8')).toBe('{}\n');
  });

  it('a write that cannot be made rejects naming the file, and leaves the old record and no temp file', async () => {
    const dir = scratch();
    const file = path.join(dir, 'owned.json');
    writeFileSync(file, '{"old":true}\n');
    // A directory where the record should go: the rename fails after the temp file was written.
    const blocked = path.join(dir, 'blocked');
    writeFileSync(path.join(dir, 'x'), '');
    await expect(writeFileAtomic(path.join(dir, 'x', 'owned.json'), '{}\n')).rejects.toThrow(/cannot write .*owned\.json/);
    mkdirSync(path.join(blocked, 'inner'), { recursive: true });
    await expect(writeFileAtomic(blocked, '{}\n')).rejects.toThrow(/cannot write .*blocked/);
    expect(readFileSync(file, 'utf8')).toBe('{"old":true}\n');
    expect(readdirSync(dir).sort()).toEqual(['blocked', 'owned.json', 'x']);
  });
});
