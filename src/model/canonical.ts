/**
 * JSON with object keys sorted at every level: one text per value, whatever the key order
 * (equal states on two replicas give equal digests; a document written back equals the state
 * it came from).
 *
 * The desired state and everything in it are immutable values, and most of a new state is
 * objects of the one before: so each object's text is built once and kept with it, and a digest
 * of ten thousand rules after a change costs the changed ones. The whole state's text and its
 * collections' texts are never built (canonicalDigestInto streams them into the hash): 1.5 MiB
 * each at 20,000 objects, copies that only fed a digest and then sat in the old generation.
 */
const texts = new WeakMap<object, string>();
/** `"key":` per key name: a handful of names, written once per object each. */
const keyTexts = new Map<string, string>();

export function canonicalJson(v: unknown): string {
  if (v === null || typeof v !== 'object') return scalarText(v);
  const cached = texts.get(v);
  if (cached !== undefined) return cached;
  let text: string;
  if (Array.isArray(v)) {
    text = '[';
    for (let i = 0; i < v.length; i++) {
      const x: unknown = v[i];
      if (i > 0) text += ',';
      text += x === undefined ? 'null' : canonicalJson(x);
    }
    text += ']';
  } else {
    const o = v as Record<string, unknown>;
    const keys = sortedKeys(o);
    text = '{';
    let first = true;
    for (let i = 0; i < keys.length; i++) {
      const k = keys[i] as string;
      const x = o[k];
      if (x === undefined) continue;
      if (!first) text += ',';
      first = false;
      text += keyText(k);
      text += canonicalJson(x);
    }
    text += '}';
  }
  texts.set(v, text);
  return text;
}

/**
 * Object.keys sorted as Array.prototype.sort sorts them (by UTF-16 code units): an insertion
 * sort in place, since a rule has two to seven keys and the default sort is built for many.
 */
function sortedKeys(o: object): string[] {
  const keys = Object.keys(o);
  for (let i = 1; i < keys.length; i++) {
    const k = keys[i] as string;
    let j = i - 1;
    while (j >= 0 && (keys[j] as string) > k) {
      keys[j + 1] = keys[j] as string;
      j--;
    }
    keys[j + 1] = k;
  }
  return keys;
}

function keyText(k: string): string {
  let t = keyTexts.get(k);
  if (t === undefined) {
    t = `${JSON.stringify(k)}:`;
    // Keys are the schemas' few field names; a document's stray keys must not grow this forever.
    if (keyTexts.size < 256) keyTexts.set(k, t);
  }
  return t;
}

/** What JSON.stringify writes for a value that is not an object (`null` where it writes nothing). */
function scalarText(v: unknown): string {
  if (typeof v === 'string') return plain(v) ? `"${v}"` : JSON.stringify(v);
  if (typeof v === 'number') return Number.isFinite(v) ? String(v) : 'null';
  if (typeof v === 'boolean') return v ? 'true' : 'false';
  return JSON.stringify(v) ?? 'null';
}

/** A string JSON.stringify would only quote: no control character, quote, backslash or surrogate. */
function plain(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x20 || c === 0x22 || c === 0x5c || (c >= 0xd800 && c <= 0xdfff)) return false;
  }
  return true;
}

/** What a digest needs of a hash (node:crypto's Hash). */
export interface HashSink {
  update(data: string): unknown;
}

/** Texts are handed to the hash in pieces of about this many characters (young-generation sized). */
const CHUNK = 16 * 1024;

/**
 * Feed `canonicalJson(v)` to `hash` without building it: the value and its direct children
 * (the state and its collections) are written piece by piece, deeper values (the rules) by
 * their kept texts. The bytes hashed are exactly canonicalJson(v)'s (test/unit/canonical.test.ts).
 */
export function canonicalDigestInto(hash: HashSink, v: unknown): void {
  const w = { hash, buf: '' };
  stream(w, v, 2);
  if (w.buf.length > 0) hash.update(w.buf);
}

interface Writer {
  readonly hash: HashSink;
  buf: string;
}

function put(w: Writer, s: string): void {
  w.buf += s;
  if (w.buf.length >= CHUNK) {
    w.hash.update(w.buf);
    w.buf = '';
  }
}

function stream(w: Writer, v: unknown, depth: number): void {
  if (depth === 0 || v === null || typeof v !== 'object') return put(w, canonicalJson(v));
  const cached = texts.get(v);
  if (cached !== undefined) return put(w, cached);
  if (Array.isArray(v)) {
    put(w, '[');
    for (let i = 0; i < v.length; i++) {
      const x: unknown = v[i];
      if (i > 0) put(w, ',');
      if (x === undefined) put(w, 'null');
      else stream(w, x, depth - 1);
    }
    put(w, ']');
    return;
  }
  const o = v as Record<string, unknown>;
  const keys = sortedKeys(o);
  put(w, '{');
  let first = true;
  for (const k of keys) {
    const x = o[k];
    if (x === undefined) continue;
    if (!first) put(w, ',');
    first = false;
    put(w, keyText(k));
    stream(w, x, depth - 1);
  }
  put(w, '}');
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
