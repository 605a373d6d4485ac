/**
 * Text derived from an immutable object, built once per object. Rule objects are kept across
 * states, so a collection of ten thousand is keyed and rendered on every command by lookups,
 * not string building.
 */
export function memoText<T extends object>(cache: WeakMap<T, string>, o: T, build: (o: T) => string): string {
  let v = cache.get(o);
  if (v === undefined) {
    v = build(o);
    cache.set(o, v);
  }
  return v;
}
