/** The flow-log file: appends, rotates to `.1` by size, never holds more than its queue limit. */
import { afterEach, describe, expect, it } from 'vitest';
import { mkdtempSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RotatingFile } from '../../src/observe/rotate.js';

const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), 'natgw-rotate-'));
  dirs.push(d);
  return d;
};
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

describe('RotatingFile', () => {
  it('appends lines and creates the directory', async () => {
    const path = join(tmp(), 'sub', 'flows.log');
    const f = new RotatingFile({ path, maxBytes: 1024 });
    expect(f.write('a')).toBe(true);
    expect(f.write('b')).toBe(true);
    await f.close();
    expect(readFileSync(path, 'utf8')).toBe('a\nb\n');
  });

  it('rotates to .1 before a line would pass the size, keeping one generation', async () => {
    const path = join(tmp(), 'flows.log');
    const f = new RotatingFile({ path, maxBytes: 10 });
    for (const l of ['1111', '2222', '3333', '4444', '5555']) f.write(l); // 5 bytes each: two per file
    await f.close();
    expect(readFileSync(path, 'utf8')).toBe('5555\n');
    expect(readFileSync(`${path}.1`, 'utf8')).toBe('3333\n4444\n');
  });

  it('continues an existing file and counts its size', async () => {
    const path = join(tmp(), 'flows.log');
    const a = new RotatingFile({ path, maxBytes: 10 });
    a.write('1111');
    await a.close();
    const b = new RotatingFile({ path, maxBytes: 10 });
    b.write('2222');
    b.write('3333');
    await b.close();
    expect(readFileSync(`${path}.1`, 'utf8')).toBe('1111\n2222\n');
    expect(readFileSync(path, 'utf8')).toBe('3333\n');
  });

  it('drops what its queue cannot hold instead of growing', async () => {
    const path = join(tmp(), 'flows.log');
    const f = new RotatingFile({ path, maxBytes: 1 << 20, maxPendingBytes: 12 });
    const accepted = ['aaaaa', 'bbbbb', 'ccccc'].map((l) => f.write(l));
    expect(accepted).toEqual([true, true, false]);
    await f.close();
    expect(readFileSync(path, 'utf8')).toBe('aaaaa\nbbbbb\n');
  });

  it('reports a write it cannot do and keeps accepting', async () => {
    const d = tmp();
    const errors: unknown[] = [];
    // A directory where the file should be: open fails.
    const f = new RotatingFile({ path: d, maxBytes: 1024, onError: (e) => errors.push(e) });
    f.write('x');
    await f.drained();
    expect(errors.length).toBe(1);
    expect(f.write('y')).toBe(true);
    await f.close();
    expect(existsSync(`${d}.1`)).toBe(false);
  });
});
