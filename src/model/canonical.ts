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

/**
 * Build the texts of the items of `collections` a slice at a time, whenever the event loop is
 * otherwise idle (setImmediate). A bulk PUT /v1/state answers with the digest of the state it
 * applied, and the texts of 20,000 new objects are most of that digest: built while the
 * process waits for `nft -f` or `iptables-restore`, they are looked up afterwards instead.
 */
export function canonicalizeSoon(collections: ReadonlyArray<readonly unknown[]>, slice = 1000): void {
  let c = 0;
  let i = 0;
  const step = (): void => {
    for (let n = 0; n < slice && c < collections.length; ) {
      const items = collections[c] as readonly unknown[];
      if (i >= items.length) {
        // The collection's own text too: joining ten thousand item texts is no small part.
        canonicalJson(items);
        c++;
        i = 0;
        continue;
      }
      canonicalJson(items[i++]);
      n++;
    }
    if (c < collections.length) setImmediate(step);
  };
  setImmediate(step);
}
