import fc from 'fast-check';
import ipaddr from 'ipaddr.js';
import { describe, expect, it } from 'vitest';
import { isIpv4, parseCidr } from '../../src/model/net.js';

/** The definition isIpv4 implements (its first implementation). */
const DOTTED_QUAD = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;

const near = fc.oneof(
  fc.ipV4(),
  fc.ipV4Extended(),
  fc
    .array(fc.oneof(fc.nat({ max: 300 }).map(String), fc.constantFrom('', '0', '00', '01', '007', '256', '1000', 'a', ' 1', '1 ', '+1', '-1', '１')), {
      minLength: 1,
      maxLength: 6,
    })
    .map((a) => a.join('.')),
  fc.tuple(fc.ipV4(), fc.constantFrom('.', '\n', '/24', ':80', '..', 'x')).map(([a, s]) => a + s),
  fc.string({ maxLength: 16 }),
);

describe('isIpv4', () => {
  it('accepts exactly the strict dotted quads', () => {
    fc.assert(
      fc.property(near, (s) => {
        expect(isIpv4(s)).toBe(DOTTED_QUAD.test(s));
      }),
      { numRuns: 20000 },
    );
  });

  it('examples', () => {
    for (const s of ['0.0.0.0', '255.255.255.255', '10.0.0.1', '192.168.100.200']) expect(isIpv4(s)).toBe(true);
    for (const s of ['', '1.2.3', '1.2.3.4.5', '01.2.3.4', '1.2.3.256', '1.2.3.4\n', '1..2.3', '1.2.3.', '.1.2.3', '0x1.2.3.4', '1.2.3.0004'])
      expect(isIpv4(s)).toBe(false);
  });
});

describe('parseCidr with clearHostBits (IPv4 by arithmetic)', () => {
  it('gives the network address ipaddr.js gives, for every prefix length', () => {
    fc.assert(
      fc.property(fc.ipV4(), fc.integer({ min: 0, max: 32 }), (a, len) => {
        expect(parseCidr(`${a}/${len}`, { clearHostBits: true })).toEqual({
          address: ipaddr.IPv4.networkAddressFromCIDR(`${a}/${len}`).toString(),
          prefix: len,
        });
      }),
      { numRuns: 20000 },
    );
  });
});
