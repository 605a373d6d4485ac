import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { normaliseDesired } from '../../src/api/stateDoc.js';
import { dnatKey } from '../../src/model/rules.js';
import { desiredStateSchema, type DesiredState } from '../../src/state/state.js';

type Dnats = DesiredState['dnats'];

/** The definition: the first index whose dnatKey an earlier DNAT has. */
function reference(dnats: Dnats): [number, number] | null {
  const seen = new Map<string, number>();
  for (let i = 0; i < dnats.length; i++) {
    const k = dnatKey(dnats[i] as Dnats[number]);
    const first = seen.get(k);
    if (first !== undefined) return [first, i];
    seen.set(k, i);
  }
  return null;
}

// Few values per field, so that identities collide often, ranges and single ports mixed.
const dnat = fc
  .record({
    eip: fc.constantFrom('192.0.2.1', '192.0.2.2', '2001:db8::1'),
    port: fc.constantFrom(1, 80, 81, 65534),
    portEnd: fc.option(fc.constantFrom(81, 90, 65535), { nil: undefined }),
    protocol: fc.constantFrom('tcp' as const, 'udp' as const),
    internalIp: fc.constantFrom('10.0.0.1', '10.0.0.2'),
    internalPort: fc.constantFrom(80, 8080),
  })
  .map(({ portEnd, ...d }) => (portEnd !== undefined && portEnd > d.port ? { ...d, portEnd } : d));

/** The pair of places normaliseDesired names for a duplicate DNAT identity; null when it accepts them. */
function refusedPair(dnats: Dnats): [number, number] | null {
  try {
    // Past the schema (the generator mixes families): the identity check alone is asked.
    normaliseDesired({ ...desiredStateSchema.parse({ initialized: true, interfaces: { vpc: 'eth0', ext: 'net1' } }), dnats });
  } catch (e) {
    const m = /^dnats\[(\d+)\]: duplicate .*\(also at \[(\d+)\]\)$/.exec((e as Error).message);
    if (m) return [Number(m[2]), Number(m[1])];
  }
  return null;
}

describe('duplicate DNATs in a whole state', () => {
  it('are refused for the first index whose dnatKey an earlier DNAT has, naming both', () => {
    fc.assert(
      fc.property(fc.array(dnat, { maxLength: 12 }), (dnats) => {
        expect(refusedPair(dnats as Dnats)).toEqual(reference(dnats as Dnats));
      }),
      { numRuns: 3000 },
    );
  });

  it('is what a whole state with a twin DNAT is refused for, naming both places', () => {
    const s = desiredStateSchema.parse({
      initialized: true,
      interfaces: { vpc: 'eth0', ext: 'net1' },
      dnats: [
        { eip: '192.0.2.1', port: 80, protocol: 'tcp', internalIp: '10.0.0.1', internalPort: 80 },
        { eip: '192.0.2.1', port: 80, portEnd: 81, protocol: 'tcp', internalIp: '10.0.0.1', internalPort: 80 },
        { eip: '192.0.2.1', port: 80, protocol: 'udp', internalIp: '10.0.0.1', internalPort: 80 },
        { eip: '192.0.2.1', port: 80, protocol: 'tcp', internalIp: '10.0.0.2', internalPort: 81 },
      ],
    });
    expect(() => normaliseDesired(s, 'desired.')).toThrow(/^desired\.dnats\[3\]: duplicate .* identity .*80.*\(also at \[0\]\)$/);
  });
});

describe('normaliseDesired: SNAT order', () => {
  const base = { initialized: true, interfaces: { vpc: 'eth0', ext: 'net1' } };
  const snat = fc.record({
    eip: fc.constantFrom('192.0.2.1', '192.0.2.2', '192.0.2.3'),
    cidr: fc.constantFrom('10.0.0.0/8', '10.1.0.0/16', '10.2.0.0/16', '10.1.1.0/24', '10.1.1.7/32', '0.0.0.0/0'),
    randomFully: fc.boolean(),
  });

  it('is longest prefix first, equal lengths in the order given', () => {
    fc.assert(
      fc.property(fc.uniqueArray(snat, { selector: (s) => `${s.eip}|${s.cidr}`, maxLength: 10 }), (snats) => {
        const s = desiredStateSchema.parse({ ...base, snats });
        const prefix = (c: string) => Number(c.split('/')[1]);
        const want = s.snats.map((x, i) => ({ x, i })).sort((a, b) => prefix(b.x.cidr) - prefix(a.x.cidr) || a.i - b.i);
        const out = normaliseDesired(s).snats;
        expect(out).toEqual(want.map((e) => e.x));
        out.forEach((x, i) => expect(x).toBe(want[i]?.x));
      }),
      { numRuns: 1000 },
    );
  });
});
