/**
 * A value (a rule's text, its rendering) derived from an immutable object, built once per
 * object. Rule objects are kept across states, so a collection of ten thousand is keyed and
 * rendered on every command by lookups, not string building.
 */
export function memoOf<T extends object, V>(cache: WeakMap<T, V>, o: T, build: (o: T) => V): V {
  let v = cache.get(o);
  if (v === undefined) {
    v = build(o);
    cache.set(o, v);
  }
  return v;
}
