/**
 * refDiff's limit: a caller that only wants small changes (the incremental sort) gets the same
 * answer as without a limit when the change fits, and null otherwise, without the cost of
 * describing a bulk change it would throw away.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { refDiff } from '../../src/state/refDiff.js';

const size = (d: { removed: readonly number[]; added: readonly unknown[] }): number => d.removed.length + d.added.length;

/** Objects kept, removed, inserted and sometimes swapped: the shapes operations produce, and worse. */
const change = fc
  .tuple(fc.integer({ min: 0, max: 60 }), fc.array(fc.tuple(fc.nat(), fc.constantFrom('drop', 'insert', 'replace', 'swap')), { maxLength: 40 }))
  .map(([n, edits]) => {
    const before = Array.from({ length: n }, (_, i) => ({ i }));
    const after = [...before];
    for (const [at, how] of edits) {
      const k = after.length === 0 ? 0 : at % after.length;
      if (how === 'drop' && after.length > 0) after.splice(k, 1);
      else if (how === 'insert') after.splice(k, 0, { i: -1 });
      else if (how === 'replace' && after.length > 0) after[k] = { i: -2 };
      else if (how === 'swap' && after.length > 1) [after[0], after[k]] = [after[k]!, after[0]!];
    }
    return { before, after };
  });

describe('refDiff with a limit', () => {
  it('is the unlimited answer when that fits the limit, null otherwise', () => {
    fc.assert(
      fc.property(change, fc.integer({ min: 0, max: 70 }), ({ before, after }, limit) => {
        const full = refDiff(before, after);
        const limited = refDiff(before, after, limit);
        expect(limited).toEqual(full && size(full) <= limit ? full : null);
      }),
      { numRuns: 2000 },
    );
  });

  it('rebuilds after from before when it answers', () => {
    fc.assert(
      fc.property(change, ({ before, after }) => {
        const d = refDiff(before, after, 64);
        if (!d) return;
        const gone = new Set(d.removed);
        const out = before.filter((_, i) => !gone.has(i));
        for (const [at, o] of d.added) out.splice(at, 0, o);
        expect(out).toEqual(after);
        expect(out.every((o, i) => o === after[i])).toBe(true);
      }),
    );
  });
});
