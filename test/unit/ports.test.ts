/**
 * Port-range DNAT and SNAT pools without a kernel: the legacy parser, the schemas, the overlap
 * conflicts of the operations, the nft and iptables renderings and their read-back (including the
 * JSON nft 1.0.6 really lists for these rules), the partial sync's choice, and the conntrack
 * filter of a range.
 */
import { describe, expect, it } from 'vitest';
import { parseDnatAdd, parseDnatDel } from '../../src/model/legacy.js';
import { dnatKey, dnatSchema, snatSchema, type Dnat, type Snat } from '../../src/model/rules.js';
import { dnatSpec, snatSpecs } from '../../src/dataplane/netfilter/iptables/ruleText.js';
import { ConflictError, ValidationError } from '../../src/model/errors.js';
import { worded } from '../../src/engine/conflicts.js';
import { addDnats, addSnats, delDnats } from '../../src/state/operations.js';
import { emptyState } from '../../src/state/state.js';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { CHAIN, SET, desiredFamily, ruleJson, ruleText } from '../../src/dataplane/netfilter/nft/render.js';
import { recogniseRule } from '../../src/dataplane/netfilter/nft/readback.js';
import { planPartial } from '../../src/dataplane/netfilter/nft/partial.js';
import { adoptFromSave } from '../../src/dataplane/netfilter/iptables/adopt.js';
import { desiredTables } from '../../src/dataplane/netfilter/iptables/plan.js';
import { parseSave } from '../../src/dataplane/netfilter/iptables/save.js';
import { matches } from '../../src/dataplane/conntrack.js';
import { normaliseDesired } from '../../src/api/stateDoc.js';
import { HttpError } from '../../src/api/errors.js';
import type { NatgwRule } from '../../src/dataplane/netfilter/nft/types.js';

const EIP = '172.20.0.10';
const EIP2 = '172.20.0.11';
const RANGE: Dnat = { eip: EIP, port: 8000, portEnd: 8100, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8000 };
const POOL: Snat = { eip: EIP, cidr: '10.0.1.0/24', randomFully: true, eips: [EIP, EIP2] };

const validation = (fn: () => unknown): string => {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(ValidationError);
    return (e as Error).message;
  }
  throw new Error('expected a ValidationError');
};

describe('legacy dnat rules with a port range', () => {
  it('parses a range onto the same range, or onto its first port', () => {
    expect(parseDnatAdd(`${EIP},8000-8100,tcp,10.0.1.6,8000-8100`)).toEqual(RANGE);
    expect(parseDnatAdd(`${EIP},8000-8100,TCP,10.0.1.6,8000`)).toEqual(RANGE);
    expect(parseDnatDel(`${EIP},8000-8100,tcp`)).toEqual({ eip: EIP, port: 8000, portEnd: 8100, protocol: 'tcp' });
    // A single port stays exactly as before: no portEnd key at all.
    expect(parseDnatAdd(`${EIP},8080,tcp,10.0.1.6,80`)).toEqual({ eip: EIP, port: 8080, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 });
  });

  it('refuses a shifted, reversed or half range with the reason', () => {
    expect(validation(() => parseDnatAdd(`${EIP},8000-8100,tcp,10.0.1.6,9000-9100`))).toContain('nftables NAT cannot shift a port range');
    expect(validation(() => parseDnatAdd(`${EIP},8100-8000,tcp,10.0.1.6,8100-8000`))).toContain("port '8100-8000' is not a port range a-b");
    expect(validation(() => parseDnatAdd(`${EIP},8000-70000,tcp,10.0.1.6,8000`))).toContain('is not a port range');
    expect(validation(() => parseDnatAdd(`${EIP},8000,tcp,10.0.1.6,8000-8001`))).toContain("is a range but port '8000' is not");
  });
});

describe('schemas', () => {
  it('a DNAT range must map onto its own ports', () => {
    expect(dnatSchema.safeParse({ ...RANGE, internalPort: 9000 }).success).toBe(false);
    expect(dnatSchema.safeParse({ ...RANGE, portEnd: 8000 }).success).toBe(false);
    expect(dnatSchema.parse(RANGE)).toEqual(RANGE);
  });

  it('a SNAT pool starts with its eip, has no repeats and one family', () => {
    expect(snatSchema.parse(POOL)).toEqual(POOL);
    expect(snatSchema.safeParse({ ...POOL, eips: [EIP2, EIP] }).success).toBe(false);
    expect(snatSchema.safeParse({ ...POOL, eips: [EIP, EIP] }).success).toBe(false);
    expect(snatSchema.safeParse({ ...POOL, eips: [EIP, 'fd00::1'] }).success).toBe(false);
    expect(snatSchema.safeParse({ ...POOL, eips: [EIP] }).success).toBe(false);
  });
});

describe('overlap conflicts', () => {
  const base = emptyState('eth0', 'net1');
  const single = (port: number, protocol: 'tcp' | 'udp' = 'tcp'): Dnat => ({ eip: EIP, port, protocol, internalIp: '10.0.1.7', internalPort: port });
  const conflict = (fn: () => unknown): string => {
    try {
      fn();
    } catch (e) {
      expect(e).toBeInstanceOf(ConflictError);
      return (worded(e) as Error).message;
    }
    throw new Error('expected a ConflictError');
  };

  it('a range over an existing single port names that rule', () => {
    const s = addDnats(base, [single(8050)]).state;
    expect(conflict(() => addDnats(s, [RANGE]))).toBe(
      `dnat (${EIP}, 8000-8100, tcp) overlaps the existing rule: -A SHARED_DNAT -d ${EIP}/32 -p tcp -m tcp --dport 8050 -j DNAT --to-destination 10.0.1.7:8050, but expected 10.0.1.6:8000`,
    );
  });

  it('a single port or another range inside a range names the range', () => {
    const s = addDnats(base, [RANGE]).state;
    const holder = `-A SHARED_DNAT -d ${EIP}/32 -p tcp -m tcp --dport 8000:8100 -j DNAT --to-destination 10.0.1.6:8000-8100`;
    expect(conflict(() => addDnats(s, [single(8100)]))).toContain(holder);
    expect(conflict(() => addDnats(s, [{ ...RANGE, port: 7000, portEnd: 8000, internalPort: 7000 }]))).toContain(holder);
    // Within one batch too.
    expect(conflict(() => addDnats(base, [single(8000), RANGE]))).toContain('--dport 8000 -j DNAT');
  });

  it('the same range again is a no-op; other protocols, eips and neighbour ports are free', () => {
    const s = addDnats(base, [RANGE]).state;
    expect(addDnats(s, [RANGE]).state).toBe(s);
    const t = addDnats(s, [single(7999), single(8101), single(8050, 'udp'), { ...single(8050), eip: EIP2 }]).state;
    expect(t.dnats).toHaveLength(5);
  });

  it('deleting a range frees its ports, and flushes conntrack for the whole range', () => {
    const s = addDnats(base, [RANGE]).state;
    const d = delDnats(s, [{ eip: EIP, port: 8000, portEnd: 8100, protocol: 'tcp' }]);
    expect(d.state.dnats).toEqual([]);
    expect(d.effects).toEqual([{ kind: 'conntrack-flush', dst: EIP, protocol: 'tcp', port: 8000, portEnd: 8100 }]);
    expect(addDnats(d.state, [single(8050)]).state.dnats).toHaveLength(1);
    // A single port's identity is not the range's.
    expect(delDnats(s, [{ eip: EIP, port: 8000, protocol: 'tcp' }]).state.dnats).toHaveLength(1);
    expect(dnatKey(RANGE)).not.toBe(dnatKey(single(8000)));
  });

  it('a whole declarative state with overlapping DNATs is refused (400) naming the holder', () => {
    const s = { ...base, dnats: [RANGE, single(8100)] };
    let err: unknown;
    try {
      normaliseDesired(s);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(HttpError);
    expect((err as HttpError).status).toBe(400);
    expect((err as Error).message).toContain(
      'dnats: dnat (172.20.0.10, 8100, tcp) overlaps the existing rule: -A SHARED_DNAT -d 172.20.0.10/32 -p tcp -m tcp --dport 8000:8100',
    );
    expect(normaliseDesired({ ...base, dnats: [RANGE, single(8101)] }).dnats).toHaveLength(2);
  });

  it('SNAT pools keep longest-prefix-first order', () => {
    const s = addSnats(base, [POOL, { eip: EIP2, cidr: '10.0.1.7/32', randomFully: false }]).state;
    expect(s.snats.map((x) => x.cidr)).toEqual(['10.0.1.7/32', '10.0.1.0/24']);
  });
});

/** What `nft -j list` printed for these rules (nft 1.0.6, kernel 6.x). */
const KERNEL_RANGE_JSON = [
  { match: { op: '==', left: { payload: { protocol: 'ip', field: 'daddr' } }, right: EIP } },
  { match: { op: '==', left: { payload: { protocol: 'tcp', field: 'dport' } }, right: { range: [8000, 8100] } } },
  { dnat: { addr: '10.0.1.6', port: { range: [8000, 8100] } } },
];
const KERNEL_POOL_JSON = [
  { match: { op: '==', left: { payload: { protocol: 'ip', field: 'saddr' } }, right: { prefix: { addr: '10.0.1.0', len: 24 } } } },
  {
    snat: {
      addr: {
        map: {
          key: { numgen: { mode: 'inc', mod: 2, offset: 0 } },
          data: {
            set: [
              [0, EIP],
              [1, EIP2],
            ],
          },
        },
      },
      flags: 'fully-random',
    },
  },
];

describe('nftables', () => {
  const tables: NatTables = {
    vpcIf: 'eth0',
    extIf: 'net1',
    eips: [EIP, EIP2],
    snats: [POOL],
    dnats: [RANGE, { eip: EIP, port: 80, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8080 }],
    fips: [],
  };

  it('renders a range as a prerouting rule after the map rule, and single ports as map elements only', () => {
    const spec = desiredFamily(tables, 'ip');
    const pre = spec?.chains.find((c) => c.name === CHAIN.prerouting);
    expect(pre?.rules.map((r) => r.text)).toEqual([
      'dnat ip to ip daddr map @fip_dnat',
      'meta l4proto { tcp, udp } dnat ip addr . port to ip daddr . meta l4proto . th dport map @port_dnat',
      `ip daddr ${EIP} tcp dport 8000-8100 dnat ip to 10.0.1.6:8000-8100`,
    ]);
    expect([...(spec?.sets.find((s) => s.name === SET.portDnat)?.elements.keys() ?? [])]).toEqual([`${EIP} . tcp . 80`]);
    const snat = spec?.chains.find((c) => c.name === 'snat_10_0_1_0_24')?.rules[0];
    expect(snat?.text).toBe(`ip saddr 10.0.1.0/24 snat ip to numgen inc mod 2 map { 0 : ${EIP}, 1 : ${EIP2} } fully-random`);
  });

  it('recognises the JSON the kernel lists for a range and a pool, and nothing slightly different', () => {
    const range: NatgwRule = { kind: 'range-dnat', eip: EIP, protocol: 'tcp', port: 8000, portEnd: 8100, internalIp: '10.0.1.6' };
    const pool: NatgwRule = { kind: 'snat', cidr: '10.0.1.0/24', eip: EIP, randomFully: true, pool: [EIP, EIP2] };
    expect(recogniseRule(KERNEL_RANGE_JSON, 'ip')).toEqual(range);
    expect(recogniseRule(KERNEL_POOL_JSON, 'ip')).toEqual(pool);
    expect(recogniseRule(ruleJson(range, 'ip'), 'ip')).toEqual(range);
    const shifted = structuredClone(KERNEL_RANGE_JSON);
    (shifted[2] as { dnat: { port: { range: number[] } } }).dnat.port.range = [9000, 9100];
    expect(recogniseRule(shifted, 'ip')).toBeNull();
    const thirdEip = structuredClone(KERNEL_POOL_JSON) as Array<{ snat?: { addr: { map: { data: { set: unknown[] } } } } }>;
    thirdEip[1]?.snat?.addr.map.data.set.push([2, '172.20.0.12']);
    expect(recogniseRule(thirdEip, 'ip')).toBeNull();
  });

  it('IPv6 (API only): a range and a pool render and read back in table ip6 natgw', () => {
    const range: NatgwRule = { kind: 'range-dnat', eip: 'fd00:20::10', protocol: 'udp', port: 5000, portEnd: 5010, internalIp: 'fd00:1::6' };
    const pool: NatgwRule = { kind: 'snat', cidr: 'fd00:1::/64', eip: 'fd00:20::10', randomFully: false, pool: ['fd00:20::10', 'fd00:20::11'] };
    expect(ruleText(range, 'ip6')).toBe('ip6 daddr fd00:20::10 udp dport 5000-5010 dnat ip6 to [fd00:1::6]:5000-5010');
    expect(ruleText(pool, 'ip6')).toBe('ip6 saddr fd00:1::/64 snat ip6 to numgen inc mod 2 map { 0 : fd00:20::10, 1 : fd00:20::11 }');
    expect(recogniseRule(ruleJson(range, 'ip6'), 'ip6')).toEqual(range);
    expect(recogniseRule(ruleJson(pool, 'ip6'), 'ip6')).toEqual(pool);
    expect(dnatSpec({ eip: 'fd00:20::10', port: 5000, portEnd: 5010, protocol: 'udp', internalIp: 'fd00:1::6', internalPort: 5000 })).toBe(
      '-d fd00:20::10/128 -p udp -m udp --dport 5000:5010 -j DNAT --to-destination [fd00:1::6]:5000-5010',
    );
  });

  it('a partial sync hands a range change to a full sync, and inserts a pool rule in place', () => {
    const prev: NatTables = { ...tables, dnats: [], snats: [] };
    const view = { tables: prev, families: new Set(['ip'] as const) };
    expect(planPartial(view, { ...prev, dnats: [RANGE] })).toBeNull();
    const p = planPartial(view, { ...prev, snats: [POOL] });
    expect(p?.tx.text()).toContain(
      `add rule ip natgw snat_10_0_1_0_24 ip saddr 10.0.1.0/24 snat ip to numgen inc mod 2 map { 0 : ${EIP}, 1 : ${EIP2} } fully-random`,
    );
  });
});

describe('iptables', () => {
  it('renders a range with --dport a:b and a pool as nth rules, and adopts both back', () => {
    expect(dnatSpec(RANGE)).toBe(`-d ${EIP}/32 -p tcp -m tcp --dport 8000:8100 -j DNAT --to-destination 10.0.1.6:8000-8100`);
    const three: Snat = { ...POOL, randomFully: false, eips: [EIP, '172.20.0.30', EIP2] };
    expect(snatSpecs(three, 'net1')).toEqual([
      `-s 10.0.1.0/24 -o net1 -m statistic --mode nth --every 3 --packet 0 -j SNAT --to-source ${EIP}`,
      '-s 10.0.1.0/24 -o net1 -m statistic --mode nth --every 2 --packet 0 -j SNAT --to-source 172.20.0.30',
      `-s 10.0.1.0/24 -o net1 -j SNAT --to-source ${EIP2}`,
    ]);
    const want: NatTables = {
      vpcIf: 'eth0',
      extIf: 'net1',
      eips: [EIP],
      fips: [],
      snats: [{ eip: EIP2, cidr: '10.0.1.7/32', randomFully: false }, three, POOL, { eip: EIP, cidr: '0.0.0.0/0', randomFully: false }],
      dnats: [RANGE],
    };
    const t = desiredTables(want);
    const save = (owned: ReadonlyMap<string, readonly string[]>) =>
      parseSave([...owned].flatMap(([c, rules]) => [`:${c} - [0:0]`, ...rules.map((r) => `-A ${c} ${r}`)]).join('\n'));
    const adopted = adoptFromSave(save(t.nat.owned), save(t.mangle.owned));
    expect(adopted?.snats).toEqual(want.snats);
    expect(adopted?.dnats).toEqual([RANGE]);
  });

  it('a broken pool run (a line missing) is not adopted as a pool', () => {
    const lines = snatSpecs({ ...POOL, eips: [EIP, '172.20.0.30', EIP2] }, 'net1');
    const nat = parseSave([':SNAT_FILTER - [0:0]', ':SHARED_SNAT - [0:0]', ...[lines[0], lines[2]].map((r) => `-A SHARED_SNAT ${r}`)].join('\n'));
    const adopted = adoptFromSave(nat, parseSave(''));
    // The surviving plain line is adopted as what it is; the half pool is not guessed at.
    expect(adopted?.snats).toEqual([{ eip: EIP2, cidr: '10.0.1.0/24', randomFully: true }]);
  });
});

describe('conntrack filter of a range', () => {
  it('matches every port of the range and no other', () => {
    const f = { dst: EIP, protocol: 'tcp' as const, port: 8000, portEnd: 8100 };
    expect(matches(f, { protocol: 'tcp', original: { src: '10.0.1.6', dst: EIP, dport: 8000 } })).toBe(true);
    expect(matches(f, { protocol: 'tcp', original: { src: '10.0.1.6', dst: EIP, dport: 8100 } })).toBe(true);
    expect(matches(f, { protocol: 'tcp', original: { src: '10.0.1.6', dst: EIP, dport: 8101 } })).toBe(false);
    expect(matches(f, { protocol: 'udp', original: { src: '10.0.1.6', dst: EIP, dport: 8050 } })).toBe(false);
  });
});
