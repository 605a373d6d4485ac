/**
 * Share DNAT in table ip kube-ovn, pure: the SPEC's exact objects, idempotence against a REAL
 * read-back (REAL_KUBE_OVN is `nft -j list table ip kube-ovn` of nft 1.0.6 for ITEMS), element-level
 * changes, atomic backend replacement, stale chains, and never touching anyone else's objects.
 */
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import type { ShareDnat } from '../../src/model/rules.js';
import { parseTableListing } from '../../src/dataplane/netfilter/nft/readback.js';
import type { NftTableDump } from '../../src/dataplane/netfilter/nft/types.js';
import { shareDnatChainName } from '../../src/model/shareDnatName.js';
import { planShareDnat, recogniseShareRule, shareDnatsFromKernel, shareRuleText } from '../../src/dataplane/netfilter/shareDnatRender.js';

/** The plan's first transaction as text, its stale chains and its count. */
function renderShareDnat(items: readonly ShareDnat[], have: NftTableDump | null) {
  const p = planShareDnat(items, have);
  return { main: p.tx.text(), staleChains: p.staleChains, changes: p.changes };
}

const ITEMS: ShareDnat[] = [
  {
    eip: '172.20.0.10',
    port: 8080,
    protocol: 'tcp',
    protocolText: 'TCP',
    backends: [
      { ip: '10.0.1.6', port: 80 },
      { ip: '10.0.1.7', port: 80 },
    ],
  },
  { eip: '172.20.0.10', port: 5353, protocol: 'udp', protocolText: 'udp', backends: [{ ip: '10.0.1.6', port: 53 }] },
];
const TCP_CHAIN = 'dnat-597cdf0ec2be';
const UDP_CHAIN = 'dnat-a824d77eccbb';

const REAL_KUBE_OVN = JSON.stringify({
  nftables: [
    { metainfo: { version: '1.0.6', release_name: 'Lester Gooch #5', json_schema_version: 1 } },
    { table: { family: 'ip', name: 'kube-ovn', handle: 3 } },
    {
      map: {
        family: 'ip',
        name: 'service-ips',
        table: 'kube-ovn',
        type: ['ipv4_addr', 'inet_proto', 'inet_service'],
        handle: 1,
        map: 'verdict',
        elem: [
          [{ concat: ['172.20.0.10', 'tcp', 8080] }, { goto: { target: 'dnat-597cdf0ec2be' } }],
          [{ concat: ['172.20.0.10', 'udp', 5353] }, { goto: { target: 'dnat-a824d77eccbb' } }],
        ],
      },
    },
    { chain: { family: 'ip', table: 'kube-ovn', name: 'prerouting', handle: 2, type: 'nat', hook: 'prerouting', prio: -150, policy: 'accept' } },
    { chain: { family: 'ip', table: 'kube-ovn', name: 'dnat-597cdf0ec2be', handle: 4 } },
    { chain: { family: 'ip', table: 'kube-ovn', name: 'dnat-a824d77eccbb', handle: 7 } },
    {
      rule: {
        family: 'ip',
        table: 'kube-ovn',
        chain: 'prerouting',
        handle: 3,
        expr: [
          {
            vmap: {
              key: { concat: [{ payload: { protocol: 'ip', field: 'daddr' } }, { meta: { key: 'l4proto' } }, { payload: { protocol: 'th', field: 'dport' } }] },
              data: '@service-ips',
            },
          },
        ],
      },
    },
    {
      rule: {
        family: 'ip',
        table: 'kube-ovn',
        chain: 'dnat-597cdf0ec2be',
        handle: 6,
        expr: [
          { match: { op: '==', left: { meta: { key: 'l4proto' } }, right: 'tcp' } },
          {
            dnat: {
              family: 'ip',
              addr: {
                map: {
                  key: { numgen: { mode: 'random', mod: 2, offset: 0 } },
                  data: {
                    set: [
                      [0, { concat: ['10.0.1.6', 80] }],
                      [1, { concat: ['10.0.1.7', 80] }],
                    ],
                  },
                },
              },
            },
          },
        ],
      },
    },
    {
      rule: {
        family: 'ip',
        table: 'kube-ovn',
        chain: 'dnat-a824d77eccbb',
        handle: 9,
        expr: [
          { match: { op: '==', left: { meta: { key: 'l4proto' } }, right: 'udp' } },
          {
            dnat: {
              family: 'ip',
              addr: { map: { key: { numgen: { mode: 'random', mod: 1, offset: 0 } }, data: { set: [[0, { concat: ['10.0.1.6', 53] }]] } } },
            },
          },
        ],
      },
    },
  ],
});

type Item = Record<string, Record<string, unknown>>;

function edit(fn: (items: Item[]) => Item[]): NftTableDump {
  const doc = JSON.parse(REAL_KUBE_OVN) as { nftables: Item[] };
  return parseTableListing(JSON.stringify({ nftables: fn(doc.nftables) }), 'ip', 'kube-ovn');
}

const real = (): NftTableDump => parseTableListing(REAL_KUBE_OVN, 'ip', 'kube-ovn');
const lines = (script: string): string[] => script.split('\n').filter((l) => l !== '');

describe('share DNAT objects', () => {
  it('names the chain dnat- + 12 hex of md5(eip:port:protocol as received)', () => {
    const md5 = createHash('md5').update('172.20.0.10:8080:TCP').digest('hex').slice(0, 12);
    expect(shareDnatChainName(ITEMS[0]!)).toBe(`dnat-${md5}`);
    expect(shareDnatChainName(ITEMS[0]!)).toBe(TCP_CHAIN);
    expect(shareDnatChainName({ ...ITEMS[0]!, protocolText: 'tcp' })).not.toBe(TCP_CHAIN);
  });

  it('renders the SPEC objects exactly from nothing', () => {
    const plan = renderShareDnat(ITEMS, null);
    expect(lines(plan.main)).toEqual([
      'add table ip kube-ovn',
      'add map ip kube-ovn service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }',
      'add chain ip kube-ovn prerouting { type nat hook prerouting priority -150; policy accept; }',
      `add chain ip kube-ovn ${TCP_CHAIN}`,
      `add chain ip kube-ovn ${UDP_CHAIN}`,
      `add element ip kube-ovn service-ips { 172.20.0.10 . tcp . 8080 : goto ${TCP_CHAIN}, 172.20.0.10 . udp . 5353 : goto ${UDP_CHAIN} }`,
      'add rule ip kube-ovn prerouting ip daddr . meta l4proto . th dport vmap @service-ips',
      `add rule ip kube-ovn ${TCP_CHAIN} meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.0.1.6 . 80, 1 : 10.0.1.7 . 80 }`,
      `add rule ip kube-ovn ${UDP_CHAIN} meta l4proto udp dnat ip addr . port to numgen random mod 1 map { 0 : 10.0.1.6 . 53 }`,
    ]);
    expect(plan.staleChains).toEqual([]);
  });

  it('keeps the backends in the given order', () => {
    const d: ShareDnat = {
      ...ITEMS[0]!,
      backends: [
        { ip: '10.0.1.9', port: 1 },
        { ip: '10.0.1.2', port: 2 },
        { ip: '10.0.1.5', port: 3 },
      ],
    };
    expect(shareRuleText(d)).toBe('meta l4proto tcp dnat ip addr . port to numgen random mod 3 map { 0 : 10.0.1.9 . 1, 1 : 10.0.1.2 . 2, 2 : 10.0.1.5 . 3 }');
  });

  it('does nothing without items and without a table', () => {
    expect(renderShareDnat([], null)).toEqual({ main: '', staleChains: [], changes: 0 });
  });
});

describe('share DNAT against a real read-back', () => {
  it('renders nothing for what it wrote (idempotence)', () => {
    expect(renderShareDnat(ITEMS, real())).toEqual({ main: '', staleChains: [], changes: 0 });
  });

  it('reads the items back, with the protocol spelling that names the chain', () => {
    expect(shareDnatsFromKernel(real())).toEqual(ITEMS);
    expect(shareDnatsFromKernel(null)).toEqual([]);
  });

  it('recognises only its own rule shape', () => {
    const chain = real().chains.get(TCP_CHAIN);
    expect(recogniseShareRule(chain!.rules[0]!.expr)).toEqual({ protocol: 'tcp', backends: ITEMS[0]!.backends });
    expect(recogniseShareRule([{ accept: null }])).toBeNull();
  });

  it('new backends replace the chain rule atomically (flush + add), no map change', () => {
    const items = [{ ...ITEMS[0]!, backends: [{ ip: '10.0.1.8', port: 80 }] }, ITEMS[1]!];
    expect(renderShareDnat(items, real())).toEqual({
      main: `flush chain ip kube-ovn ${TCP_CHAIN}\nadd rule ip kube-ovn ${TCP_CHAIN} meta l4proto tcp dnat ip addr . port to numgen random mod 1 map { 0 : 10.0.1.8 . 80 }\n`,
      staleChains: [],
      changes: 2,
    });
  });

  it('a new identity adds its chain and one element', () => {
    const extra: ShareDnat = { eip: '172.20.0.11', port: 443, protocol: 'tcp', protocolText: 'tcp', backends: [{ ip: '10.0.1.6', port: 443 }] };
    const chain = shareDnatChainName(extra);
    expect(lines(renderShareDnat([...ITEMS, extra], real()).main)).toEqual([
      `add chain ip kube-ovn ${chain}`,
      `add element ip kube-ovn service-ips { 172.20.0.11 . tcp . 443 : goto ${chain} }`,
      `add rule ip kube-ovn ${chain} meta l4proto tcp dnat ip addr . port to numgen random mod 1 map { 0 : 10.0.1.6 . 443 }`,
    ]);
  });

  it('a removed identity: element deleted and chain flushed now, chain deleted in a second transaction', () => {
    const plan = renderShareDnat([ITEMS[0]!], real());
    expect(lines(plan.main)).toEqual(['delete element ip kube-ovn service-ips { 172.20.0.10 . udp . 5353 }', `flush chain ip kube-ovn ${UDP_CHAIN}`]);
    expect(plan.staleChains).toEqual([UDP_CHAIN]);
    expect(plan.changes).toBe(2);
  });

  it('a stale chain left behind (flushed, unreferenced: a refused delete) is deleted by the next sync', () => {
    const leftover = edit((items) => [...items, { chain: { family: 'ip', table: 'kube-ovn', name: 'dnat-0123456789ab', handle: 50 } }]);
    expect(renderShareDnat(ITEMS, leftover)).toEqual({ main: '', staleChains: ['dnat-0123456789ab'], changes: 1 });
  });

  it('a protocol spelled otherwise names another chain: element retargeted, old chain stale', () => {
    const items = [{ ...ITEMS[0]!, protocolText: 'tcp' }, ITEMS[1]!];
    const chain = shareDnatChainName(items[0]!);
    const plan = renderShareDnat(items, real());
    expect(lines(plan.main)).toEqual([
      `add chain ip kube-ovn ${chain}`,
      'delete element ip kube-ovn service-ips { 172.20.0.10 . tcp . 8080 }',
      `add element ip kube-ovn service-ips { 172.20.0.10 . tcp . 8080 : goto ${chain} }`,
      `add rule ip kube-ovn ${chain} meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.0.1.6 . 80, 1 : 10.0.1.7 . 80 }`,
      `flush chain ip kube-ovn ${TCP_CHAIN}`,
    ]);
    expect(plan.staleChains).toEqual([TCP_CHAIN]);
  });

  it('repairs a chain someone flushed, a vmap rule someone deleted, a missing map', () => {
    const flushed = edit((items) => items.filter((i) => i['rule']?.['chain'] !== TCP_CHAIN));
    expect(lines(renderShareDnat(ITEMS, flushed).main)).toEqual([
      `add rule ip kube-ovn ${TCP_CHAIN} meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.0.1.6 . 80, 1 : 10.0.1.7 . 80 }`,
    ]);
    const noVmap = edit((items) => items.filter((i) => i['rule']?.['chain'] !== 'prerouting'));
    expect(lines(renderShareDnat(ITEMS, noVmap).main)).toEqual(['add rule ip kube-ovn prerouting ip daddr . meta l4proto . th dport vmap @service-ips']);
  });

  it('never touches objects someone else put in table kube-ovn', () => {
    const foreign = edit((items) => [
      ...items,
      { chain: { family: 'ip', table: 'kube-ovn', name: 'other', handle: 60 } },
      { chain: { family: 'ip', table: 'kube-ovn', name: 'dnat-notours', handle: 61 } },
      { set: { family: 'ip', table: 'kube-ovn', name: 'theirs', type: 'ipv4_addr', handle: 62 } },
      { rule: { family: 'ip', table: 'kube-ovn', chain: 'prerouting', handle: 63, expr: [{ accept: null }] } },
      { rule: { family: 'ip', table: 'kube-ovn', chain: 'other', handle: 64, expr: [{ accept: null }] } },
    ]);
    expect(renderShareDnat(ITEMS, foreign)).toEqual({ main: '', staleChains: [], changes: 0 });
    const removal = renderShareDnat([], foreign);
    expect(removal.main).not.toMatch(/other|notours|theirs|handle 63/);
    expect(removal.staleChains).toEqual([TCP_CHAIN, UDP_CHAIN]);
  });
});
