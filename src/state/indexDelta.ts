import type { DesiredState } from './state.js';

/**
 * The journal line of an older natgw: a change described by position (indexes removed from the
 * old array; [index, object] inserted into the new one). A state dir written by it is read
 * once by these lines and then folded into a snapshot (StateStore.replayJournal); nothing
 * writes them any more.
 */
interface IndexDelta {
  readonly set?: Partial<DesiredState>;
  readonly lists?: Readonly<Record<string, { readonly del: readonly number[]; readonly add: ReadonlyArray<readonly [number, unknown]> }>>;
}

/** Whether a journal record is of that older format (its collections say `add`, by index). */
export function isIndexDelta(r: unknown): r is IndexDelta {
  const lists = (r as { lists?: Record<string, object> } | null)?.lists;
  return (
    lists !== undefined &&
    Object.values(lists).some((c) => 'add' in c || (Array.isArray((c as { del?: unknown[] }).del) && typeof (c as { del: unknown[] }).del[0] === 'number'))
  );
}

/** Replay one such line; throws when it does not fit `base` (the journal is then not trusted). */
export function applyIndexDelta(base: DesiredState, d: IndexDelta): DesiredState {
  const next: Record<string, unknown> = { ...base, ...(d.set ?? {}) };
  for (const [k, cd] of Object.entries(d.lists ?? {})) {
    const old = base[k as keyof DesiredState] as readonly unknown[];
    const gone = new Set(cd.del);
    for (const i of cd.del) if (i < 0 || i >= old.length) throw new Error(`journal: ${k} has no object at ${i}`);
    const out = old.filter((_, i) => !gone.has(i));
    for (const [i, x] of cd.add) {
      if (i > out.length) throw new Error(`journal: ${k} cannot take an object at ${i}`);
      out.splice(i, 0, x);
    }
    next[k] = out;
  }
  return next as DesiredState;
}
