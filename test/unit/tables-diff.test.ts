/**
 * The one differ of both netfilter backends (src/dataplane/netfilter/tables/diff.ts), pure:
 * which kernel rules stay (patience sorting, a longest common subsequence when keys are unique),
 * which go, where the missing ones go in, the rewrite choice, and set elements. Each backend's
 * rendering of these operations is tested with it (core-iptables-plan, nft-render).
 */
import { describe, expect, it } from 'vitest';
import { diffChain, diffSet, diffTable, keepRules, type ChainEdit } from '../../src/dataplane/netfilter/tables/diff.js';

/** Apply an edit to `have` as a kernel would: the result must be exactly `want`. */
function applied(have: readonly (string | null)[], want: readonly string[], edit: ChainEdit): (string | null)[] {
  if (edit.kind === 'rewrite') return [...want];
  const gone = new Set(edit.deletes);
  // Kept rules carry their kernel index, so an insert can find its anchor.
  const chain: Array<{ key: string | null; at?: number }> = have.flatMap((key, at) => (gone.has(at) ? [] : [{ key, at }]));
  for (const { rule, before } of edit.inserts) {
    const i = chain.findIndex((r) => r.at === before);
    expect(i).not.toBe(-1);
    chain.splice(i, 0, { key: want[rule] as string });
  }
  for (const key of want.slice(edit.appendFrom)) chain.push({ key });
  return chain.map((r) => r.key);
}

describe('diffChain', () => {
  it('nothing to do when both sides agree, including both empty', () => {
    expect(diffChain(['a', 'b'], ['a', 'b'])).toEqual({ kind: 'edit', deletes: [], inserts: [], appendFrom: 2 });
    expect(diffChain([], [])).toEqual({ kind: 'edit', deletes: [], inserts: [], appendFrom: 0 });
  });

  it('an empty kernel chain: every rule appended; an empty desired chain: every rule deleted', () => {
    expect(diffChain([], ['a', 'b'])).toEqual({ kind: 'edit', deletes: [], inserts: [], appendFrom: 0 });
    expect(diffChain(['a', null, 'b'], [])).toEqual({ kind: 'edit', deletes: [0, 1, 2], inserts: [], appendFrom: 0 });
  });

  it('a missing rule goes in before the kept rule that follows it, or at the end', () => {
    expect(diffChain(['b', 'c'], ['a', 'b', 'c'])).toEqual({ kind: 'edit', deletes: [], inserts: [{ rule: 0, before: 0 }], appendFrom: 3 });
    expect(diffChain(['a', 'c'], ['a', 'b', 'c'])).toEqual({ kind: 'edit', deletes: [], inserts: [{ rule: 1, before: 1 }], appendFrom: 3 });
    expect(diffChain(['a', 'b'], ['a', 'b', 'c'])).toEqual({ kind: 'edit', deletes: [], inserts: [], appendFrom: 2 });
    // Between kept rules and after the last: one insert, two appends.
    expect(diffChain(['b', 'd'], ['a', 'b', 'c', 'd', 'e', 'f'])).toEqual({
      kind: 'edit',
      deletes: [],
      inserts: [
        { rule: 0, before: 0 },
        { rule: 2, before: 1 },
      ],
      appendFrom: 4,
    });
  });

  it('unrecognised kernel rules (null) always go, even where the desired rule sits', () => {
    expect(diffChain([null, 'a', null], ['a'])).toEqual({ kind: 'edit', deletes: [0, 2], inserts: [], appendFrom: 1 });
  });

  it('a reordered chain: the longest run in order stays, the rest is deleted and re-inserted', () => {
    const edit = diffChain(['c', 'a', 'b'], ['a', 'b', 'c']);
    expect(edit).toEqual({ kind: 'edit', deletes: [0], inserts: [], appendFrom: 2 });
    expect(applied(['c', 'a', 'b'], ['a', 'b', 'c'], edit)).toEqual(['a', 'b', 'c']);
  });

  it('rewriteMoved: a rule both sides hold that cannot stay in place rewrites the chain', () => {
    expect(diffChain(['c', 'a', 'b'], ['a', 'b', 'c'], { rewriteMoved: true })).toEqual({ kind: 'rewrite' });
    // Only extra and missing rules: still element-level.
    expect(diffChain(['a', 'x', 'c'], ['a', 'b', 'c'], { rewriteMoved: true }).kind).toBe('edit');
  });

  it('a duplicated kernel rule: the first copy stays, surplus copies go', () => {
    expect(diffChain(['a', 'b', 'a'], ['a', 'b'])).toEqual({ kind: 'edit', deletes: [2], inserts: [], appendFrom: 2 });
    expect(diffChain(['a', 'a', 'a'], ['a'])).toEqual({ kind: 'edit', deletes: [1, 2], inserts: [], appendFrom: 1 });
    const edit = diffChain(['b', 'a', 'a'], ['a', 'b']);
    expect(applied(['b', 'a', 'a'], ['a', 'b'], edit)).toEqual(['a', 'b']);
  });

  it('rewrites when more than 64 rules go and they outnumber those that stay', () => {
    const rules = (n: number, p: string) => Array.from({ length: n }, (_, i) => `${p}${i}`);
    expect(diffChain(rules(65, 'old'), rules(65, 'new')).kind).toBe('rewrite');
    expect(diffChain(rules(64, 'old'), rules(64, 'new')).kind).toBe('edit');
    // 65 go but 100 stay: element-level.
    expect(diffChain([...rules(100, 'keep'), ...rules(65, 'old')], rules(100, 'keep')).kind).toBe('edit');
  });

  it('applying the edit gives exactly the desired chain (random cases, with duplicates and unrecognised rules)', () => {
    let seed = 99;
    const r = () => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff;
      return seed / 0x80000000;
    };
    for (let n = 0; n < 1000; n++) {
      const pick = () => 'abcdefg'[Math.floor(r() * 7)] as string;
      const want = [...new Set(Array.from({ length: Math.floor(r() * 7) }, pick))];
      const have = Array.from({ length: Math.floor(r() * 9) }, () => (r() < 0.15 ? null : pick()));
      for (const opts of [{}, { rewriteMoved: true }]) {
        const edit = diffChain(have, want, opts);
        expect(applied(have, want, edit), JSON.stringify({ have, want, edit })).toEqual(want);
      }
    }
  });
});

describe('diffSet', () => {
  const set = (entries: Array<[string, string | undefined]>) => ({ elements: new Map(entries) });

  it('deletes what is stale, adds what is missing, and a changed value is both', () => {
    const edit = diffSet(
      set([
        ['a', '1'],
        ['b', '2'],
        ['c', '3'],
      ]),
      set([
        ['b', '2'],
        ['c', '4'],
        ['d', '5'],
      ]),
    );
    expect(edit).toEqual({ deletes: ['a', 'c'], adds: ['c', 'd'] });
  });

  it('plain sets (no values) and empty sides', () => {
    expect(diffSet(set([['a', undefined]]), set([['a', undefined]]))).toEqual({ deletes: [], adds: [] });
    expect(diffSet(set([]), set([['a', undefined]]))).toEqual({ deletes: [], adds: ['a'] });
    expect(diffSet(set([['a', undefined]]), set([]))).toEqual({ deletes: ['a'], adds: [] });
  });
});

describe('diffTable', () => {
  it('every desired chain and set in order, new ones marked, stale ones named', () => {
    const have = {
      chains: new Map([
        ['B', { rules: ['x'] }],
        ['OLD', { rules: [] }],
      ]),
      sets: new Map([['s', { elements: new Map([['k', 'v']]) }]]),
    };
    const want = {
      chains: new Map([
        ['A', { rules: ['a'] }],
        ['B', { rules: ['x', 'y'] }],
      ]),
      sets: new Map([
        ['s', { elements: new Map([['k', 'w']]) }],
        ['t', { elements: new Map() }],
      ]),
    };
    expect(diffTable(have, want)).toEqual({
      chains: [
        { name: 'A', create: true, edit: { kind: 'edit', deletes: [], inserts: [], appendFrom: 0 } },
        { name: 'B', create: false, edit: { kind: 'edit', deletes: [], inserts: [], appendFrom: 1 } },
      ],
      sets: [
        { name: 's', edit: { deletes: ['k'], adds: ['k'] } },
        { name: 't', edit: null },
      ],
      staleChains: ['OLD'],
      staleSets: [],
      rehooked: [],
    });
  });

  it('names a chain whose base hook differs, or that has one on one side only', () => {
    const hook = { type: 'nat', hook: 'prerouting', priority: -100, policy: 'accept' };
    const table = (chains: Array<[string, { base?: typeof hook; rules: string[] }]>) => ({ chains: new Map(chains), sets: new Map() });
    const want = table([
      ['pre', { base: hook, rules: [] }],
      ['same', { base: hook, rules: [] }],
      ['plain', { rules: [] }],
      ['new', { base: hook, rules: [] }],
    ]);
    const have = table([
      ['pre', { base: { ...hook, priority: 0 }, rules: [] }],
      ['same', { base: { ...hook }, rules: [] }],
      ['plain', { base: hook, rules: [] }],
    ]);
    expect(diffTable(have, want).rehooked).toEqual(['pre', 'plain']);
  });
});

describe('keepRules', () => {
  it('keepRules keeps the longest common subsequence; unrecognised rules never match', () => {
    expect(keepRules(['a', 'b', 'c'], ['a', 'b', 'c'])).toEqual([
      [0, 0],
      [1, 1],
      [2, 2],
    ]);
    expect(keepRules(['a', 'x', 'c'], ['a', 'b', 'c'])).toEqual([
      [0, 0],
      [2, 2],
    ]);
    expect(keepRules(['c', 'a', 'b'], ['a', 'b', 'c'])).toEqual([
      [1, 0],
      [2, 1],
    ]);
    expect(keepRules([null, 'a'], ['a'])).toEqual([[1, 0]]);
    expect(keepRules(['a', 'a'], ['a'])).toEqual([[0, 0]]);
    expect(keepRules([], ['a'])).toEqual([]);
  });

  /** Deterministic PRNG (mulberry32): a failing case reproduces from its seed. */
  const rng = (seed: number) => () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const shuffle = <T>(xs: T[], r: () => number): T[] => {
    for (let i = xs.length - 1; i > 0; i--) {
      const j = Math.floor(r() * (i + 1));
      [xs[i], xs[j]] = [xs[j] as T, xs[i] as T];
    }
    return xs;
  };
  /** The reference: LCS length by the textbook table. */
  const lcsLength = (a: readonly (string | null)[], d: readonly string[]): number => {
    let prev = new Array<number>(d.length + 1).fill(0);
    for (const x of a) {
      const row = [0];
      d.forEach((y, j) => row.push(x !== null && x === y ? (prev[j] as number) + 1 : Math.max(prev[j + 1] as number, row[j] as number)));
      prev = row;
    }
    return prev[d.length] as number;
  };
  /** A matching diffChain can use: strictly increasing on both sides, equal keys, never null. */
  const expectValid = (pairs: Array<[number, number]>, a: readonly (string | null)[], d: readonly string[]): void => {
    pairs.forEach(([i, j], k) => {
      expect(a[i]).not.toBeNull();
      expect(a[i]).toBe(d[j]);
      if (k > 0) {
        const [pi, pj] = pairs[k - 1] as [number, number];
        expect(i).toBeGreaterThan(pi);
        expect(j).toBeGreaterThan(pj);
      }
    });
  };

  it('keeps as many rules as a longest common subsequence when keys are unique', () => {
    const r = rng(20240611);
    const alphabet = 'abcdefghij'.split('');
    for (let n = 0; n < 2000; n++) {
      const desired = shuffle([...alphabet], r).slice(0, Math.floor(r() * 9));
      const actual: (string | null)[] = shuffle([...alphabet], r).slice(0, Math.floor(r() * 9));
      // Foreign rules scattered anywhere, including inside the common prefix and suffix.
      for (let k = Math.floor(r() * 3); k > 0; k--) actual.splice(Math.floor(r() * (actual.length + 1)), 0, null);
      // Half the cases share a prefix and a suffix, so the fast path is exercised too.
      if (r() < 0.5) {
        actual.unshift('p');
        desired.unshift('p');
        actual.push('s');
        desired.push('s');
      }
      const kept = keepRules(actual, desired);
      expectValid(kept, actual, desired);
      expect(kept.length, JSON.stringify({ actual, desired })).toBe(lcsLength(actual, desired));
    }
  });

  it('with duplicated rules keeps the first copy in between, and stays a valid matching', () => {
    expect(keepRules(['b', 'a', 'a'], ['a', 'c'])).toEqual([[1, 0]]);
    expect(keepRules(['x', 'a', 'b', 'a'], ['b', 'a', 'a'])).toEqual([
      [2, 0],
      [3, 2],
    ]);
    const r = rng(7);
    for (let n = 0; n < 500; n++) {
      const pick = (): string => 'abc'[Math.floor(r() * 3)] as string;
      const desired = Array.from({ length: Math.floor(r() * 7) }, pick);
      const actual = Array.from({ length: Math.floor(r() * 7) }, () => (r() < 0.15 ? null : pick()));
      expectValid(keepRules(actual, desired), actual, desired);
    }
  });

  it('handles 20,000 rules reversed or shuffled without a quadratic table', () => {
    const desired = Array.from({ length: 20_000 }, (_, i) => `rule ${i}`);
    const reversed = [...desired].reverse();
    const kept = keepRules(reversed, desired);
    expectValid(kept, reversed, desired);
    // A reversed chain has no two rules in the right order: exactly one can stay.
    expect(kept).toHaveLength(1);

    const shuffled = shuffle([...desired], rng(1));
    const keptShuffled = keepRules(shuffled, desired);
    expectValid(keptShuffled, shuffled, desired);
    // A random permutation of n has an increasing run near 2√n (≈ 283 here).
    expect(keptShuffled.length).toBeGreaterThan(100);

    // One rule moved from the end to the front: all the others stay.
    const moved = [desired[19_999] as string, ...desired.slice(0, 19_999)];
    expect(keepRules(moved, desired)).toHaveLength(19_999);
  });
});
