import fs from 'node:fs';
import { describe, expect, it } from 'vitest';
import { natTablesOf, type NatTables } from '../../src/dataplane/netfilter/backend.js';
import { ofFamily } from '../../src/dataplane/netfilter/backend.js';
import { desiredTables, planTable, renderRestore, type TableName } from '../../src/dataplane/netfilter/iptables/plan.js';
import { emptyTable } from '../../src/dataplane/netfilter/iptables/save.js';
import { planNatgw } from '../../src/dataplane/netfilter/nft/render.js';
import { NftTransaction } from '../../src/dataplane/netfilter/nft/transaction.js';
import type { Family } from '../../src/model/net.js';
import { desiredStateSchema } from '../../src/state/state.js';
import { prng } from '../helpers/prng.js';
import { variedStateDoc } from '../helpers/variedState.js';

/**
 * The full-sync renderers are tuned for ten thousand objects; these pin their bytes. The
 * fixtures were rendered from variedStateDoc(8, 400) by the renderers before that tuning
 * (commit 222f496; nft.txt again after the per-CIDR SNAT layout, by the untuned renderer with
 * that layout, byte-identical to the tuned one; and again after SNAT data maps, by the renderer,
 * checked by loading it into a real kernel and finding nothing to change against its read-back),
 * so any change in output, however small, fails here.
 */
const fixture = (name: string): string => fs.readFileSync(new URL(`../fixtures/render/${name}`, import.meta.url), 'utf8');
const fresh = (): NatTables => natTablesOf(desiredStateSchema.parse(variedStateDoc(8, 400)));

function restore(t: NatTables, family: Family): string {
  const want = desiredTables(ofFamily(t, family));
  return (['nat', 'mangle'] as TableName[]).map((x) => renderRestore(x, planTable(emptyTable, want[x]))).join('');
}

describe('full-sync render of a varied state (both families, ranges, pools, repeats)', () => {
  it('writes the nft script byte for byte as before', () => {
    const p = planNatgw(fresh(), { ip: null, ip6: null });
    expect(`# changes ${p.changes}\n${p.tx.text()}`).toBe(fixture('nft.txt'));
  });

  it('writes the iptables-restore scripts byte for byte as before', () => {
    const t = fresh();
    expect(restore(t, 4)).toBe(fixture('iptables-v4.txt'));
    expect(restore(t, 6)).toBe(fixture('iptables-v6.txt'));
  });

  it('renders the same again for the same objects, and for a copy of them', () => {
    const t = fresh();
    const first = planNatgw(t, { ip: null, ip6: null }).tx.text();
    expect(planNatgw(t, { ip: null, ip6: null }).tx.text()).toBe(first);
    expect(planNatgw(structuredClone(t), { ip: null, ip6: null }).tx.text()).toBe(first);
    expect(restore(t, 4)).toBe(restore(structuredClone(t), 4));
  });

  it('iptables: rules reused across a few changes equal the rules of the same objects rendered anew', () => {
    const rnd = prng(3);
    let t = fresh();
    for (let step = 0; step < 40; step++) {
      // A command: a few objects out and in, the rest the very same objects in new arrays.
      const dnats = [...t.dnats];
      const fips = [...t.fips];
      for (let k = 0; k < 1 + Math.floor(rnd() * 3); k++) {
        dnats.splice(Math.floor(rnd() * dnats.length), 1);
        fips.splice(Math.floor(rnd() * fips.length), 1);
      }
      const port = 40000 + step;
      dnats.splice(Math.floor(rnd() * dnats.length), 0, { eip: '172.20.2.10', port, protocol: 'udp', internalIp: '10.0.1.9', internalPort: 53 });
      fips.splice(Math.floor(rnd() * fips.length), 0, { eip: `172.22.0.${step + 1}`, internalIp: `10.3.0.${step + 1}` });
      t = { ...t, dnats, fips };
      for (const family of [4, 6] as const) {
        expect(desiredTables(ofFamily(t, family)).nat.owned).toEqual(desiredTables(ofFamily(structuredClone(t), family)).nat.owned);
      }
    }
  });
});

describe('an element list checked as a whole', () => {
  const T = { family: 'ip', name: 'natgw' } as const;
  const many = Array.from({ length: 50 }, (_, i) => ({ key: `10.0.0.${i + 1} . tcp . ${80 + i}`, value: `10.1.0.${i + 1} . 80` }));
  const add = (elements: { key: string; value?: string }[]) => () => new NftTransaction().addElements(T, 'port_dnat', elements);

  it('writes plain elements as before', () => {
    expect(new NftTransaction().addElements(T, 's', [{ key: '1.1.1.1' }, { key: '2.2.2.2', value: '3.3.3.3' }]).text()).toBe(
      'add element ip natgw s { 1.1.1.1, 2.2.2.2 : 3.3.3.3 }\n',
    );
  });

  it('refuses, naming it, a key or value holding a comma, an empty one, or nft syntax, wherever it sits', () => {
    expect(add([...many, { key: '1.2.3.4, 5.6.7.8' }])).toThrow(/element "1.2.3.4, 5.6.7.8" is not plain data/);
    expect(add([{ key: '1.2.3.4', value: '5.6.7.8, 9.9.9.9' }, ...many])).toThrow(/element value "5.6.7.8, 9.9.9.9"/);
    expect(add([...many.slice(0, 9), { key: '1.2.3.4', value: '' }, ...many])).toThrow(/element value ""/);
    expect(add([...many, { key: '' }])).toThrow(/element ""/);
    expect(add([...many, { key: '1.2.3.4 }; flush ruleset; {' }])).toThrow(TypeError);
  });
});
