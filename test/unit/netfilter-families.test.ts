/**
 * The IPv4/IPv6 split both netfilter backends share (netfilter/backend.ts): an object's family
 * is its EIP's; read-back joins the families again, SNATs longest prefix first.
 */
import { describe, expect, it } from 'vitest';
import { hasFamily, joinFamilies, ofFamily, type NatTables } from '../../src/dataplane/netfilter/backend.js';

const T: NatTables = {
  vpcIf: 'eth0',
  extIf: 'net1',
  eips: ['172.20.0.10', 'fd00:20::10'],
  snats: [
    { eip: '172.20.0.10', cidr: '10.0.1.6/32', randomFully: true },
    { eip: 'fd00:20::10', cidr: 'fd00:1::/64', randomFully: false },
    { eip: '172.20.0.10', cidr: '10.0.0.0/16', randomFully: false },
  ],
  dnats: [{ eip: 'fd00:20::10', port: 80, protocol: 'tcp', internalIp: 'fd00:1::6', internalPort: 8080 }],
  fips: [{ eip: '172.20.0.11', internalIp: '10.0.1.7' }],
};

describe('ofFamily, hasFamily', () => {
  it('takes the objects whose EIP is of the family, keeping their order and the rest of the tables', () => {
    expect(ofFamily(T, 4)).toEqual({
      ...T,
      eips: ['172.20.0.10'],
      snats: [T.snats[0], T.snats[2]],
      dnats: [],
      fips: T.fips,
    });
    expect(ofFamily(T, 6)).toEqual({ ...T, eips: ['fd00:20::10'], snats: [T.snats[1]], dnats: T.dnats, fips: [] });
  });

  it('says whether a family holds anything', () => {
    expect(hasFamily(T, 6)).toBe(true);
    expect(hasFamily(ofFamily(T, 4), 6)).toBe(false);
    expect(hasFamily({ ...T, eips: [], snats: [], dnats: [], fips: [] }, 4)).toBe(false);
  });
});

describe('joinFamilies', () => {
  it('puts the families back together, SNATs longest prefix first, the order of the state', () => {
    const joined = joinFamilies(ofFamily(T, 4), ofFamily(T, 6));
    expect(joined?.snats.map((s) => s.cidr)).toEqual(['fd00:1::/64', '10.0.1.6/32', '10.0.0.0/16']);
    expect(joined).toEqual({ ...T, snats: [T.snats[1], T.snats[0], T.snats[2]] });
  });

  it('takes an interface from whichever family names it; none at all is null', () => {
    expect(joinFamilies({ ...ofFamily(T, 4), vpcIf: '', extIf: '' }, ofFamily(T, 6))).toMatchObject({ vpcIf: 'eth0', extIf: 'net1' });
    expect(joinFamilies(null, null)).toBeNull();
    expect(joinFamilies(null, ofFamily(T, 6))?.dnats).toEqual(T.dnats);
  });
});
