/**
 * JSON with object keys sorted at every level: one text per value, whatever the key order
 * (equal states on two replicas give equal digests; a document written back equals the state
 * it came from). Pure: nothing is kept between calls.
 */
export function canonicalJson(v: unknown): string {
  if (v === null || typeof v !== 'object') return scalarText(v);
  if (Array.isArray(v)) {
    let text = '[';
    for (let i = 0; i < v.length; i++) {
      const x: unknown = v[i];
      if (i > 0) text += ',';
      text += x === undefined ? 'null' : canonicalJson(x);
    }
    return `${text}]`;
  }
  const o = v as Record<string, unknown>;
  const flat = flatText(o);
  if (flat !== undefined) return flat;
  let text = '{';
  let first = true;
  for (const k of sortedKeys(o)) {
    const x = o[k];
    if (x === undefined) continue;
    if (!first) text += ',';
    first = false;
    text += `${JSON.stringify(k)}:${canonicalJson(x)}`;
  }
  return `${text}}`;
}

/**
 * The text of a plain object whose values are all strings, finite numbers, booleans, null or
 * undefined (a rule): JSON.stringify with the sorted keys as its property list writes exactly
 * the canonical text, natively. Undefined for any other object.
 */
function flatText(o: Record<string, unknown>): string | undefined {
  if (Object.getPrototypeOf(o) !== Object.prototype) return undefined;
  for (const k in o) {
    const v = o[k];
    if (v !== null && v !== undefined && typeof v !== 'string' && typeof v !== 'boolean' && !(typeof v === 'number' && Number.isFinite(v))) return undefined;
  }
  return JSON.stringify(o, sortedKeys(o));
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

/** What JSON.stringify writes for a value that is not an object (`null` where it writes nothing). */
function scalarText(v: unknown): string {
  if (typeof v === 'number') return Number.isFinite(v) ? String(v) : 'null';
  return JSON.stringify(v) ?? 'null';
}

/** What a digest needs of a hash (node:crypto's Hash). */
export interface HashSink {
  update(data: string): unknown;
}

/**
 * Feed `canonicalJson(v)` to `hash` without building it whole: an object (a state) member by
 * member, each member (a collection of thousands of rules) written natively where it can be
 * (canonicalTextNative), so that at most one collection's text exists at a time. The bytes
 * hashed are exactly canonicalJson(v)'s (test/unit/canonical.test.ts).
 */
export function canonicalDigestInto(hash: HashSink, v: unknown): void {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) {
    hash.update(canonicalTextNative(v) ?? canonicalJson(v));
    return;
  }
  const o = v as Record<string, unknown>;
  let first = true;
  hash.update('{');
  for (const k of sortedKeys(o)) {
    const x = o[k];
    if (x === undefined) continue;
    hash.update(`${first ? '' : ','}${JSON.stringify(k)}:`);
    hash.update(canonicalTextNative(x) ?? canonicalJson(x));
    first = false;
  }
  hash.update('}');
}

/**
 * canonicalJson(v) written by one native JSON.stringify: a property list of every key the
 * value holds, sorted, makes JSON.stringify write each object's keys in the canonical order
 * (a third of the time of writing 20,000 rules one by one). Undefined where a property list
 * cannot stand for the definition: an object that is not plain, or a key Object.prototype also
 * has (`__proto__` would be read through to it).
 */
export function canonicalTextNative(v: unknown): string | undefined {
  const keys = new Set<string>();
  if (!collectKeys(v, keys)) return undefined;
  for (const k of keys) if (k in Object.prototype) return undefined;
  // Array#sort's default order is canonicalJson's: by UTF-16 code units.
  return JSON.stringify(v, [...keys].sort()) ?? 'null';
}

/** Every key of every object in `v` into `keys`; false at the first object that is not plain. */
function collectKeys(v: unknown, keys: Set<string>): boolean {
  if (v === null || typeof v !== 'object') return true;
  if (Array.isArray(v)) {
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
