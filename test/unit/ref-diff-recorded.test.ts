/**
 * The diffs operations record for the arrays they make (refDiff.ts `recordRefDiff`): what a
 * command's journal line and partial plan read instead of walking ten thousand
 * objects. Each must rebuild the new array from the old exactly, and describe no more than a
 * walk from scratch would.
 */
import v8 from 'node:v8';
import vm from 'node:vm';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { Dnat, Fip, Snat } from '../../src/model/rules.js';
import * as Ops from '../../src/state/operations.js';
import { refDiff } from '../../src/state/refDiff.js';
import { emptyState, type DesiredState } from '../../src/state/state.js';

const dnat = (k: number): Dnat => ({ eip: '172.20.0.10', port: 1000 + k, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 });
const fip = (k: number): Fip => ({ eip: `172.20.1.${k}`, internalIp: `10.0.2.${k}` });
const fipEip = (k: number): string => fip(k).eip;
const snat = (k: number): Snat => ({ eip: '172.20.0.10', cidr: `10.${k}.0.0/${16 + (k % 9)}`, randomFully: false });

type Step = readonly ['add' | 'del', 'dnat' | 'fip' | 'snat', readonly number[]];
const step: fc.Arbitrary<Step> = fc.tuple(
  fc.constantFrom('add' as const, 'del' as const),
  fc.constantFrom('dnat' as const, 'fip' as const, 'snat' as const),
  fc.array(fc.integer({ min: 0, max: 30 }), { minLength: 1, maxLength: 12 }),
);

function apply(s: DesiredState, [verb, kind, ks]: Step): DesiredState {
  if (kind === 'dnat') return (verb === 'add' ? Ops.addDnats(s, ks.map(dnat)) : Ops.delDnats(s, ks.map(dnat))).state;
  if (kind === 'fip') return (verb === 'add' ? Ops.addFips(s, ks.map(fip)) : Ops.delFips(s, ks.map(fipEip))).state;
  return (verb === 'add' ? Ops.addSnats(s, ks.map(snat)) : Ops.delSnats(s, ks.map(snat))).state;
}

function rebuilt<T>(before: readonly T[], d: { removed: readonly number[]; added: ReadonlyArray<readonly [number, T]> }): T[] {
  const gone = new Set(d.removed);
  const out = before.filter((_, i) => !gone.has(i));
  for (const [at, o] of d.added) out.splice(at, 0, o);
  return out;
}

describe('diffs recorded by the operations', () => {
  it('rebuild the new array exactly and are no larger than a walk from scratch', () => {
    fc.assert(
      fc.property(fc.array(step, { maxLength: 40 }), (steps) => {
        let s = emptyState('eth0', 'net1');
        for (const st of steps) {
          const next = apply(s, st);
          for (const k of ['dnats', 'fips', 'snats'] as const) {
            const before = s[k] as readonly object[];
            const after = next[k] as readonly object[];
            if (before === after) continue;
            const d = refDiff(before, after);
            // Fresh arrays of the same objects: nothing recorded for them, so a walk.
            const walked = refDiff([...before], [...after]);
            expect(d).not.toBeNull();
            if (!d || !walked) continue;
            const out = rebuilt(before, d);
            expect(out.length).toBe(after.length);
            expect(out.every((o, i) => o === after[i])).toBe(true);
            expect(d.removed.length + d.added.length).toBeLessThanOrEqual(walked.removed.length + walked.added.length);
          }
          s = next;
        }
      }),
      { numRuns: 300 },
    );
  });

  it('answer for the pair they were recorded for only', () => {
    const s0 = Ops.addDnats(emptyState('eth0', 'net1'), [dnat(1), dnat(2), dnat(3)]).state;
    const s1 = Ops.delDnats(s0, [dnat(2)]).state;
    expect(refDiff(s0.dnats, s1.dnats)).toEqual({ removed: [1], added: [] });
    // Another array as `before` (a copy holding one more object): walked, not the recorded answer.
    const other = [...s0.dnats, dnat(9)];
    expect(refDiff(other, s1.dnats)).toEqual({ removed: [1, 3], added: [] });
  });
});

describe('diffs recorded by the operations, in memory', () => {
  it('do not keep the arrays they start from alive (each state would hold every state before it)', async () => {
    v8.setFlagsFromString('--expose-gc');
    const gc = vm.runInNewContext('gc') as () => void;
    let s = Ops.addDnats(
      emptyState('eth0', 'net1'),
      Array.from({ length: 2000 }, (_, k) => dnat(k)),
    ).state;
    const first = new WeakRef(s.dnats);
    for (let k = 0; k < 20; k++) {
      const next = Ops.delDnats(Ops.addDnats(s, [dnat(5000 + k)]).state, [dnat(k)]).state;
      // The walk's own answer is kept too.
      refDiff(s.dnats, next.dnats);
      s = next;
    }
    // A WeakRef's target stays alive until the job that made or read it ends.
    await new Promise((r) => setImmediate(r));
    gc();
    expect(first.deref()).toBeUndefined();
    expect(s.dnats.length).toBe(2000);
  });
});
