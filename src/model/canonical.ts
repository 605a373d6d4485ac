/**
 * JSON with object keys sorted at every level: one text per value, whatever the key order
 * (equal states on two replicas give equal digests; a document written back equals the state
 * it came from).
 *
 * The desired state and everything in it are immutable values, and most of a new state is
 * objects and collections of the one before: so each object's text is built once and kept with
 * it, and a digest of ten thousand rules after a change costs the changed ones.
 */
const texts = new WeakMap<object, string>();

export function canonicalJson(v: unknown): string {
  if (v === null || typeof v !== 'object') return JSON.stringify(v) ?? 'null';
  const cached = texts.get(v);
  if (cached !== undefined) return cached;
  let text: string;
  if (Array.isArray(v)) {
    text = `[${v.map((x: unknown) => (x === undefined ? 'null' : canonicalJson(x))).join(',')}]`;
  } else {
    const o = v as Record<string, unknown>;
    const keys = Object.keys(o)
      .filter((k) => o[k] !== undefined)
      .sort();
    text = `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`).join(',')}}`;
  }
  texts.set(v, text);
  return text;
}
