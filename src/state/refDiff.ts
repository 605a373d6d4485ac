/**
 * PURE: how `after` differs from `before`, by reference: what left (indexes in `before`,
 * ascending) and what came in (index in `after`, object; ascending). Removing the one and
 * inserting the other in that order rebuilds `after` exactly.
 *
 * Operations keep untouched objects and their order, and mostly append or filter, so a walk
 * of both arrays side by side finds the change in O(n) pointer comparisons. A change the walk
 * describes badly (an object inserted in the middle reads as the rest being removed and added
 * again) falls back to matching by reference through a map; null when even that cannot
 * describe it (kept objects changed their order).
 */
export interface RefDiff<T> {
  readonly removed: readonly number[];
  readonly added: ReadonlyArray<readonly [number, T]>;
}

export function refDiff<T>(before: readonly T[], after: readonly T[]): RefDiff<T> | null {
  if (before === after) return { removed: [], added: [] };
  const walked = walk(before, after);
  const size = walked.removed.length + walked.added.length;
  if (size <= 8 + 2 * Math.abs(after.length - before.length)) return walked;
  return matched(before, after);
}

function walk<T>(before: readonly T[], after: readonly T[]): RefDiff<T> {
  const removed: number[] = [];
  const added: Array<readonly [number, T]> = [];
  let i = 0;
  let j = 0;
  while (i < before.length && j < after.length) {
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
  return { removed, added };
}

function matched<T>(before: readonly T[], after: readonly T[]): RefDiff<T> | null {
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
      continue;
    }
    if (at < lastKept) return null;
    lastKept = at;
    kept.add(at);
  }
  const removed: number[] = [];
  for (let i = 0; i < before.length; i++) if (!kept.has(i)) removed.push(i);
  return { removed, added };
}
