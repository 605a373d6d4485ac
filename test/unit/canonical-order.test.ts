import { describe, expect, it } from 'vitest';
import { canonicalOrder, compareIp, type NatTables } from '../../src/dataplane/netfilter/backend.js';
import type { Dnat, Fip } from '../../src/model/rules.js';
import { prng } from '../helpers/prng.js';

const T0: NatTables = { vpcIf: 'eth0', extIf: 'net1', eips: [], snats: [], dnats: [], fips: [] };
const full = (t: NatTables) => ({
  dnats: [...t.dnats].sort((a, b) => compareIp(a.eip, b.eip) || a.port - b.port || a.protocol.localeCompare(b.protocol)),
  fips: [...t.fips].sort((a, b) => compareIp(a.eip, b.eip)),
});

describe('canonicalOrder, kept up to date between commands', () => {
  it('equals a full sort after every step of a random walk of adds and deletes', () => {
    const rnd = prng(42);
    let t = T0;
    for (let step = 0; step < 400; step++) {
      const i = Math.floor(rnd() * 300);
      const r = rnd();
      if (r < 0.45) {
        const d: Dnat = {
          eip: `172.${20 + (i % 3)}.${i % 7}.${i}`,
          port: 1 + (i % 50),
          protocol: i % 2 ? 'tcp' : 'udp',
          internalIp: '10.0.0.1',
          internalPort: 80,
        };
        if (!t.dnats.some((x) => x.eip === d.eip && x.port === d.port && x.protocol === d.protocol)) t = { ...t, dnats: [...t.dnats, d] };
      } else if (r < 0.7) {
        t = { ...t, dnats: t.dnats.filter((_, k) => k !== i % Math.max(1, t.dnats.length)) };
      } else if (r < 0.9) {
        const f: Fip = { eip: i % 5 === 0 ? `fd00::${i.toString(16)}` : `172.30.${i % 9}.${i}`, internalIp: '10.0.0.2' };
        if (!t.fips.some((x) => x.eip === f.eip)) t = { ...t, fips: [f, ...t.fips] };
      } else if (r < 0.97) {
        t = { ...t, fips: t.fips.filter((_, k) => k !== i % Math.max(1, t.fips.length)) };
      } else {
        // An unrelated state now and then (another gateway, a test): the order is sorted afresh.
        t = { ...t, dnats: [...t.dnats].reverse() };
      }
      const got = canonicalOrder(t);
      const want = full(t);
      expect(got.dnats, `step ${step}`).toEqual(want.dnats);
      expect(got.fips, `step ${step}`).toEqual(want.fips);
    }
  });

  it('stays right when two collections are sorted in turn (IPv4 and IPv6 objects of each command)', () => {
    const rnd = prng(7);
    let v4: NatTables = T0;
    let v6: NatTables = T0;
    for (let step = 0; step < 200; step++) {
      const i = Math.floor(rnd() * 500);
      const which = step % 2 === 0;
      const t = which ? v4 : v6;
      const d: Dnat = {
        eip: which ? `172.20.${i % 9}.${i % 250}` : `fd00::${i.toString(16)}`,
        port: 1 + i,
        protocol: 'tcp',
        internalIp: which ? '10.0.0.1' : 'fd00:1::1',
        internalPort: 80,
      };
      const next =
        rnd() < 0.7 && !t.dnats.some((x) => x.eip === d.eip && x.port === d.port) ? { ...t, dnats: [...t.dnats, d] } : { ...t, dnats: t.dnats.slice(1) };
      if (which) v4 = next;
      else v6 = next;
      expect(canonicalOrder(next).dnats, `step ${step}`).toEqual(full(next).dnats);
    }
  });
});
