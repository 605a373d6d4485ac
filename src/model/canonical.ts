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
    const flat = flatText(o);
    if (flat !== undefined) {
      texts.set(v, flat);
      return flat;
    }
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

// The key order of the last flat object written, and its keys sorted: a collection's rules
// share one shape, so the sort runs once per collection, not once per rule.
let lastKeys: string[] = [];
let lastSorted: string[] = [];

/**
 * The text of a plain object whose values are all strings, finite numbers, booleans, null or
 * undefined (a rule): JSON.stringify with the sorted keys as its property list writes exactly
 * the canonical text, natively, in a third of the time of writing it piece by piece. Undefined
 * for any other object.
 */
function flatText(o: Record<string, unknown>): string | undefined {
  if (Object.getPrototypeOf(o) !== Object.prototype) return undefined;
  let n = 0;
  let same = true;
  for (const k in o) {
    const v = o[k];
    if (v !== null && v !== undefined && typeof v !== 'string' && typeof v !== 'boolean' && !(typeof v === 'number' && Number.isFinite(v))) return undefined;
    if (same && k !== lastKeys[n]) same = false;
    n++;
  }
  if (!same || n !== lastKeys.length) {
    lastKeys = Object.keys(o);
    lastSorted = sortedKeys(o);
  }
  return JSON.stringify(o, lastSorted);
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
  new CanonicalFeed(hash, v).run(Infinity);
}

/**
 * canonicalDigestInto a slice of `slice` collection items at a time, whenever the event loop is
 * otherwise idle (setImmediate); the function returned writes whatever is left at once. A bulk
 * PUT /v1/state answers with the digest of the state it applied, and the texts of 20,000 new
 * objects are most of that digest: built and hashed while the process waits for `nft -f` or
 * `iptables-restore`, the answer only finishes the hash.
 */
export function canonicalDigestSoon(hash: HashSink, v: unknown, slice = 1000): () => void {
  const feed = new CanonicalFeed(hash, v);
  let done = false;
  const step = (): void => {
    if (done) return;
    done = feed.run(slice);
    if (!done) setImmediate(step);
  };
  setImmediate(step);
  return () => {
    if (!done) done = feed.run(Infinity);
  };
}

/**
 * The canonical text of a value as a list of pieces: texts, and collections whose items are
 * written by their own texts (built, and kept, only when their turn comes).
 */
class CanonicalFeed {
  private readonly tasks: Array<string | readonly unknown[]> = [];
  private t = 0;
  private i = 0;
  private buf = '';

  constructor(
    private readonly hash: HashSink,
    v: unknown,
  ) {
    this.plan(v, 2);
  }

  private plan(v: unknown, depth: number): void {
    const cached = v !== null && typeof v === 'object' ? texts.get(v) : undefined;
    if (depth === 0 || v === null || typeof v !== 'object' || cached !== undefined) {
      this.tasks.push(cached ?? canonicalJson(v));
    } else if (Array.isArray(v)) {
      this.tasks.push('[', v, ']');
    } else {
      const o = v as Record<string, unknown>;
      this.tasks.push('{');
      let first = true;
      for (const k of sortedKeys(o)) {
        const x = o[k];
        if (x === undefined) continue;
        this.tasks.push(first ? keyText(k) : `,${keyText(k)}`);
        first = false;
        this.plan(x, depth - 1);
      }
      this.tasks.push('}');
    }
  }

  /** Write up to `budget` collection items (and the pieces between them); true once all is hashed. */
  run(budget: number): boolean {
    let n = 0;
    while (this.t < this.tasks.length) {
      const task = this.tasks[this.t] as string | readonly unknown[];
      if (typeof task === 'string') {
        this.put(task);
        this.t++;
        continue;
      }
      while (this.i < task.length) {
        if (n++ >= budget) return false;
        const x: unknown = task[this.i];
        if (this.i > 0) this.put(',');
        this.put(x === undefined ? 'null' : canonicalJson(x));
        this.i++;
      }
      this.t++;
      this.i = 0;
    }
    if (this.buf.length > 0) {
      this.hash.update(this.buf);
      this.buf = '';
    }
    return true;
  }

  private put(s: string): void {
    this.buf += s;
    if (this.buf.length >= CHUNK) {
      this.hash.update(this.buf);
      this.buf = '';
    }
  }
}

/**
 * Collections a validator proved flat (src/state/fastParse.ts): every item a plain object with
 * exactly these keys, each value a string, number or boolean. canonicalTextNative takes their
 * keys from here instead of walking 21,000 objects of a bulk state (~12 ms beside the kernel's
 * tool), and writes them with these keys alone as the property list. A state is an immutable
 * value, so the proof holds for the array's life.
 */
const flatCollections = new WeakMap<readonly unknown[], { readonly keys: readonly string[]; readonly sorted: string[] }>();

export function provenFlat(items: readonly unknown[], keys: readonly string[]): void {
  // Array#sort's default order is canonicalJson's: by UTF-16 code units.
  flatCollections.set(items, { keys, sorted: [...keys].sort() });
}

/**
 * canonicalJson(v) written by native JSON.stringify, for a value none of whose parts has a kept
 * text yet (a bulk PUT's new state): a property list of every key the value holds, sorted, makes
 * JSON.stringify write each object's keys in the canonical order; a third of the time of
 * building 20,000 rule texts one by one, and none of them left for the collector. Undefined
 * where a property list cannot stand for the definition (an object that is not plain, or a key
 * Object.prototype also has: `__proto__` would be read through to it).
 *
 * An object (a state) is written member by member, so that a collection proven flat is written
 * with its own few keys as the property list: JSON.stringify looks every listed key up on every
 * object, and the state's ~20 keys for 21,000 rules of two to five was 5x slower (~30 ms beside
 * a bulk PUT's tool).
 */
export function canonicalTextNative(v: unknown): string | undefined {
  if (v === null || typeof v !== 'object' || Array.isArray(v) || Object.getPrototypeOf(v) !== Object.prototype) return nativeWhole(v);
  const o = v as Record<string, unknown>;
  let text = '{';
  let first = true;
  for (const k of sortedKeys(o)) {
    if (k in Object.prototype) return undefined;
    const x = o[k];
    if (x === undefined) continue;
    const flat = Array.isArray(x) ? flatCollections.get(x) : undefined;
    const member = flat !== undefined ? JSON.stringify(x, flat.sorted) : nativeWhole(x);
    if (member === undefined) return undefined;
    text += first ? keyText(k) : `,${keyText(k)}`;
    text += member;
    first = false;
  }
  return `${text}}`;
}

/** `v` by one JSON.stringify with every key it holds, sorted, as the property list; undefined where that cannot stand for canonicalJson. */
function nativeWhole(v: unknown): string | undefined {
  const keys = new Set<string>();
  if (!collectKeys(v, keys)) return undefined;
  for (const k of keys) if (k in Object.prototype) return undefined;
  // Array#sort's default order is canonicalJson's: by UTF-16 code units.
  return JSON.stringify(v, [...keys].sort());
}

/** Every key of every object in `v` into `keys`; false at the first object that is not plain. */
function collectKeys(v: unknown, keys: Set<string>): boolean {
  if (v === null || typeof v !== 'object') return true;
  if (Array.isArray(v)) {
    const flat = flatCollections.get(v);
    if (flat !== undefined) {
      for (let i = 0; i < flat.keys.length; i++) keys.add(flat.keys[i] as string);
      return true;
    }
    for (let i = 0; i < v.length; i++) if (!collectKeys(v[i], keys)) return false;
    return true;
  }
  if (Object.getPrototypeOf(v) !== Object.prototype) return false;
  const o = v as Record<string, unknown>;
  for (const k in o) {
    keys.add(k);
    if (!collectKeys(o[k], keys)) return false;
  }
  return true;
}

/**
 * The digest of a state that is mostly new objects (a bulk PUT /v1/state): its canonical text
 * written natively at the next turn of the event loop (while the kernel applies), then hashed;
 * the function returned finishes it at once if that turn has not come. The texts kept per
 * object (what later digests of a slightly changed state reuse) are built only once that
 * function was called (the answer is on its way), a slice per turn: built while the kernel
 * applies they took the CPU the kernel's tool was waiting for.
 */
export function canonicalDigestBulk(hash: HashSink, v: unknown, slice = 1000): () => void {
  let done = false;
  let native = false;
  const run = (): void => {
    if (done) return;
    done = true;
    const text = canonicalTextNative(v);
    if (text === undefined) canonicalDigestInto(hash, v);
    else {
      native = true;
      for (let i = 0; i < text.length; i += CHUNK) hash.update(text.slice(i, i + CHUNK));
    }
  };
  setImmediate(run);
  let finished = false;
  return () => {
    run();
    if (finished || !native) return;
    finished = true;
    setImmediate(() => keepTexts(v, slice));
  };
}

/** canonicalJson of each item of `v`'s collections (kept), `slice` items per turn of the event loop. */
function keepTexts(v: unknown, slice: number): void {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return;
  const items: unknown[] = [];
  for (const x of Object.values(v as Record<string, unknown>)) if (Array.isArray(x)) items.push(...x);
  let at = 0;
  const step = (): void => {
    const end = Math.min(items.length, at + slice);
    for (; at < end; at++) canonicalJson(items[at]);
    if (at < items.length) setImmediate(step);
  };
  step();
}

/** Items looked at per collection by mostlyWithoutTexts. */
const SAMPLE = 64;

/**
 * Whether most items of `v`'s collections have no kept text yet (canonicalDigestBulk then costs
 * less). Judged on at most SAMPLE items of each collection, evenly spaced: it only picks which of
 * two ways writes the same digest, and 21,000 WeakMap look-ups were ~3 ms before a bulk PUT's tool.
 */
export function mostlyWithoutTexts(v: unknown): boolean {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return false;
  let items = 0;
  let kept = 0;
  for (const x of Object.values(v as Record<string, unknown>)) {
    if (!Array.isArray(x) || x.length === 0) continue;
    const step = Math.max(1, Math.floor(x.length / SAMPLE));
    let seen = 0;
    let has = 0;
    for (let i = 0; i < x.length; i += step) {
      const item: unknown = x[i];
      seen++;
      if (item !== null && typeof item === 'object' && texts.has(item)) has++;
    }
    // Weighted by the collection's size, as counting every item would.
    items += x.length;
    kept += (has / seen) * x.length;
  }
  return kept * 2 < items;
}
