import { createHash } from 'node:crypto';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { canonicalDigestInto, canonicalJson, canonicalTextNative } from '../../src/model/canonical.js';
import { digestOf } from '../../src/api/stateDoc.js';
import { desiredStateSchema, type DesiredState } from '../../src/state/state.js';

/** The definition canonicalJson implements (and its first implementation): keys sorted, JSON.stringify for the rest. */
function reference(v: unknown): string {
  if (v === null || typeof v !== 'object') return JSON.stringify(v) ?? 'null';
  if (Array.isArray(v)) return `[${v.map((x: unknown) => (x === undefined ? 'null' : reference(x))).join(',')}]`;
  const o = v as Record<string, unknown>;
  const keys = Object.keys(o)
    .filter((k) => o[k] !== undefined)
    .sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${reference(o[k])}`).join(',')}}`;
}

const sha = (s: string) => createHash('sha256').update(s).digest('hex');

/** Values with odd keys and strings (escapes, surrogates, non-ASCII), nested a few levels. */
const value = fc.letrec((tie) => ({
  leaf: fc.oneof(
    fc.string(),
    fc.string({ unit: 'binary' }),
    fc.constantFrom('a"b', 'a\\b', '\u0000', '\n', '\ud800', '\udc00x', 'é', '\u2028'),
    fc.integer(),
    fc.double(),
    fc.boolean(),
    fc.constant(null),
    fc.constant(undefined),
  ),
  node: fc.oneof({ depthSize: 'small' }, tie('leaf'), tie('arr'), tie('obj')),
  arr: fc.array(tie('node'), { maxLength: 5 }),
  obj: fc.dictionary(fc.oneof(fc.string(), fc.constantFrom('eip', 'Eip', 'é', 'a"', '10', '2', '__proto')), tie('node'), { maxKeys: 6 }),
}));

describe('canonicalJson', () => {
  it('equals the reference definition on arbitrary values (fresh objects each time: nothing cached)', () => {
    fc.assert(
      fc.property(value.node, (v) => {
        expect(canonicalJson(v)).toBe(reference(v));
      }),
      { numRuns: 2000 },
    );
  });

  it('writes rules of changing shapes one after another (key orders, a shape the prefix of another)', () => {
    const shape = fc.array(fc.constantFrom('eip', 'port', 'b', 'a', '10', '2', 'é', 'x"'), { minLength: 0, maxLength: 5 }).map((ks) => [...new Set(ks)]);
    const flatValue = fc.oneof(fc.string(), fc.integer(), fc.boolean(), fc.constant(null), fc.constant(undefined), fc.double());
    fc.assert(
      fc.property(fc.array(fc.tuple(shape, fc.array(flatValue, { minLength: 5, maxLength: 5 })), { maxLength: 8 }), (rules) => {
        for (const [keys, values] of rules) {
          const o: Record<string, unknown> = {};
          keys.forEach((k, i) => (o[k] = values[i]));
          expect(canonicalJson(o)).toBe(reference(o));
        }
      }),
      { numRuns: 1000 },
    );
  });

  it('streams exactly the bytes of canonicalJson into the hash, at any size', () => {
    fc.assert(
      fc.property(fc.dictionary(fc.string(), fc.array(value.node, { maxLength: 400 }), { maxKeys: 4 }), (v) => {
        const h = createHash('sha256');
        canonicalDigestInto(h, v);
        expect(h.digest('hex')).toBe(sha(reference(v)));
      }),
      { numRuns: 200 },
    );
  });
});

describe('canonicalTextNative', () => {
  it('equals the reference definition on arbitrary values, or declines', () => {
    let written = 0;
    fc.assert(
      fc.property(value.node, (v) => {
        const text = canonicalTextNative(v);
        if (text === undefined) return;
        written++;
        expect(text).toBe(reference(v));
      }),
      { numRuns: 2000 },
    );
    // fast-check makes some objects without a prototype and some keys such as `constructor`: those decline.
    expect(written).toBeGreaterThan(800);
  });

  it('declines a key Object.prototype has, and an object that is not plain', () => {
    expect(canonicalTextNative(JSON.parse('[{"__proto__":{"a":1}},{"b":2}]'))).toBeUndefined();
    expect(canonicalTextNative([{ constructor: 1 }, { a: 2 }])).toBeUndefined();
    expect(canonicalTextNative({ a: new Date(0) })).toBeUndefined();
    expect(canonicalTextNative({ a: Object.create(null) })).toBeUndefined();
    expect(canonicalTextNative({ b: [{ z: 1, a: 'x' }], a: 1 })).toBe('{"a":1,"b":[{"a":"x","z":1}]}');
  });
});

describe('digestOf', () => {
  const bigState = (): DesiredState => {
    const n = 3000;
    return desiredStateSchema.parse({
      initialized: true,
      interfaces: { vpc: 'eth0', ext: 'net1' },
      eips: Array.from({ length: 60 }, (_, i) => ({ address: `192.0.2.${i + 1}`, prefixLength: 24 })),
      snats: Array.from({ length: 100 }, (_, i) => ({ eip: '192.0.2.1', cidr: `10.${i}.0.0/16`, randomFully: i % 2 === 0 })),
      dnats: Array.from({ length: n }, (_, i) => ({
        eip: `192.0.2.${(i % 60) + 1}`,
        port: 1000 + i,
        protocol: i % 2 ? 'udp' : 'tcp',
        internalIp: `10.1.${i >> 8}.${i & 255}`,
        internalPort: 80,
      })),
      fips: Array.from({ length: n }, (_, i) => ({ eip: `198.51.100.${i & 255}`, internalIp: `10.2.${i >> 8}.${i & 255}` })),
    });
  };

  it('is the sha256 of the canonical text of the whole state (the value replicas and If-Match compare)', () => {
    const s = bigState();
    expect(digestOf(s)).toBe(`sha256:${sha(reference(s))}`);
    // Of an equal state built anew, its keys in another order.
    const t = bigState();
    const u = { ...t, dnats: t.dnats.map((d) => Object.fromEntries(Object.entries(d).reverse()) as typeof d) };
    expect(digestOf(u)).toBe(digestOf(s));
  });

  it('is pinned: a fixed state has the digest earlier releases gave it', () => {
    const s = desiredStateSchema.parse({
      initialized: true,
      interfaces: { vpc: 'eth0', ext: 'net1' },
      eips: [{ address: '192.0.2.10', prefixLength: 24 }],
      snats: [{ eip: '192.0.2.10', cidr: '10.0.1.0/24', randomFully: true }],
      dnats: [{ eip: '192.0.2.10', port: 8080, protocol: 'tcp', internalIp: '10.0.1.5', internalPort: 80 }],
      fips: [{ eip: '192.0.2.11', internalIp: '10.0.1.6' }],
    });
    expect(digestOf(s)).toBe('sha256:f8ee64e32d75676b15167fe777ecc114da910a401743cf9ee5fe65b792f430e4');
  });
});
