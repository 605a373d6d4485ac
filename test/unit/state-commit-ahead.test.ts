/**
 * StateStore.begin: a command's journal line written before the kernel applies, synced
 * meanwhile. Once committed a fresh load sees the change; discarded (the kernel refused it) the
 * journal is byte for byte what it was, a fresh load does not see it, and the next commit
 * appends as if it had never been written. A large change is a new snapshot instead.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { StateStore } from '../../src/state/store.js';
import { emptyState, type DesiredState } from '../../src/state/state.js';
import * as Ops from '../../src/state/operations.js';
import type { Dnat } from '../../src/model/rules.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

const dnat = (i: number): Dnat => ({ eip: '172.20.0.10', port: 1000 + i, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 });

/** A store holding a snapshot of `n` DNATs, loaded under its lock as the engine does. */
async function seeded(n: number): Promise<{ store: StateStore; state: DesiredState }> {
  const dir = mkdtempSync(path.join(tmpdir(), 'natgw-ahead-'));
  dirs.push(dir);
  const store = new StateStore(dir);
  let state: DesiredState = { ...emptyState('eth0', 'net1'), initialized: true };
  for (let i = 0; i < n; i++) state = Ops.addDnats(state, [dnat(i)]).state;
  await store.withLock(() => store.save(state));
  return { store, state };
}

const fresh = (s: StateStore) => new StateStore(s.dir).load();
const journal = (s: StateStore) => (existsSync(s.journalFile) ? readFileSync(s.journalFile, 'utf8') : undefined);

describe('StateStore.begin', () => {
  it('a committed line is loaded by a fresh process; a discarded one leaves the journal as it was', async () => {
    const { store, state } = await seeded(20);
    await store.withLock(async () => {
      const one = Ops.addDnats(state, [dnat(100)]).state;
      const a = store.begin(state, one);
      expect(a.bulk).toBe(false);
      await a.commit();
      expect(await fresh(store)).toEqual(one);
      const before = journal(store);

      const two = Ops.addDnats(one, [dnat(101)]).state;
      const b = store.begin(one, two);
      // Written, not yet answered: a load of this boot does not count it.
      expect(journal(store)).not.toBe(before);
      expect(await fresh(store)).toEqual(one);
      expect(await b.discard()).toBe(true);
      expect(journal(store)).toBe(before);
      expect(await fresh(store)).toEqual(one);

      // The next change appends after the first line, as if the discarded one had never been.
      const three = Ops.addDnats(one, [dnat(102)]).state;
      await store.begin(one, three).commit();
      expect(await fresh(store)).toEqual(three);
    });
  });

  it('a discarded first line of a journal leaves none that a load replays', async () => {
    const { store, state } = await seeded(20);
    await store.withLock(async () => {
      await store.load();
      const one = Ops.addDnats(state, [dnat(100)]).state;
      expect(await store.begin(state, one).discard()).toBe(true);
      expect(await fresh(store)).toEqual(state);
      const two = Ops.addDnats(state, [dnat(101)]).state;
      await store.begin(state, two).commit();
      expect(await fresh(store)).toEqual(two);
    });
  });

  it('writes nothing for no change, and a snapshot for a large one or onto a snapshot not its own', async () => {
    const { store, state } = await seeded(20);
    await store.withLock(async () => {
      const before = journal(store);
      await store.begin(state, state).commit();
      expect(journal(store)).toBe(before);
      let bulk = state;
      for (let i = 0; i < 200; i++) bulk = Ops.addDnats(bulk, [dnat(500 + i)]).state;
      const big = store.begin(state, bulk);
      expect(big.bulk).toBe(true);
      expect(journal(store)).toBe(before);
      await big.commit();
      expect(journal(store)).toBeUndefined();
      expect(await fresh(store)).toEqual(bulk);
    });
    // A store that has no sealed snapshot of its own (nothing loaded or written) writes one.
    const other = new StateStore(store.dir);
    const c = other.begin(state, Ops.addDnats(state, [dnat(100)]).state);
    expect(c.bulk).toBe(true);
    expect(await c.discard()).toBe(true);
  });
});

describe('StateStore.begin: a line not yet answered', () => {
  it('is dropped by a load of this boot (and cut off under the lock), counted once committed', async () => {
    const { store, state } = await seeded(20);
    await store.withLock(async () => {
      const one = Ops.addDnats(state, [dnat(100)]).state;
      await store.begin(state, one).commit();
      const confirmed = journal(store);
      expect(await fresh(store)).toEqual(one);

      // The process "dies" before the mark: the line, written as begin() returns, stays in the file, unanswered.
      const two = Ops.addDnats(one, [dnat(101)]).state;
      store.begin(one, two);
      expect(journal(store)).not.toBe(confirmed);
      expect(await fresh(store)).toEqual(one);
    });
    // The next holder's load cuts it off, so that a line appended later cannot make it count.
    const next = new StateStore(store.dir);
    const loaded = await next.withLock(() => next.load());
    expect(loaded?.dnats.length).toBe(21);
    await next.withLock(async () => {
      const three = Ops.addDnats(loaded as DesiredState, [dnat(102)]).state;
      await next.begin(loaded as DesiredState, three).commit();
      expect((await fresh(next))?.dnats.map((d) => d.port)).not.toContain(1101);
      expect((await fresh(next))?.dnats.map((d) => d.port)).toContain(1102);
    });
  });

  it('from another boot, a line without its mark counts (the mark may have been lost with the page cache)', async () => {
    const { store, state } = await seeded(20);
    await store.withLock(async () => {
      const one = Ops.addDnats(state, [dnat(100)]).state;
      store.begin(state, one);
      expect(await fresh(store)).toEqual(state);
    });
    const text = journal(store) ?? '';
    writeFileSync(store.journalFile, text.replace(/^~[0-9a-f-]+ /m, '~00000000-0000-0000-0000-000000000000 '));
    expect((await fresh(store))?.dnats.length).toBe(21);
  });
});
