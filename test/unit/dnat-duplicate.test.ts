import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { firstDuplicateDnat, normaliseDesired } from '../../src/api/stateDoc.js';
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

describe('firstDuplicateDnat', () => {
  it('finds the same pair as a key per DNAT', () => {
    fc.assert(
      fc.property(fc.array(dnat, { maxLength: 12 }), (dnats) => {
        expect(firstDuplicateDnat(dnats as Dnats)).toEqual(reference(dnats as Dnats));
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
