/**
 * Found by the soak (scripts/soak.ts): after a daemon was killed while appending to the
 * journal, its torn last line stayed in the file; the next appended change was glued to it,
 * failed to verify, and was lost — with every later change — at the next load, which every
 * full sync does. The store must not append after a torn line.
 */
import { appendFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { StateStore } from '../../src/state/store.js';
import { emptyState } from '../../src/state/state.js';
import * as Ops from '../../src/state/operations.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});
const dnat = (port: number) => ({ eip: '172.20.0.10', port, protocol: 'tcp' as const, internalIp: '10.0.1.6', internalPort: 80 });

describe('a journal with a torn last line', () => {
  it.each([
    ['a torn line without its newline', '0123abcd {"lists":{"dn'],
    ['a whole line that does not verify', `${'0'.repeat(64)} {"lists":{}}\n`],
  ])('keeps every change acknowledged after %s', async (_what, torn) => {
    const dir = mkdtempSync(path.join(tmpdir(), 'natgw-torn-'));
    dirs.push(dir);
    const s0 = { ...emptyState('eth0', 'net1'), initialized: true };
    const first = new StateStore(dir);
    await first.save(s0);
    const s1 = Ops.addDnat(s0, dnat(1)).state;
    await first.begin(s0, s1).commit();
    appendFileSync(first.journalFile, torn); // the crash

    // The restarted process: what was acknowledged survives, the torn text does not count.
    const second = new StateStore(dir);
    const loaded = (await second.load())!;
    expect(loaded.dnats.map((d) => d.port)).toEqual([1]);
    let state = loaded;
    for (const port of [2, 3]) {
      const next = Ops.addDnat(state, dnat(port)).state;
      await second.begin(state, next).commit();
      state = next;
    }
    // Any later load (a restart, or the full sync that reloads the state) sees all three.
    expect((await new StateStore(dir).load())!.dnats.map((d) => d.port)).toEqual([1, 2, 3]);
  });
});
