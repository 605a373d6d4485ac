/**
 * PURE: how `after` differs from `before`, by reference: what left (indexes in `before`,
 * ascending) and what came in (index in `after`, object; ascending). Removing the one and
 * inserting the other in that order rebuilds `after` exactly.
 *
 * Operations keep untouched objects and their order, and mostly append or filter, so a walk
 * of both arrays side by side finds the change in O(n) pointer comparisons. A change the walk
 * describes badly (an object inserted in the middle reads as the rest being removed and added
 * again) falls back to matching by reference through a map; null when even that cannot
 * describe it (kept objects changed their order), or when the description would exceed
 * `limit` entries (a caller that only wants small changes stops early on a bulk one).
 */
export interface RefDiff<T> {
  readonly removed: readonly number[];
  readonly added: ReadonlyArray<readonly [number, T]>;
}

export function refDiff<T>(before: readonly T[], after: readonly T[], limit = Number.POSITIVE_INFINITY): RefDiff<T> | null {
  if (before === after) return { removed: [], added: [] };
  const k = known.get(after);
  if (k && k.before.deref() === before && k.beforeLength === before.length && k.afterLength === after.length) {
    return k.diff.removed.length + k.diff.added.length <= limit ? (k.diff as RefDiff<T>) : null;
  }
  const grown = Math.abs(after.length - before.length);
  // Every description removes or adds at least the difference in length.
  if (grown > limit) return null;
  const walked = walk(before, after, 8 + 2 * grown);
  const d = walked ? (walked.removed.length + walked.added.length <= limit ? walked : null) : matched(before, after, limit);
  if (d) remember(before, after, d);
  return d;
}

/**
 * The diffs already known, by the array they lead to: one command's change is asked for by the
 * journal, the partial plan and the incremental sorts, each a walk of ten
 * thousand objects, and the operations that build a new array know it without a walk
 * (recordRefDiff). Arrays of a state are values, never changed once made; the lengths are
 * checked all the same. Only command-sized diffs are kept: a bulk change's would hold its
 * whole description as long as the state lives. The array a diff starts from is held weakly:
 * held strongly, each state's arrays would keep the previous state's alive, and those the one
 * before, every state since the start (the daemon grew by ~100 MiB over a bench's commands).
 */
const known = new WeakMap<readonly unknown[], { before: WeakRef<readonly unknown[]>; beforeLength: number; afterLength: number; diff: RefDiff<unknown> }>();
const KNOWN_MAX = 64;

function remember<T>(before: readonly T[], after: readonly T[], diff: RefDiff<T>): void {
  if (diff.removed.length + diff.added.length <= KNOWN_MAX)
    known.set(after, { before: new WeakRef(before), beforeLength: before.length, afterLength: after.length, diff });
}

/** `after` was made from `before` by exactly `diff` (removing, then inserting, as refDiff describes). */
export function recordRefDiff<T>(before: readonly T[], after: readonly T[], diff: RefDiff<T>): void {
  remember(before, after, diff);
}

/** The side-by-side walk; null as soon as it describes the change with more than `max` entries. */
function walk<T>(before: readonly T[], after: readonly T[], max: number): RefDiff<T> | null {
  const removed: number[] = [];
  const added: Array<readonly [number, T]> = [];
  let i = 0;
  let j = 0;
  while (i < before.length && j < after.length) {
    if (removed.length + added.length > max) return null;
    if (before[i] === after[j]) {
      i++;
      j++;
    } else if (i + 1 < before.length && j + 1 < after.length && before[i + 1] === after[j + 1]) {
      // One object replaced in place (a changed target, a new prefix length).
      removed.push(i++);
      added.push([j, after[j] as T]);
      j++;
    } else if (j + 1 < after.length && before[i] === after[j + 1]) {
      // One inserted (a SNAT rule at its place in prefix order).
      added.push([j, after[j] as T]);
      j++;
    } else {
      removed.push(i++);
    }
  }
  while (i < before.length) removed.push(i++);
  while (j < after.length) {
    added.push([j, after[j] as T]);
    j++;
  }
  return removed.length + added.length > max ? null : { removed, added };
}

/** Matching by reference; null when kept objects changed their order or the change exceeds `limit`. */
function matched<T>(before: readonly T[], after: readonly T[], limit: number): RefDiff<T> | null {
  if (!mayShare(before, after, limit)) return null;
  const oldIndex = new Map<T, number>();
  before.forEach((o, i) => oldIndex.set(o, i));
  const kept = new Set<number>();
  const added: Array<readonly [number, T]> = [];
  let lastKept = -1;
  for (let i = 0; i < after.length; i++) {
    const o = after[i] as T;
    const at = oldIndex.get(o);
    if (at === undefined || kept.has(at)) {
      added.push([i, o]);
      if (added.length > limit) return null;
      continue;
    }
    if (at < lastKept) return null;
    lastKept = at;
    kept.add(at);
  }
  const removed: number[] = [];
  for (let i = 0; i < before.length; i++) if (!kept.has(i)) removed.push(i);
  return removed.length + added.length > limit ? null : { removed, added };
}

/**
 * False when `after` cannot be `before` with at most `limit` objects in and out, found without
 * indexing `before` (a bulk change of fresh objects, at every start and new document): of
 * after[0..limit] at least one is kept, and a kept after[k] sits at most at before[k + limit].
 */
function mayShare<T>(before: readonly T[], after: readonly T[], limit: number): boolean {
  if (after.length <= limit) return true;
  for (let k = 0; k <= limit; k++) {
    const o = after[k];
    const end = Math.min(before.length, k + limit + 1);
    for (let i = 0; i < end; i++) if (before[i] === o) return true;
  }
  return false;
}
