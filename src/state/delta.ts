import type { DesiredState } from './state.js';
import { refDiff } from './refDiff.js';

/**
 * PURE: the change between two desired states, small enough to append to a journal on every
 * command (persisting a 20,000-object document per command would cost more than the kernel
 * transaction itself).
 *
 * Operations keep the objects they do not touch (same references, same relative order), so a
 * collection's change is found by reference (refDiff.ts). Replaying removes, then inserts in
 * ascending index order, which rebuilds the new array exactly; where kept objects changed
 * their order `stateDelta` answers null (the caller then writes a whole snapshot instead).
 */

export const COLLECTIONS = ['eips', 'snats', 'dnats', 'fips', 'shareDnats', 'routes', 'eipQos', 'qos', 'neighbours'] as const;
export type Collection = (typeof COLLECTIONS)[number];

const SCALARS = ['schema', 'initialized', 'interfaces', 'defaultRoutes'] as const;
type Scalar = (typeof SCALARS)[number];

export interface CollectionDelta {
  /** Indexes in the old array, ascending. */
  readonly del: readonly number[];
  /** [index in the new array, object], ascending by index. */
  readonly add: ReadonlyArray<readonly [number, unknown]>;
}

export interface StateDelta {
  readonly set?: Partial<Pick<DesiredState, Scalar>>;
  readonly lists?: Partial<Record<Collection, CollectionDelta>>;
}

/** How many objects a delta adds or removes (the journal compacts when deltas grow large). */
export function deltaSize(d: StateDelta): number {
  let n = 0;
  for (const c of Object.values(d.lists ?? {})) n += c.del.length + c.add.length;
  return n;
}

export function isEmptyDelta(d: StateDelta): boolean {
  return d.set === undefined && d.lists === undefined;
}

function collectionDelta(before: readonly unknown[], after: readonly unknown[]): CollectionDelta | null {
  const d = refDiff(before, after);
  return d && { del: d.removed, add: d.added };
}

/** The change from `before` to `after`; null when only a snapshot can express it. */
export function stateDelta(before: DesiredState, after: DesiredState): StateDelta | null {
  const set: Partial<Record<Scalar, unknown>> = {};
  let anySet = false;
  for (const k of SCALARS) {
    if (before[k] !== after[k] && JSON.stringify(before[k]) !== JSON.stringify(after[k])) {
      set[k] = after[k];
      anySet = true;
    }
  }
  const lists: Partial<Record<Collection, CollectionDelta>> = {};
  let anyList = false;
  for (const k of COLLECTIONS) {
    if (before[k] === after[k]) continue;
    const d = collectionDelta(before[k], after[k]);
    if (d === null) return null;
    if (d.del.length === 0 && d.add.length === 0) continue;
    lists[k] = d;
    anyList = true;
  }
  return {
    ...(anySet ? { set: set as StateDelta['set'] } : {}),
    ...(anyList ? { lists } : {}),
  };
}

/** Replay a delta; throws when it does not fit `base` (the journal is then not trusted). */
export function applyDelta(base: DesiredState, d: StateDelta): DesiredState {
  const next: Record<string, unknown> = { ...base, ...(d.set ?? {}) };
  for (const [k, cd] of Object.entries(d.lists ?? {}) as Array<[Collection, CollectionDelta]>) {
    const old = base[k] as readonly unknown[];
    const gone = new Set(cd.del);
    for (const i of cd.del) if (i < 0 || i >= old.length) throw new Error(`journal: ${k} has no object at ${i}`);
    const kept = old.filter((_, i) => !gone.has(i));
    // A merge, not one splice per object: a bulk change stays linear.
    const out: unknown[] = [];
    let a = 0;
    let j = 0;
    while (a < cd.add.length || j < kept.length) {
      const add = cd.add[a];
      if (add && add[0] === out.length) {
        out.push(add[1]);
        a++;
      } else if (j < kept.length) {
        out.push(kept[j++]);
      } else {
        throw new Error(`journal: ${k} cannot take an object at ${add?.[0] ?? '?'}`);
      }
    }
    next[k] = out;
  }
  return next as DesiredState;
}
