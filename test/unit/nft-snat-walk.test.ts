/**
 * A random walk of SNAT commands (adds, deletes, replaces; CIDRs shared by several EIPs,
 * --random-fully, pools, several prefix lengths of both families) through the partial planner,
 * on the fake nft: every step's transaction must be accepted as it stands (the fake refuses what
 * the kernel would: a chain still named, an element missing or bound to another value), and
 * leave exactly the tables a full render of the same state from scratch makes, which a full sync
 * then finds nothing to change in. Every step, the translation the tables give a set of source
 * addresses (test/helpers/nftSnatPath.ts) is SPEC's: longest prefix first, of several EIPs on one
 * CIDR the first.
 */
import fc from 'fast-check';
import ipaddr from 'ipaddr.js';
import { describe, expect, it } from 'vitest';
import { natTablesOf, type NatTables } from '../../src/dataplane/netfilter/backend.js';
import { planPartial } from '../../src/dataplane/netfilter/nft/partial.js';
import { natgwKernel } from '../../src/dataplane/netfilter/nft/readback.js';
import { planNatgw } from '../../src/dataplane/netfilter/nft/render.js';
import type { NftFamily } from '../../src/dataplane/netfilter/nft/types.js';
import { snatKey, type Snat } from '../../src/model/rules.js';
import * as Ops from '../../src/state/operations.js';
import { desiredStateSchema, type DesiredState } from '../../src/state/state.js';
import { FakeNftClient } from '../helpers/fakeNft.js';
import { tableView } from '../helpers/nftDump.js';
import { sharedSnatOf, type SnatTo } from '../helpers/nftSnatPath.js';

const V4 = {
  cidrs: ['0.0.0.0/0', '10.0.0.0/16', '10.0.1.0/24', '10.0.2.0/24', '10.0.1.0/25', '10.0.1.6/32', '10.0.2.9/32'],
  eips: ['172.20.0.10', '172.20.0.11', '172.20.0.12'],
};
const V6 = { cidrs: ['fd00::/48', 'fd00:0:0:1::/64', 'fd00:0:0:2::/64', 'fd00:0:0:1::6/128'], eips: ['fd00:20::10', 'fd00:20::11'] };
/** Inside, at the edge of and outside every CIDR above. */
const SOURCES = [
  '10.0.1.6',
  '10.0.1.7',
  '10.0.1.200',
  '10.0.2.9',
  '10.0.2.10',
  '10.0.3.1',
  '10.1.0.1',
  'fd00:0:0:1::6',
  'fd00:0:0:1::7',
  'fd00:0:0:2::1',
  'fd00:0:0:5::1',
  'fd01::1',
];

/** Every EIP on EXT, so both families' tables stay (their coming and going is a full sync's). */
const START: DesiredState = desiredStateSchema.parse({
  initialized: true,
  interfaces: { vpc: 'eth0', ext: 'net1' },
  eips: [...V4.eips, ...V6.eips].map((address) => ({ address, prefixLength: address.includes(':') ? 64 : 24 })),
});

const op = fc.record({
  verb: fc.constantFrom('add', 'add', 'add', 'del', 'replace'),
  v6: fc.boolean(),
  cidr: fc.nat(),
  eip: fc.nat(),
  randomFully: fc.boolean(),
  pool: fc.constantFrom(false, false, false, true),
});
type Op = typeof op extends fc.Arbitrary<infer T> ? T : never;

/** A command as the API applies it: a replace of a changed SNAT is a delete and an add (api/resources.ts). */
function apply(s: DesiredState, o: Op): DesiredState {
  const fam = o.v6 ? V6 : V4;
  const cidr = fam.cidrs[o.cidr % fam.cidrs.length]!;
  const eip = fam.eips[o.eip % fam.eips.length]!;
  const other = fam.eips[(o.eip + 1) % fam.eips.length]!;
  const snat: Snat = { eip, cidr, randomFully: o.randomFully, ...(o.pool ? { eips: [eip, other] } : {}) };
  if (o.verb === 'del') return Ops.delSnat(s, snat).state;
  if (o.verb === 'replace') return Ops.addSnat(Ops.delSnat(s, snat).state, snat).state;
  return Ops.addSnat(s, snat).state;
}

/** SPEC's SNAT: the first rule of the state (longest prefix first) whose CIDR holds the source. */
function specSnatOf(t: NatTables, src: string): SnatTo | undefined {
  const a = ipaddr.parse(src);
  const s = t.snats.find((x) => x.eip.includes(':') === src.includes(':') && a.match(ipaddr.parseCIDR(x.cidr)));
  return s && { eips: s.eips ?? [s.eip], randomFully: s.randomFully };
}

/** A table's objects, without what only their history decides (handles, creation order). */
function contents(nft: FakeNftClient, fam: NftFamily): unknown {
  const v = tableView(nft.dump(fam, 'natgw'));
  if (!v) return null;
  return {
    chains: v.chains.map(({ name, base, rules }) => ({ name, base, rules: rules.map((r) => r.rule) })).sort((a, b) => a.name.localeCompare(b.name)),
    sets: v.sets.map(({ name, decl, elements }) => ({ name, decl, elements })).sort((a, b) => a.name.localeCompare(b.name)),
  };
}

const kernelOf = (nft: FakeNftClient) => natgwKernel(nft.dump('ip', 'natgw'), nft.dump('ip6', 'natgw'));

async function walk(ops: readonly Op[]): Promise<void> {
  const partial = new FakeNftClient();
  let state = START;
  let tables = natTablesOf(state);
  await partial.run(planNatgw(tables, kernelOf(partial)).tx);
  for (const [i, o] of ops.entries()) {
    state = apply(state, o);
    const next = natTablesOf(state);
    const step = `step ${i} ${JSON.stringify(o)}; SNATs now ${next.snats.map(snatKey).join(' ')}`;
    const p = planPartial({ tables, families: new Set(['ip', 'ip6']) }, next);
    expect(p, step).not.toBeNull();
    await partial.run(p!.tx);
    tables = next;

    const fresh = new FakeNftClient();
    await fresh.run(planNatgw(next, kernelOf(fresh)).tx);
    for (const fam of ['ip', 'ip6'] as const) expect(contents(partial, fam), `${step}: ${fam}`).toEqual(contents(fresh, fam));
    expect(planNatgw(next, kernelOf(partial)).changes, step).toBe(0);
    for (const src of SOURCES) {
      const dump = partial.dump(src.includes(':') ? 'ip6' : 'ip', 'natgw')!;
      expect(sharedSnatOf(dump, src), `${step}: ${src}`).toEqual(specSnatOf(next, src));
    }
  }
}

describe('SNAT commands through the partial planner, at random', () => {
  it('leave the tables a full render makes, translating as SPEC says, at every step', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(op, { minLength: 1, maxLength: 40 }), (ops) => walk(ops)),
      { numRuns: 100 },
    );
  }, 120_000);

  it('a CIDR back and forth between an element and a chain, by every kind of change', async () => {
    const cidr = 1; // 10.0.0.0/16
    const base = { v6: false, cidr, pool: false, randomFully: false } as const;
    await walk([
      { ...base, verb: 'add', eip: 0 },
      { ...base, verb: 'add', eip: 1 },
      { ...base, verb: 'add', eip: 2, randomFully: true },
      { ...base, verb: 'del', eip: 0 },
      { ...base, verb: 'del', eip: 1 },
      { ...base, verb: 'replace', eip: 2, randomFully: false },
      { ...base, verb: 'replace', eip: 2, pool: true },
      { ...base, verb: 'replace', eip: 2 },
      { ...base, verb: 'del', eip: 2 },
    ]);
  });
});
