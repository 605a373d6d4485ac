/**
 * safeParseDesired (the bulk shortcut) against desiredStateSchema.safeParse on generated
 * documents: the same acceptance, the same output to the byte (key order included), the same
 * issues. Elements are drawn near the boundary of "already canonical": upper-case protocols,
 * IPv6 in long form, host bits set, reordered or extra keys, out-of-range numbers, wrong types,
 * port ranges and SNAT pools, holes.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { canonicalJson, canonicalTextNative } from '../../src/model/canonical.js';
import { safeParseDesired } from '../../src/state/fastParse.js';
import { desiredStateSchema } from '../../src/state/state.js';

const ip = fc.oneof(
  fc.constantFrom('10.0.1.6', '172.20.0.10', '0.0.0.0', '255.255.255.255', '2001:db8::1', 'fd00::10'),
  fc.constantFrom('2001:DB8::1', '2001:db8:0:0:0:0:0:1', '010.0.0.1', '1.2.3', '10.0.1.256', '', 'x', '::ffff:1.2.3.4'),
  fc.ipV4(),
  fc.ipV6(),
);
const num = fc.oneof(fc.integer({ min: -2, max: 70000 }), fc.constantFrom(0, 1, 128, 129, 65535, 65536, 1.5, -0), fc.constant('80'));
const cidr = fc.oneof(
  fc.constantFrom('10.0.1.0/24', '10.0.1.1/24', '10.0.1.0/024', '10.0.1.1', '10.0.0.0/33', '2001:db8::/64', '2001:DB8::/64', '10.0.1.0/'),
  fc.tuple(fc.ipV4(), fc.integer({ min: 0, max: 32 })).map(([a, p]) => `${a}/${p}`),
);
const protocol = fc.constantFrom('tcp', 'udp', 'TCP', 'Udp', 'icmp', '', 6);

/** An object from [key, value] pairs, some keys dropped, an extra one or the order shuffled. */
function shaped(pairs: Record<string, fc.Arbitrary<unknown>>): fc.Arbitrary<unknown> {
  const keys = Object.keys(pairs);
  return fc
    .tuple(fc.record(pairs), fc.constantFrom('as-is', 'as-is', 'as-is', 'reversed', 'drop', 'extra'), fc.nat({ max: keys.length - 1 }))
    .map(([o, how, i]) => {
      const entries = Object.entries(o);
      if (how === 'reversed') entries.reverse();
      if (how === 'drop') entries.splice(i, 1);
      if (how === 'extra') entries.push(['extra', 1]);
      return Object.fromEntries(entries);
    });
}

const eip = shaped({ address: ip, prefixLength: num });
const snat = fc.oneof(
  shaped({ eip: ip, cidr, randomFully: fc.oneof(fc.boolean(), fc.constant('yes')) }),
  shaped({ eip: ip, cidr, randomFully: fc.boolean(), eips: fc.array(ip, { maxLength: 3 }) }),
);
const dnat = fc.oneof(
  shaped({ eip: ip, port: num, protocol, internalIp: ip, internalPort: num }),
  shaped({ eip: ip, port: num, portEnd: num, protocol, internalIp: ip, internalPort: num }),
);
const fip = shaped({ eip: ip, internalIp: ip });

const canonEip = fc.record({ address: fc.ipV4(), prefixLength: fc.integer({ min: 0, max: 128 }) });
const canonFip = fc.record({ eip: fc.ipV4(), internalIp: fc.ipV4() });
const canonDnat = fc.record({
  eip: fc.ipV4(),
  port: fc.integer({ min: 1, max: 65535 }),
  protocol: fc.constantFrom('tcp', 'udp'),
  internalIp: fc.ipV4(),
  internalPort: fc.integer({ min: 1, max: 65535 }),
});
const canonSnat = fc.record({ eip: fc.ipV4(), cidr: fc.constantFrom('10.0.1.0/24', '10.0.0.0/8', '192.168.1.7/32'), randomFully: fc.boolean() });

/** A canonical element with one field replaced by a value drawn from `odd` (same key, same place), its keys reordered, one dropped or one added. */
function nearly(canon: fc.Arbitrary<Record<string, unknown>>, odd: fc.Arbitrary<unknown>): fc.Arbitrary<unknown> {
  return fc.tuple(canon, odd, fc.nat(), fc.constantFrom('field', 'field', 'field', 'swap', 'drop', 'extra')).map(([c, o, i, how]) => {
    const keys = Object.keys(c);
    const k = keys[i % keys.length] as string;
    if (how === 'swap') return Object.fromEntries(Object.entries(c).reverse());
    if (how === 'drop') return Object.fromEntries(Object.entries(c).filter(([key]) => key !== k));
    if (how === 'extra') return { ...c, extra: 1 };
    const other = typeof o === 'object' && o !== null ? (o as Record<string, unknown>)[k] : undefined;
    return other === undefined ? o : { ...c, [k]: other };
  });
}

/** Mostly canonical collections (the shortcut's case), with one element just off it, or not an array at all. */
function collection(canon: fc.Arbitrary<Record<string, unknown>>, any: fc.Arbitrary<unknown>): fc.Arbitrary<unknown> {
  return fc.oneof(
    { weight: 3, arbitrary: fc.array(canon, { maxLength: 6 }) },
    { weight: 4, arbitrary: fc.tuple(fc.array(canon, { maxLength: 3 }), nearly(canon, any)).map(([a, x]) => [...a, x]) },
    { weight: 1, arbitrary: fc.array(any, { maxLength: 3 }) },
    { weight: 1, arbitrary: fc.constantFrom(undefined, null, 'x', {}, [undefined], [null]) },
  );
}

const document = fc
  .record({
    initialized: fc.oneof(fc.boolean(), fc.constant('no')),
    interfaces: fc.oneof(fc.constant({ vpc: 'eth0', ext: 'net1' }), fc.constant({ vpc: 'eth 0', ext: 'net1' })),
    eips: collection(canonEip, eip),
    snats: collection(canonSnat, snat),
    dnats: collection(canonDnat, dnat),
    fips: collection(canonFip, fip),
    routes: fc.oneof(fc.constant([]), fc.constant([{ cidr: '10.9.0.0/16', nexthop: '10.0.0.1' }]), fc.constant([{ cidr: 'bad', nexthop: 1 }])),
  })
  .map((d) => Object.fromEntries(Object.entries(d).filter(([, v]) => v !== undefined)));

describe('safeParseDesired', () => {
  it('accepts, outputs and refuses exactly as desiredStateSchema does', () => {
    fc.assert(
      fc.property(document, (doc) => {
        // Each side gets its own copy: the shortcut keeps canonical elements as given.
        const text = JSON.stringify(doc);
        const fast = safeParseDesired(JSON.parse(text));
        const slow = desiredStateSchema.safeParse(JSON.parse(text));
        expect(fast.success).toBe(slow.success);
        if (slow.success && fast.success) {
          expect(JSON.stringify(fast.data)).toBe(JSON.stringify(slow.data));
          // The digest's native text of the shortcut's output is the schema's output's.
          expect(canonicalTextNative(fast.data)).toBe(canonicalTextNative(slow.data));
          expect(canonicalTextNative(fast.data)).toBe(canonicalJson(JSON.parse(JSON.stringify(slow.data))));
        } else expect(JSON.stringify(fast.error?.issues)).toBe(JSON.stringify(slow.error?.issues));
      }),
      { numRuns: 3000 },
    );
  });

  it('keeps canonical elements and their arrays as given (no copy), and copies nothing else', () => {
    const dnats = [{ eip: '172.20.0.10', port: 80, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8080 }];
    const fips = [{ eip: '172.20.0.11', internalIp: '10.0.1.7' }];
    const r = safeParseDesired({ interfaces: { vpc: 'eth0', ext: 'net1' }, dnats, fips, snats: [{ eip: '172.20.0.10', cidr: '10.0.1.0/24' }] });
    expect(r.success).toBe(true);
    expect(r.data?.dnats).toBe(dnats);
    expect(r.data?.fips).toBe(fips);
    // randomFully missing: the schema's default, so the schema's path and a new object.
    expect(r.data?.snats).toEqual([{ eip: '172.20.0.10', cidr: '10.0.1.0/24', randomFully: false }]);
    expect(Object.keys(r.data ?? {})).toEqual(Object.keys(desiredStateSchema.parse({ interfaces: { vpc: 'eth0', ext: 'net1' } })));
  });

  it('reports an invalid element among canonical ones at its own index', () => {
    const dnats = Array.from({ length: 5 }, (_, i) => ({ eip: '172.20.0.10', port: 100 + i, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 }));
    dnats[3] = { ...dnats[3]!, port: 70000 };
    const r = safeParseDesired({ interfaces: { vpc: 'eth0', ext: 'net1' }, dnats });
    expect(r.success).toBe(false);
    expect(r.error?.issues[0]?.path).toEqual(['dnats', 3, 'port']);
  });
});
