import { z } from 'zod';
import type { DesiredState } from './state.js';
import { dnatKey, eipKey, fipKey, prefixOf, routeKey, snatKey } from '../model/rules.js';
import { eipQosKey, gwQosKey } from '../model/qos.js';
import { neighbourKey } from '../model/neighbour.js';

/**
 * PURE: what a change did to the desired state, as data (kube-proxy's change trackers): per
 * collection, each object it touched under its identity key (SPEC.md: a DNAT's eip, port and
 * protocol, a FIP's eip, ...), with the object before (absent: added) and after (absent:
 * removed); and the scalar fields it set. Operations return it beside the new state; the
 * engine hands it to the parts (what a partial sync plans) and to the journal (what it appends).
 *
 * Where an object sits follows one rule, which the operations keep and `applyRecords` replays:
 * a removed object goes, an updated one keeps its place, an added one goes to the end (a SNAT
 * after the last rule of its prefix length or longer: SPEC §2 snat-add). An object removed and
 * added again in one change (`moved`) leaves its place and goes where an add puts it.
 */

export const COLLECTIONS = ['eips', 'snats', 'dnats', 'fips', 'shareDnats', 'routes', 'eipQos', 'qos', 'neighbours'] as const;
export type Collection = (typeof COLLECTIONS)[number];

const SCALARS = ['schema', 'initialized', 'interfaces', 'defaultRoutes'] as const;
export type Scalar = (typeof SCALARS)[number];

export type Item<K extends Collection> = DesiredState[K][number];

export interface Touched<T> {
  readonly before?: T;
  readonly after?: T;
  readonly moved?: boolean;
}

type Lists = { readonly [K in Collection]?: ReadonlyMap<string, Touched<Item<K>>> };

export interface StateChange {
  readonly scalars: Partial<Pick<DesiredState, Scalar>>;
  readonly lists: Lists;
}

/** Each collection's identity key (SPEC.md). */
const KEYS: { readonly [K in Collection]: (x: Item<K>) => string } = {
  eips: eipKey,
  snats: snatKey,
  dnats: dnatKey,
  fips: fipKey,
  shareDnats: dnatKey,
  routes: routeKey,
  eipQos: eipQosKey,
  qos: gwQosKey,
  neighbours: neighbourKey,
};

export const NO_CHANGE: StateChange = { scalars: {}, lists: {} };

/** How many objects the change touches. */
export function changeSize(c: StateChange): number {
  let n = 0;
  for (const m of Object.values(c.lists)) n += m.size;
  return n;
}

export const isNoChange = (c: StateChange): boolean => Object.keys(c.scalars).length === 0 && changeSize(c) === 0;

/** Whether the change touches any of `fields`. */
export function touches(c: StateChange, ...fields: readonly (Collection | Scalar)[]): boolean {
  return fields.some((f) => (f in c.scalars ? true : ((c.lists as Record<string, ReadonlyMap<string, unknown>>)[f]?.size ?? 0) > 0));
}

/** A collection's change as lists: added, removed, and updated (before and after). */
export function split<K extends Collection>(
  c: StateChange,
  k: K,
): { added: Item<K>[]; removed: Item<K>[]; updated: Array<{ before: Item<K>; after: Item<K> }> } {
  const added: Item<K>[] = [];
  const removed: Item<K>[] = [];
  const updated: Array<{ before: Item<K>; after: Item<K> }> = [];
  for (const t of (c.lists[k] as ReadonlyMap<string, Touched<Item<K>>> | undefined)?.values() ?? []) {
    if (t.before === undefined && t.after !== undefined) added.push(t.after);
    else if (t.after === undefined && t.before !== undefined) removed.push(t.before);
    else if (t.before !== undefined && t.after !== undefined) updated.push({ before: t.before, after: t.after });
  }
  return { added, removed, updated };
}

/** One collection's change: objects removed, updated in place, and added (in the order an add places them). */
export function listChange<K extends Collection>(
  k: K,
  parts: { removed?: readonly Item<K>[]; updated?: ReadonlyArray<readonly [Item<K>, Item<K>]>; added?: readonly Item<K>[] },
): StateChange {
  const key = KEYS[k] as (x: Item<K>) => string;
  const m = new Map<string, Touched<Item<K>>>();
  for (const x of parts.removed ?? []) m.set(key(x), { before: x });
  for (const [before, after] of parts.updated ?? []) m.set(key(after), { before, after });
  for (const x of parts.added ?? []) m.set(key(x), { after: x });
  return m.size === 0 ? NO_CHANGE : { scalars: {}, lists: { [k]: m } };
}

/** The scalar fields of `after` that differ from `before`'s. */
export function scalarChange(before: DesiredState, after: DesiredState): StateChange['scalars'] {
  const out: Record<string, unknown> = {};
  for (const k of SCALARS) if (!sameValue(before[k], after[k])) out[k] = after[k];
  return out;
}

/** Whether two plain values are equal, whatever their objects' key order (an absent key equals an undefined one). */
export function sameValue(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null || Array.isArray(a) !== Array.isArray(b)) return false;
  const x = a as Record<string, unknown>;
  const y = b as Record<string, unknown>;
  const keys = Object.keys(x).filter((k) => x[k] !== undefined);
  if (keys.length !== Object.keys(y).filter((k) => y[k] !== undefined).length) return false;
  return keys.every((k) => sameValue(x[k], y[k]));
}

/** `a`, then `b`: per identity, the object before `a` and the object after `b`. */
export function compose(a: StateChange, b: StateChange): StateChange {
  if (isNoChange(a)) return b;
  if (isNoChange(b)) return a;
  const lists: Record<string, ReadonlyMap<string, Touched<unknown>>> = { ...a.lists };
  for (const [k, bm] of Object.entries(b.lists) as Array<[Collection, ReadonlyMap<string, Touched<unknown>>]>) {
    const m = new Map(lists[k]);
    for (const [key, t] of bm) {
      const p = m.get(key);
      if (!p) {
        m.set(key, t);
        continue;
      }
      const before = p.before;
      const after = t.after;
      // An add after a removal of the same identity, or a move: the object goes where adds go.
      const appends = t.before === undefined || t.moved === true;
      if (before === undefined && after === undefined) {
        m.delete(key);
        continue;
      }
      const moved = before !== undefined && after !== undefined && (appends || p.moved === true);
      const entry: Touched<unknown> = { ...(before !== undefined ? { before } : {}), ...(after !== undefined ? { after } : {}), ...(moved ? { moved } : {}) };
      // An entry that now appends takes its turn among the adds at the end; one updated in place keeps its turn.
      if (appends) m.delete(key);
      m.set(key, entry);
    }
    if (m.size) lists[k] = m;
    else delete lists[k];
  }
  return { scalars: { ...a.scalars, ...b.scalars }, lists: lists as Lists };
}

/**
 * The change from `before` to `after` by identity key (a declarative document, PUT /v1/state):
 * one pass with a Map per collection. An object whose value differs is updated; where the kept
 * objects of a collection changed their relative order, they are all moved, so that replaying
 * the change (applyRecords) gives exactly `after` (for SNATs, the order decides between rules
 * of one prefix length).
 */
export function diffStates(before: DesiredState, after: DesiredState): StateChange {
  const lists: Record<string, Map<string, Touched<unknown>>> = {};
  for (const k of COLLECTIONS) {
    const a = before[k] as readonly object[];
    const b = after[k] as readonly object[];
    // An array of a state is a value, never changed once made: the same array holds the same objects.
    if (a === b) continue;
    const key = KEYS[k] as (x: object) => string;
    const old = new Map<string, object>();
    for (const x of a) old.set(key(x), x);
    const m = new Map<string, Touched<unknown>>();
    const kept: string[] = [];
    for (const x of b) {
      const id = key(x);
      const was = old.get(id);
      if (was === undefined) m.set(id, { after: x });
      else {
        old.delete(id);
        kept.push(id);
        if (!sameValue(was, x)) m.set(id, { before: was, after: x });
      }
    }
    for (const [id, x] of old) m.set(id, { before: x });
    if (!sameOrder(a.map(key), kept)) {
      const byKey = new Map(b.map((x) => [key(x), x] as const));
      for (const x of a) {
        const id = key(x);
        const now = byKey.get(id);
        if (now !== undefined) {
          m.delete(id);
          m.set(id, { before: x, after: now, moved: true });
        }
      }
      // Re-placed in `after`'s order (a SNAT after the last of its prefix length or longer).
      const order = new Map(b.map((x, i) => [key(x), i] as const));
      const sorted = [...m].sort(([x], [y]) => (order.get(x) ?? -1) - (order.get(y) ?? -1));
      m.clear();
      for (const [id, t] of sorted) m.set(id, t);
    }
    if (m.size) lists[k] = m;
  }
  return { scalars: scalarChange(before, after), lists: lists as Lists };
}

/** Whether the keys of `all` that are in `kept` come in `kept`'s order. */
function sameOrder(all: readonly string[], kept: readonly string[]): boolean {
  const wanted = new Set(kept);
  let i = 0;
  for (const id of all) if (wanted.has(id) && kept[i++] !== id) return false;
  return true;
}

/**
 * A change as the journal keeps it: per collection the identities that leave (`del`: removed
 * or moved) and the objects put (`put`: replacing an object of the same identity in place, or
 * added where an add goes). Replaying records in order rebuilds the state the change made.
 */
export interface ChangeRecord {
  readonly set?: Partial<Pick<DesiredState, Scalar>>;
  readonly lists?: { readonly [K in Collection]?: { readonly del?: readonly string[]; readonly put?: readonly Item<K>[] } };
}

/**
 * The shape a journal line must have to be replayed. A line of any other shape (one of an
 * earlier, unreleased build, which described changes by index) is not read: the journal is then
 * not trusted from that line on, as for a line that does not verify.
 */
const changeRecordSchema = z.strictObject({
  set: z.partialRecord(z.enum(SCALARS), z.unknown()).optional(),
  lists: z.partialRecord(z.enum(COLLECTIONS), z.strictObject({ del: z.array(z.string()).optional(), put: z.array(z.looseObject({})).optional() })).optional(),
});

/** `value` as a ChangeRecord, or undefined where it is not one. The objects are kept as read. */
export function asChangeRecord(value: unknown): ChangeRecord | undefined {
  return changeRecordSchema.safeParse(value).success ? (value as ChangeRecord) : undefined;
}

export function recordOf(c: StateChange): ChangeRecord {
  const lists: Record<string, { del?: string[]; put?: unknown[] }> = {};
  for (const [k, m] of Object.entries(c.lists) as Array<[Collection, ReadonlyMap<string, Touched<unknown>>]>) {
    const del: string[] = [];
    const put: unknown[] = [];
    for (const [key, t] of m) {
      if (t.after === undefined || t.moved) del.push(key);
      if (t.after !== undefined) put.push(t.after);
    }
    lists[k] = { ...(del.length ? { del } : {}), ...(put.length ? { put } : {}) };
  }
  return { ...(Object.keys(c.scalars).length ? { set: c.scalars } : {}), ...(Object.keys(lists).length ? { lists } : {}) };
}

/**
 * `base` with `records` replayed in order. Each collection a record touches is held as a Map
 * by identity while they replay (its insertion order is the collection's order), so a journal
 * of many lines costs one pass over each collection, not one per line.
 */
export function applyRecords(base: DesiredState, records: Iterable<ChangeRecord>): DesiredState {
  const out: Record<string, unknown> = { ...base };
  const held = new Map<Collection, Map<string, unknown>>();
  const snats = { list: undefined as Array<Item<'snats'>> | undefined };
  for (const r of records) {
    Object.assign(out, r.set ?? {});
    for (const [k, cr] of Object.entries(r.lists ?? {}) as Array<[Collection, { del?: string[]; put?: unknown[] }]>) {
      if (k === 'snats') {
        snats.list ??= [...base.snats];
        applySnats(snats.list, cr.del ?? [], (cr.put ?? []) as Array<Item<'snats'>>);
        continue;
      }
      let m = held.get(k);
      if (!m) {
        const key = KEYS[k] as (x: unknown) => string;
        m = new Map((base[k] as readonly unknown[]).map((x) => [key(x), x] as const));
        held.set(k, m);
      }
      for (const id of cr.del ?? []) m.delete(id);
      const key = KEYS[k] as (x: unknown) => string;
      for (const x of cr.put ?? []) m.set(key(x), x);
    }
  }
  for (const [k, m] of held) out[k] = [...m.values()];
  if (snats.list) out.snats = snats.list;
  return out as DesiredState;
}

/** SNATs keep their order by prefix length (SPEC §2): a new rule goes after its equals. */
function applySnats(list: Array<Item<'snats'>>, del: readonly string[], put: ReadonlyArray<Item<'snats'>>): void {
  const gone = new Set(del);
  if (gone.size) {
    const kept = list.filter((x) => !gone.has(snatKey(x)));
    list.length = 0;
    list.push(...kept);
  }
  for (const n of put) {
    const at = list.findIndex((x) => snatKey(x) === snatKey(n));
    if (at !== -1) list[at] = n;
    else insertSnat(list, n);
  }
}

/** Insert `n` after the last rule of its prefix length or longer. */
export function insertSnat(list: Array<Item<'snats'>>, n: Item<'snats'>): void {
  const len = prefixOf(n.cidr);
  const at = list.findIndex((x) => prefixOf(x.cidr) < len);
  list.splice(at === -1 ? list.length : at, 0, n);
}
