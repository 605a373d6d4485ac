/**
 * The hit witnesses' pure parts (src/dataplane/netfilter/nft/witness.ts): which flushes a
 * witness may answer for, the trust bookkeeping, nft's answer parsed, and the hit sets in the
 * full render. The real-kernel proof is test/netns/witness.test.ts.
 */
import { describe, expect, it } from 'vitest';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { natgwKernel } from '../../src/dataplane/netfilter/nft/readback.js';
import { planNatgw } from '../../src/dataplane/netfilter/nft/render.js';
import { NftTransaction } from '../../src/dataplane/netfilter/nft/transaction.js';
import type { NatgwKernel, NftTableDump } from '../../src/dataplane/netfilter/nft/types.js';
import {
  WitnessTrust,
  hitCleanupTx,
  hitDeletesTx,
  hitFingerprint,
  hitSetsOf,
  hitsInListing,
  listingsDone,
  witnessFor,
  type WitnessObjects,
} from '../../src/dataplane/netfilter/nft/witness.js';
import { Metrics } from '../../src/engine/metrics.js';
import type { Dnat, Fip } from '../../src/model/rules.js';
import { emptyState } from '../../src/state/state.js';
import * as Ops from '../../src/state/operations.js';
import { FakeNftClient } from '../helpers/fakeNft.js';
import { RecordingKernel } from '../helpers/recordingKernel.js';

const EIP = '172.20.0.10';
const d80: Dnat = { eip: EIP, port: 80, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8080 };
const d81: Dnat = { eip: EIP, port: 81, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8081 };
const range: Dnat = { eip: EIP, port: 1000, portEnd: 1010, protocol: 'udp', internalIp: '10.0.1.6', internalPort: 1000 };
const fip: Fip = { eip: '172.20.0.11', internalIp: '10.0.1.7' };
const none: WitnessObjects = { dnats: [], fips: [], shareDnats: [] };
const objs = (o: Partial<WitnessObjects>): WitnessObjects => ({ ...none, ...o });
const dnatFlush = (d: Pick<Dnat, 'eip' | 'port' | 'protocol'>) => ({ dst: d.eip, protocol: d.protocol, port: d.port });

describe('witnessFor: which flushes a hit witness may answer for', () => {
  it("a deleted single-port DNAT's flush, keyed as its map element", () => {
    expect(witnessFor(dnatFlush(d80), objs({ dnats: [d80, d81] }), objs({ dnats: [d81] }))).toEqual({ family: 'ip', kind: 'dnat', key: `${EIP} . tcp . 80` });
    const v6: Dnat = { eip: 'fd00:20::10', port: 443, protocol: 'tcp', internalIp: 'fd00:1::6', internalPort: 8443 };
    expect(witnessFor(dnatFlush(v6), objs({ dnats: [v6] }), none)).toEqual({ family: 'ip6', kind: 'dnat', key: 'fd00:20::10 . tcp . 443' });
  });

  it('not when the DNAT was not there, is still there, or is a port range', () => {
    expect(witnessFor(dnatFlush(d80), none, none)).toBeUndefined();
    expect(witnessFor(dnatFlush(d80), objs({ dnats: [d80] }), objs({ dnats: [{ ...d80, internalPort: 9 }] }))).toBeUndefined();
    expect(witnessFor({ dst: EIP, protocol: 'udp', port: 1000, portEnd: 1010 }, objs({ dnats: [range] }), none)).toBeUndefined();
  });

  it('not when a floating IP or a share DNAT translates the same tuples', () => {
    const sameEip: Fip = { eip: EIP, internalIp: '10.0.1.9' };
    expect(witnessFor(dnatFlush(d80), objs({ dnats: [d80], fips: [sameEip] }), objs({ fips: [sameEip] }))).toBeUndefined();
    expect(witnessFor(dnatFlush(d80), objs({ dnats: [d80], shareDnats: [d80] }), objs({ shareDnats: [d80] }))).toBeUndefined();
    // A share DNAT's own delete has the same filter: never witnessed (no DNAT of natgw's maps went).
    expect(witnessFor(dnatFlush(d80), objs({ shareDnats: [d80] }), none)).toBeUndefined();
    // Another port of the same address is no obstacle.
    expect(witnessFor(dnatFlush(d80), objs({ dnats: [d80], shareDnats: [d81] }), objs({ shareDnats: [d81] }))).toBeDefined();
  });

  it("a deleted floating IP's flush, unless a DNAT or share DNAT has its address", () => {
    expect(witnessFor({ dst: fip.eip }, objs({ fips: [fip] }), none)).toEqual({ family: 'ip', kind: 'fip', key: fip.eip });
    const onFip: Dnat = { ...d80, eip: fip.eip };
    expect(witnessFor({ dst: fip.eip }, objs({ fips: [fip], dnats: [onFip] }), objs({ dnats: [onFip] }))).toBeUndefined();
    expect(witnessFor({ dst: fip.eip }, objs({ fips: [fip], shareDnats: [onFip] }), objs({ shareDnats: [onFip] }))).toBeUndefined();
    expect(witnessFor({ dst: fip.eip }, objs({ fips: [fip] }), objs({ fips: [fip] }))).toBeUndefined();
    expect(witnessFor({ dst: fip.eip }, none, none)).toBeUndefined();
  });
});

const tables = (dnats: readonly Dnat[], fips: readonly Fip[] = []): NatTables => ({ vpcIf: 'eth0', extIf: 'net1', eips: [EIP], snats: [], dnats, fips });
const dump = (handle: number, dnatHit: number, fipHit: number, hits: readonly string[] = []): NftTableDump => ({
  family: 'ip',
  name: 'natgw',
  handle,
  chains: new Map(),
  sets: new Map([
    [
      'dnat_hit',
      { name: 'dnat_hit', handle: dnatHit, kind: 'set', type: 'ipv4_addr . inet_proto . inet_service', flags: [], elements: hits.map((key) => ({ key })) },
    ],
    ['fip_hit', { name: 'fip_hit', handle: fipHit, kind: 'set', type: 'ipv4_addr', flags: [], elements: [] }],
  ]),
});
const kernelOf = (d: NftTableDump): NatgwKernel => natgwKernel(d, null);
const w80 = { family: 'ip', kind: 'dnat', key: `${EIP} . tcp . 80` } as const;
const wFip = { family: 'ip', kind: 'fip', key: fip.eip } as const;

describe('WitnessTrust', () => {
  it('trusts what a partial sync created, until its delete takes it', () => {
    const t = new WitnessTrust();
    const a = tables([]);
    const b = tables([d80], [fip]);
    t.partial(a, b);
    const c = tables([], []);
    t.partial(b, c);
    expect(t.take(w80)).toBe(true);
    expect(t.take(wFip)).toBe(true);
    // Taken once: a second delete of the same key is not vouched for.
    expect(t.take(w80)).toBe(false);
  });

  it('never trusts a port range, nor a key deleted and added in one change', () => {
    const t = new WitnessTrust();
    t.partial(tables([]), tables([range]));
    expect(t.size).toBe(0);
    const before = tables([d80]);
    t.partial(tables([]), before);
    t.partial(before, tables([{ ...d80, internalPort: 9 }]));
    expect(t.take(w80)).toBe(false);
  });

  it('a full sync keeps trust only when it changed nothing in the very hit sets the last such sync saw', () => {
    const t = new WitnessTrust();
    const k = kernelOf(dump(1, 5, 6));
    // The first full sync has nothing to compare with: what came before it is untrusted.
    t.partial(tables([]), tables([d80]));
    t.full(k, 0);
    expect(t.take(w80)).toBe(false);

    t.partial(tables([]), tables([d80]));
    t.full(k, 0);
    expect(t.take(w80)).toBe(true);

    t.partial(tables([]), tables([d80]));
    t.full(k, 3);
    expect(t.take(w80)).toBe(false);
    // After a sync that changed something, the next one has no record to compare with.
    t.partial(tables([]), tables([d80]));
    t.full(k, 0);
    expect(t.take(w80)).toBe(false);

    // A table or hit set created anew (by anyone) has another handle.
    for (const other of [dump(2, 5, 6), dump(1, 7, 6), dump(1, 5, 8)]) {
      t.full(k, 0);
      t.partial(tables([]), tables([d80]));
      t.full(kernelOf(other), 0);
      expect(t.take(w80)).toBe(false);
    }
    expect(hitFingerprint(k)).not.toBe(hitFingerprint(natgwKernel(null, null)));
  });

  it('a full sync stops trusting the keys it found hit (their flush is owed whatever comes)', () => {
    const t = new WitnessTrust();
    t.full(kernelOf(dump(1, 5, 6)), 0);
    t.partial(tables([]), tables([d80, d81]));
    t.full(kernelOf(dump(1, 5, 6, [`${EIP} . tcp . 80`])), 0);
    expect(t.take(w80)).toBe(false);
    expect(t.take({ ...w80, key: `${EIP} . tcp . 81` })).toBe(true);
  });

  it('clear forgets everything', () => {
    const t = new WitnessTrust();
    t.partial(tables([]), tables([d80]));
    t.clear();
    expect(t.take(w80)).toBe(false);
  });
});

describe('reading the hit sets', () => {
  // `list set` in nft 1.0.6's text, as the session prints it (elements wrap onto more lines).
  const listing = [
    'table ip natgw {',
    '\tset dnat_hit {',
    '\t\ttype ipv4_addr . inet_proto . inet_service',
    '\t\tsize 1048576',
    '\t\tflags dynamic',
    `\t\telements = { ${EIP} . tcp . 80, ${EIP} . udp . 53,`,
    `\t\t\t     ${EIP} . tcp . 443 }`,
    '\t}',
    '}',
    'table ip6 natgw {',
    '\tset fip_hit {',
    '\t\ttype ipv6_addr',
    '\t\tsize 1048576',
    '\t\tflags dynamic',
    '\t\telements = { fd00:20:0:0::11 }',
    '\t}',
    '}',
    'table ip natgw {',
    '\tset fip_hit {',
    '\t\ttype ipv4_addr',
    '\t\tsize 1048576',
    '\t\tflags dynamic',
    '\t}',
    '}',
    '',
  ].join('\n');

  it('finds every hit, per family and kind, addresses canonical', () => {
    expect([...hitsInListing(listing)].sort()).toEqual(
      [`ip dnat ${EIP} . tcp . 80`, `ip dnat ${EIP} . udp . 53`, `ip dnat ${EIP} . tcp . 443`, 'ip6 fip fd00:20::11'].sort(),
    );
    expect(hitsInListing('')).toEqual(new Set());
  });

  it('knows when the listings are whole (stdout and stderr are read apart)', () => {
    expect(listingsDone(listing, 3)).toBe(true);
    expect(listingsDone(listing.slice(0, listing.indexOf('table ip6')), 3)).toBe(false);
  });

  it('lists the sets of the kinds and families asked, once each', () => {
    expect(hitSetsOf([w80, wFip, { ...w80, key: `${EIP} . udp . 53` }])).toEqual([
      { family: 'ip', set: 'dnat_hit' },
      { family: 'ip', set: 'fip_hit' },
    ]);
  });

  it('deletes the hits found, and at a full sync every hit read back', () => {
    expect(hitDeletesTx([w80, wFip], 'natgw').text()).toBe(
      `delete element ip natgw dnat_hit { ${EIP} . tcp . 80 }\ndelete element ip natgw fip_hit { 172.20.0.11 }\n`,
    );
    const k = kernelOf(dump(1, 5, 6, [`${EIP} . tcp . 80`]));
    expect(hitCleanupTx(k, 'natgw').text()).toBe(`delete element ip natgw dnat_hit { ${EIP} . tcp . 80 }\n`);
    expect(hitCleanupTx(kernelOf(dump(1, 5, 6)), 'natgw').isEmpty).toBe(true);
  });

  it('an element key that is not plain data never reaches the script', () => {
    expect(() => hitDeletesTx([{ family: 'ip', kind: 'fip', key: '1.2.3.4 }; flush ruleset; {' }], 'natgw')).toThrow(/not plain data/);
  });
});

describe('the hit sets in the full render', () => {
  it("are created empty and dynamic, and their elements (the packet path's) are never diffed", async () => {
    const want = tables([d80, d81], [fip]);
    const nft = new FakeNftClient();
    const fresh = planNatgw(want, natgwKernel(null, null));
    expect(fresh.tx.text()).toContain('add set ip natgw dnat_hit { type ipv4_addr . inet_proto . inet_service; size 1048576; flags dynamic; }');
    expect(fresh.tx.text()).not.toMatch(/add element ip natgw (dnat|fip)_hit/);
    await nft.run(fresh.tx);
    await nft.run(
      new NftTransaction()
        .addElements({ family: 'ip', name: 'natgw' }, 'dnat_hit', [{ key: `${EIP} . tcp . 80` }, { key: `${EIP} . tcp . 99` }])
        .addElements({ family: 'ip', name: 'natgw' }, 'fip_hit', [{ key: fip.eip }, { key: '172.20.0.99' }]),
    );
    const kernel = natgwKernel(await nft.list('ip', 'natgw'), null);
    expect(planNatgw(want, kernel).tx.text()).toBe('');
    expect(hitCleanupTx(kernel, 'natgw').text()).toBe(
      `delete element ip natgw dnat_hit { ${EIP} . tcp . 80, ${EIP} . tcp . 99 }\ndelete element ip natgw fip_hit { 172.20.0.11, 172.20.0.99 }\n`,
    );
  });
});

describe('natgw_conntrack_flushes_total', () => {
  it('counts the flushes a change ran and those its witnesses skipped', async () => {
    const m = new Metrics();
    const report = { netfilterChanges: 1, shareDnatChanges: 0, linkChanges: 0, qosChanges: 0, script: '', notes: [] };
    m.observeSync({ ok: true, kind: 'partial', ms: 1, report, state: emptyState('eth0', 'net1'), flushes: { ran: 1, skipped: 2 } });
    m.observeSync({ ok: true, kind: 'partial', ms: 1, report, state: emptyState('eth0', 'net1'), flushes: { ran: 0, skipped: 1 } });
    m.observeSync({ ok: true, kind: 'partial', ms: 1, report, state: emptyState('eth0', 'net1') });
    const body = (await m.render()).body;
    expect(body).toContain('natgw_conntrack_flushes_total{outcome="ran"} 1');
    expect(body).toContain('natgw_conntrack_flushes_total{outcome="skipped_no_hits"} 3');
  });
});

describe('the engine asks the witnesses', () => {
  const dnat = { eip: EIP, port: 8080, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 } as const;
  async function deleteFresh(env: Record<string, string>): Promise<string[]> {
    const k = new RecordingKernel();
    try {
      // A session that finds no hit (the fake kernel has no packet path).
      Object.assign(k.nft, { listSets: async () => '' });
      const engine = await k.initialised(env);
      await engine.transact(({ state }) => Ops.addDnat(state, dnat));
      k.calls.length = 0;
      await engine.transact(({ state }) => Ops.delDnat(state, dnat));
      return k.calls.filter((c) => c.startsWith('conntrack'));
    } finally {
      k.cleanup();
    }
  }

  it('skips the flush of a DNAT it created that no connection hit', async () => {
    expect(await deleteFresh({})).toEqual([]);
  });

  it('never with a replica: conntrackd writes the peer’s flows into this kernel past the witnesses', async () => {
    expect(await deleteFresh({ NATGW_HA_PEERS: '10.9.9.9' })).toEqual([`conntrack -D --orig-dst ${EIP} -p tcp --orig-port-dst 8080`]);
  });
});
