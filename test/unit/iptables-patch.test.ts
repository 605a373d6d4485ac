import { describe, expect, it } from 'vitest';
import { natTablesOf } from '../../src/dataplane/netfilter/backend.js';
import { ofFamily } from '../../src/dataplane/netfilter/backend.js';
import { patchFamily, renderFamily } from '../../src/dataplane/netfilter/iptables/plan.js';
import { ConflictError } from '../../src/model/errors.js';
import type { Dnat, Fip } from '../../src/model/rules.js';
import * as Ops from '../../src/state/operations.js';
import { emptyState } from '../../src/state/state.js';
import { prng } from '../helpers/prng.js';

const dnat = (i: number, to = 6): Dnat => ({
  eip: i % 5 === 0 ? `fd00:20::${i % 7}` : `172.20.0.${i % 9}`,
  port: 1000 + i,
  protocol: i % 3 === 0 ? 'udp' : 'tcp',
  internalIp: i % 5 === 0 ? `fd00:1::${to}` : `10.0.1.${to}`,
  internalPort: 80,
});
const fip = (i: number, to = 6): Fip =>
  i % 4 === 0 ? { eip: `fd00:21::${i}`, internalIp: `fd00:2::${to}` } : { eip: `172.21.0.${i}`, internalIp: `10.2.0.${to}` };

describe('iptables rules patched from a change', () => {
  it('equal, family by family, the rules rendered anew at every step of a random walk', () => {
    const rnd = prng(27);
    const pick = (n: number) => Math.floor(rnd() * n);
    let s = { ...emptyState('eth0', 'net1'), initialized: true };
    const rendered = { 4: renderFamily(ofFamily(natTablesOf(s), 4)), 6: renderFamily(ofFamily(natTablesOf(s), 6)) };
    for (let k = 0; k < 400; k++) {
      const i = pick(60);
      let r = Ops.unchanged(s);
      try {
        const op = pick(5);
        if (op === 0) r = Ops.addDnats(s, [dnat(i)]);
        else if (op === 1) r = Ops.delDnat(s, dnat(i));
        else if (op === 2) r = Ops.addFips(s, [fip(i)]);
        else if (op === 3) r = Ops.delFip(s, fip(i).eip);
        else r = Ops.chain(Ops.delFip(s, fip(i).eip), (t) => Ops.addFip(t, fip(i, 7 + pick(3))));
      } catch (e) {
        if (!(e instanceof ConflictError)) throw e;
      }
      s = r.state;
      for (const family of [4, 6] as const) {
        const patched = patchFamily(rendered[family], natTablesOf(s), r.change, family);
        expect(patched, `step ${k}`).toEqual(renderFamily(ofFamily(natTablesOf(s), family)));
        rendered[family] = patched!;
      }
    }
  });

  it('refuses a change that does not start from the rendering it is given', () => {
    const s = { ...emptyState('eth0', 'net1'), initialized: true };
    const r = Ops.delDnat(Ops.addDnat(s, dnat(1)).state, dnat(1));
    expect(patchFamily(renderFamily(natTablesOf(s)), natTablesOf(r.state), r.change, 4)).toBeUndefined();
  });
});
