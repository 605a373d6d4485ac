/**
 * The nftables renderer and read-back, pure: every object, idempotence against a REAL read-back
 * (test/fixtures/nft: `nft -j list table …` output of nft 1.0.6 for WANT, captured from the
 * kernel), element-level diffs, SNAT layout and order, FIP first binding, interface renames,
 * repairs, the conversion of older layouts.
 */
import fs from 'node:fs';
import { describe, expect, it } from 'vitest';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { hasSkeleton, natTablesFromKernel, natgwKernel, parseTableListing, recogniseRule } from '../../src/dataplane/netfilter/nft/readback.js';
import type { NatgwKernel } from '../../src/dataplane/netfilter/nft/types.js';
import { NftRenderError, desiredFamily, planNatgw, removeAllTx, ruleText, textPlan } from '../../src/dataplane/netfilter/nft/render.js';

const renderNatgw = (want: NatTables, have: NatgwKernel) => textPlan(planNatgw(want, have));
const renderRemoveAll = (have: NatgwKernel) => removeAllTx(have).text();

/**
 * The state the fixtures were captured for (v4 and v6, two EIPs binding one internal IP; SNAT CIDRs
 * of one EIP, plain and fully-random, as data-map elements, and one of two EIPs as a chain).
 */
const WANT: NatTables = {
  vpcIf: 'eth0',
  extIf: 'net1',
  eips: ['172.20.0.10', '172.20.0.11', 'fd00:20::10'],
  snats: [
    { eip: '172.20.0.10', cidr: '10.0.1.6/32', randomFully: true },
    { eip: 'fd00:20::10', cidr: 'fd00:1::/64', randomFully: false },
    { eip: '172.20.0.10', cidr: '10.0.1.0/24', randomFully: false },
    { eip: '172.20.0.11', cidr: '10.0.1.0/24', randomFully: false },
    { eip: '172.20.0.11', cidr: '0.0.0.0/0', randomFully: true },
  ],
  dnats: [
    { eip: '172.20.0.10', port: 80, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8080 },
    { eip: '172.20.0.10', port: 53, protocol: 'udp', internalIp: '10.0.1.7', internalPort: 53 },
    { eip: 'fd00:20::10', port: 443, protocol: 'tcp', internalIp: 'fd00:1::6', internalPort: 8443 },
  ],
  fips: [
    { eip: '172.20.0.11', internalIp: '10.0.1.7' },
    { eip: '172.20.0.12', internalIp: '10.0.1.7' },
  ],
};

/**
 * `nft -j list table ip natgw` and `ip6 natgw` (nft 1.0.6, Linux 6.x) of a fresh namespace after
 * natgw's full render of WANT, captured from the kernel: this layout (test/fixtures/nft/natgw-*.json),
 * and the per-CIDR-chain layout of the version before SNAT data maps (natgw-chains-*.json, rendered
 * by that version for the same WANT), which a full sync converts.
 */
const listing = (name: string): string => fs.readFileSync(new URL(`../fixtures/nft/${name}.json`, import.meta.url), 'utf8');
const REAL_IP = listing('natgw-ip');
const REAL_IP6 = listing('natgw-ip6');
const CHAINS_IP = listing('natgw-chains-ip');
const CHAINS_IP6 = listing('natgw-chains-ip6');

/**
 * Handles in REAL_IP: shared_snat's three dispatch rules per length, d (CIDR chains), t (data
 * map), f (data map, fully-random) for /32, /24 and /0; the two rules of 10.0.1.0/24's chain,
 * snat24a (172.20.0.10) and snat24b (172.20.0.11).
 */
const H = {
  mark: 22,
  fipDnat: 26,
  portDnat: 28,
  fipSnat: 29,
  jump: 30,
  hairpin: 31,
  d32: 32,
  t32: 33,
  f32: 34,
  d24: 35,
  t24: 36,
  f24: 37,
  d0: 38,
  t0: 39,
  f0: 40,
  snat24a: 41,
  snat24b: 42,
} as const;
/** Handles in REAL_IP6. */
const H6 = { mark: 14, jump: 22, hairpin: 23 } as const;

type Item = Record<string, Record<string, unknown>>;

/** The fixture with `fn` applied to its item list (a kernel someone changed behind natgw's back). */
function edit(fixture: string, fn: (items: Item[]) => Item[]): string {
  const doc = JSON.parse(fixture) as { nftables: Item[] };
  return JSON.stringify({ nftables: fn(doc.nftables) });
}

const withoutRule = (handle: number) => (items: Item[]) => items.filter((i) => i['rule']?.['handle'] !== handle);

function kernel(ip: string | null, ip6: string | null = REAL_IP6): NatgwKernel {
  return natgwKernel(ip === null ? null : parseTableListing(ip, 'ip', 'natgw'), ip6 === null ? null : parseTableListing(ip6, 'ip6', 'natgw'));
}

const lines = (script: string): string[] => script.split('\n').filter((l) => l !== '');

describe('render from nothing', () => {
  const plan = renderNatgw(WANT, { ip: null, ip6: null });
  const script = lines(plan.script);

  it('declares every object of both families', () => {
    for (const fam of ['ip', 'ip6'] as const) {
      const addr = fam === 'ip' ? 'ipv4_addr' : 'ipv6_addr';
      expect(script).toContain(`add table ${fam} natgw`);
      expect(script).toContain(`add map ${fam} natgw fip_dnat { type ${addr} : ${addr}; }`);
      expect(script).toContain(`add map ${fam} natgw fip_snat { type ${addr} : ${addr}; }`);
      expect(script).toContain(`add map ${fam} natgw port_dnat { type ${addr} . inet_proto . inet_service : ${addr} . inet_service; }`);
      expect(script).toContain(`add set ${fam} natgw hairpin_eips { type ${addr}; }`);
      expect(script).toContain(`add chain ${fam} natgw vpc_mark { type filter hook prerouting priority mangle; policy accept; }`);
      expect(script).toContain(`add chain ${fam} natgw prerouting { type nat hook prerouting priority dstnat; policy accept; }`);
      expect(script).toContain(`add chain ${fam} natgw postrouting { type nat hook postrouting priority srcnat; policy accept; }`);
      expect(script).toContain(`add chain ${fam} natgw shared_snat`);
    }
  });

  it('fills the maps: DNAT by (eip, proto, port), FIP both ways, hairpin EIPs', () => {
    expect(script).toContain('add element ip natgw port_dnat { 172.20.0.10 . udp . 53 : 10.0.1.7 . 53, 172.20.0.10 . tcp . 80 : 10.0.1.6 . 8080 }');
    expect(script).toContain('add element ip6 natgw port_dnat { fd00:20::10 . tcp . 443 : fd00:1::6 . 8443 }');
    expect(script).toContain('add element ip natgw fip_dnat { 172.20.0.11 : 10.0.1.7, 172.20.0.12 : 10.0.1.7 }');
    expect(script).toContain('add element ip natgw hairpin_eips { 172.20.0.10, 172.20.0.11 }');
    expect(script).toContain('add element ip6 natgw hairpin_eips { fd00:20::10 }');
  });

  it('binds an internal IP bound by several EIPs to the lowest of them for SNAT, whatever their order', () => {
    expect(script).toContain('add element ip natgw fip_snat { 10.0.1.7 : 172.20.0.11 }');
    const swapped = renderNatgw({ ...WANT, fips: [...WANT.fips].reverse() }, { ip: null, ip6: null });
    expect(lines(swapped.script)).toContain('add element ip natgw fip_snat { 10.0.1.7 : 172.20.0.11 }');
  });

  it('orders the base chains as the script does: FIP before DNAT, FIP SNAT before shared SNAT before hairpin', () => {
    const rulesOf = (chain: string) =>
      script.filter((l) => l.startsWith(`add rule ip natgw ${chain} `)).map((l) => l.slice(`add rule ip natgw ${chain} `.length));
    expect(rulesOf('vpc_mark')).toEqual(['iifname "eth0" meta mark set meta mark | 0x1']);
    expect(rulesOf('prerouting')).toEqual([
      'dnat ip to ip daddr map @fip_dnat',
      'meta l4proto { tcp, udp } dnat ip addr . port to ip daddr . meta l4proto . th dport map @port_dnat',
    ]);
    expect(rulesOf('postrouting')).toEqual([
      'snat ip to ip saddr map @fip_snat',
      'oifname "net1" jump shared_snat',
      'oifname "eth0" meta mark & 0x1 == 0x1 ct status dnat ct original ip daddr @hairpin_eips snat ip to ct original ip daddr fully-random',
    ]);
    // Three dispatch rules per prefix length, longest first (a full-length mask is written as
    // none): CIDR chains, then the EIPs of single-EIP CIDRs, plain and fully-random.
    const dispatch = (mask: string, len: number) => [
      `ip saddr${mask} vmap @snat_len_${len}`,
      `snat ip to ip saddr${mask} map @snat_to_len_${len}`,
      `snat ip to ip saddr${mask} map @snat_to_fr_len_${len} fully-random`,
    ];
    expect(rulesOf('shared_snat')).toEqual([...dispatch('', 32), ...dispatch(' & 255.255.255.0', 24), ...dispatch(' & 0.0.0.0', 0)]);
    // A CIDR of several EIPs keeps its rules in order in its own chain; one of a single EIP is an element.
    expect(rulesOf('snat_10_0_1_0_24')).toEqual(['ip saddr 10.0.1.0/24 snat ip to 172.20.0.10', 'ip saddr 10.0.1.0/24 snat ip to 172.20.0.11']);
    expect(script.filter((l) => /^add chain ip6? natgw snat_/.test(l))).toEqual(['add chain ip natgw snat_10_0_1_0_24']);
    expect(script).toContain('add element ip natgw snat_len_24 { 10.0.1.0 : goto snat_10_0_1_0_24 }');
    expect(script).toContain('add element ip natgw snat_to_fr_len_32 { 10.0.1.6 : 172.20.0.10 }');
    expect(script).toContain('add element ip natgw snat_to_fr_len_0 { 0.0.0.0 : 172.20.0.11 }');
    expect(script).toContain('add element ip6 natgw snat_to_len_64 { fd00:1:: : fd00:20::10 }');
    expect(script).toContain('add map ip6 natgw snat_to_len_64 { type ipv6_addr : ipv6_addr; }');
  });

  it('creates objects before the rules that use them, all in one script', () => {
    const firstRule = script.findIndex((l) => l.startsWith('add rule'));
    const lastCreate = Math.max(...script.map((l, i) => (/^add (table|map|set|chain) /.test(l) ? i : -1)));
    expect(lastCreate).toBeLessThan(firstRule);
    expect(plan.changes).toBeGreaterThan(30);
  });

  it('leaves the ip6 table out while no IPv6 object exists', () => {
    const v4only: NatTables = { ...WANT, eips: ['172.20.0.10'], snats: [], dnats: [], fips: [] };
    const s = renderNatgw(v4only, { ip: null, ip6: null }).script;
    expect(s).toContain('add table ip natgw');
    expect(s).not.toContain('ip6');
    expect(desiredFamily(v4only, 'ip6')).toBeNull();
  });

  it('renders the skeleton for an empty state (init)', () => {
    const s = lines(renderNatgw({ vpcIf: 'eth0', extIf: 'net1', eips: [], snats: [], dnats: [], fips: [] }, { ip: null, ip6: null }).script);
    expect(s.filter((l) => l.startsWith('add element'))).toEqual([]);
    // The three base chains' rules: the VPC mark, FIP and port DNAT, FIP SNAT, the SNAT jump and hairpin.
    expect(s.filter((l) => l.startsWith('add rule'))).toHaveLength(6);
  });
});

describe('read-back of real nft JSON', () => {
  it('renders NOTHING against the read-back of its own output (idempotence)', () => {
    const plan = renderNatgw(WANT, kernel(REAL_IP));
    expect(plan).toEqual({ script: '', changes: 0 });
  });

  it('recognises every rule natgw wrote', () => {
    const dump = parseTableListing(REAL_IP, 'ip', 'natgw');
    for (const chain of dump.chains.values()) {
      for (const r of chain.rules) expect(recogniseRule(r.expr, 'ip'), `${chain.name} #${r.handle}`).not.toBeNull();
    }
  });

  it('reconstructs NatTables for adoption (interfaces, EIPs, SNAT order, DNATs, FIPs with the SNAT winner first)', () => {
    const t = natTablesFromKernel(kernel(REAL_IP));
    expect(t).not.toBeNull();
    expect(t?.vpcIf).toBe('eth0');
    expect(t?.extIf).toBe('net1');
    expect(t?.eips).toEqual(['172.20.0.10', '172.20.0.11', 'fd00:20::10']);
    // From data-map elements (cidr = key/len, eip = value, fully-random by map) and CIDR chains alike.
    expect(t?.snats).toEqual([
      { eip: 'fd00:20::10', cidr: 'fd00:1::/64', randomFully: false },
      { eip: '172.20.0.10', cidr: '10.0.1.6/32', randomFully: true },
      { eip: '172.20.0.10', cidr: '10.0.1.0/24', randomFully: false },
      { eip: '172.20.0.11', cidr: '10.0.1.0/24', randomFully: false },
      { eip: '172.20.0.11', cidr: '0.0.0.0/0', randomFully: true },
    ]);
    const byKey = <T extends { eip: string }>(xs: readonly T[]) => [...xs].sort((a, b) => JSON.stringify(a).localeCompare(JSON.stringify(b)));
    expect(byKey(t?.dnats ?? [])).toEqual(byKey(WANT.dnats));
    expect(t?.fips).toEqual(WANT.fips);
    // Adopting and re-rendering changes nothing.
    if (t) expect(renderNatgw(t, kernel(REAL_IP)).changes).toBe(0);
  });

  it('returns null when natgw owns no table, and names no interface it cannot read', () => {
    expect(natTablesFromKernel({ ip: null, ip6: null })).toBeNull();
    const flushed = edit(REAL_IP, (items) => items.filter((i) => !i['rule']));
    const t = natTablesFromKernel(kernel(flushed, null));
    expect(t?.vpcIf).toBe('');
    expect(t?.extIf).toBe('');
  });

  it('sees the init guard only with the three base chains', () => {
    expect(hasSkeleton(parseTableListing(REAL_IP, 'ip', 'natgw'))).toBe(true);
    expect(hasSkeleton(null)).toBe(false);
    const noPost = edit(REAL_IP, (items) => items.filter((i) => i['chain']?.['name'] !== 'postrouting' && i['rule']?.['chain'] !== 'postrouting'));
    expect(hasSkeleton(parseTableListing(noPost, 'ip', 'natgw'))).toBe(false);
  });
});

describe('element-level diffs', () => {
  it('removing one DNAT deletes exactly that element', () => {
    const want = { ...WANT, dnats: WANT.dnats.filter((d) => d.port !== 53) };
    expect(renderNatgw(want, kernel(REAL_IP))).toEqual({
      script: 'delete element ip natgw port_dnat { 172.20.0.10 . udp . 53 }\n',
      changes: 1,
    });
  });

  it('adding one DNAT adds exactly that element', () => {
    const want = { ...WANT, dnats: [...WANT.dnats, { eip: '172.20.0.10', port: 22, protocol: 'tcp' as const, internalIp: '10.0.1.6', internalPort: 22 }] };
    expect(renderNatgw(want, kernel(REAL_IP))).toEqual({
      script: 'add element ip natgw port_dnat { 172.20.0.10 . tcp . 22 : 10.0.1.6 . 22 }\n',
      changes: 1,
    });
  });

  it('a changed DNAT target is delete + add of that element in one script', () => {
    const want = { ...WANT, dnats: WANT.dnats.map((d) => (d.port === 80 ? { ...d, internalPort: 9090 } : d)) };
    expect(lines(renderNatgw(want, kernel(REAL_IP)).script)).toEqual([
      'delete element ip natgw port_dnat { 172.20.0.10 . tcp . 80 }',
      'add element ip natgw port_dnat { 172.20.0.10 . tcp . 80 : 10.0.1.6 . 9090 }',
    ]);
  });

  it('removing the first FIP of a shared internal IP hands its SNAT to the next binding', () => {
    const want = { ...WANT, fips: WANT.fips.slice(1) };
    expect(lines(renderNatgw(want, kernel(REAL_IP)).script)).toEqual([
      'delete element ip natgw fip_dnat { 172.20.0.11 }',
      'delete element ip natgw fip_snat { 10.0.1.7 }',
      'add element ip natgw fip_snat { 10.0.1.7 : 172.20.0.12 }',
    ]);
  });

  it('an EIP is one element of the hairpin set', () => {
    const want = { ...WANT, eips: [...WANT.eips, '172.20.0.13'] };
    expect(renderNatgw(want, kernel(REAL_IP)).script).toBe('add element ip natgw hairpin_eips { 172.20.0.13 }\n');
  });

  it('a SNAT of a new prefix length gets its three maps, its element and its dispatch rules inserted at their place, by handle', () => {
    const want = { ...WANT, snats: [...WANT.snats.slice(0, 2), { eip: '172.20.0.11', cidr: '10.0.1.0/28', randomFully: false }, ...WANT.snats.slice(2)] };
    expect(lines(renderNatgw(want, kernel(REAL_IP)).script)).toEqual([
      'add map ip natgw snat_len_28 { type ipv4_addr : verdict; }',
      'add map ip natgw snat_to_len_28 { type ipv4_addr : ipv4_addr; }',
      'add map ip natgw snat_to_fr_len_28 { type ipv4_addr : ipv4_addr; }',
      'add element ip natgw snat_to_len_28 { 10.0.1.0 : 172.20.0.11 }',
      `insert rule ip natgw shared_snat position ${H.d24} ip saddr & 255.255.255.240 vmap @snat_len_28`,
      `insert rule ip natgw shared_snat position ${H.d24} snat ip to ip saddr & 255.255.255.240 map @snat_to_len_28`,
      `insert rule ip natgw shared_snat position ${H.d24} snat ip to ip saddr & 255.255.255.240 map @snat_to_fr_len_28 fully-random`,
    ]);
  });

  it('a second EIP of a single-EIP CIDR turns its element into a chain; one of two removed turns the chain back into an element', () => {
    const add = { ...WANT, snats: [...WANT.snats, { eip: '172.20.0.10', cidr: '0.0.0.0/0', randomFully: false }] };
    expect(lines(renderNatgw(add, kernel(REAL_IP)).script)).toEqual([
      'add chain ip natgw snat_0_0_0_0_0',
      'delete element ip natgw snat_to_fr_len_0 { 0.0.0.0 }',
      'add element ip natgw snat_len_0 { 0.0.0.0 : goto snat_0_0_0_0_0 }',
      'add rule ip natgw snat_0_0_0_0_0 ip saddr 0.0.0.0/0 snat ip to 172.20.0.11 fully-random',
      'add rule ip natgw snat_0_0_0_0_0 ip saddr 0.0.0.0/0 snat ip to 172.20.0.10',
    ]);
    // The first of 10.0.1.0/24's two EIPs goes: the second is the CIDR's only rule, an element.
    const del = { ...WANT, snats: WANT.snats.filter((s) => !(s.cidr === '10.0.1.0/24' && s.eip === '172.20.0.10')) };
    expect(lines(renderNatgw(del, kernel(REAL_IP)).script)).toEqual([
      'delete element ip natgw snat_len_24 { 10.0.1.0 }',
      'add element ip natgw snat_to_len_24 { 10.0.1.0 : 172.20.0.11 }',
      'flush chain ip natgw snat_10_0_1_0_24',
      'delete chain ip natgw snat_10_0_1_0_24',
    ]);
  });

  it('the last SNAT of a length takes its element, its three maps and dispatch rules, and its chain', () => {
    const del = { ...WANT, snats: WANT.snats.filter((s) => s.cidr !== '10.0.1.0/24') };
    expect(lines(renderNatgw(del, kernel(REAL_IP)).script)).toEqual([
      `delete rule ip natgw shared_snat handle ${H.d24}`,
      `delete rule ip natgw shared_snat handle ${H.t24}`,
      `delete rule ip natgw shared_snat handle ${H.f24}`,
      'delete map ip natgw snat_len_24',
      'delete map ip natgw snat_to_len_24',
      'delete map ip natgw snat_to_fr_len_24',
      'flush chain ip natgw snat_10_0_1_0_24',
      'delete chain ip natgw snat_10_0_1_0_24',
    ]);
    const noHost = { ...WANT, snats: WANT.snats.filter((s) => s.cidr !== '10.0.1.6/32') };
    expect(lines(renderNatgw(noHost, kernel(REAL_IP)).script)).toEqual([
      `delete rule ip natgw shared_snat handle ${H.d32}`,
      `delete rule ip natgw shared_snat handle ${H.t32}`,
      `delete rule ip natgw shared_snat handle ${H.f32}`,
      'delete map ip natgw snat_len_32',
      'delete map ip natgw snat_to_len_32',
      'delete map ip natgw snat_to_fr_len_32',
    ]);
  });

  it('a single-EIP CIDR of a length in use is one element, added or deleted alone', () => {
    const more = { ...WANT, snats: [...WANT.snats, { eip: '172.20.0.10', cidr: '10.0.2.0/24', randomFully: false }] };
    expect(renderNatgw(more, kernel(REAL_IP))).toEqual({ script: 'add element ip natgw snat_to_len_24 { 10.0.2.0 : 172.20.0.10 }\n', changes: 1 });
    const withMore = edit(REAL_IP, (items) =>
      items.map((i) => {
        const m = i['map'];
        if (m && m['name'] === 'snat_to_len_24') m['elem'] = [['10.0.2.0', '172.20.0.10']];
        return i;
      }),
    );
    expect(renderNatgw(more, kernel(withMore)).changes).toBe(0);
    expect(renderNatgw(WANT, kernel(withMore))).toEqual({ script: 'delete element ip natgw snat_to_len_24 { 10.0.2.0 }\n', changes: 1 });
  });

  it('a changed EIP or --random-fully of a single-EIP CIDR moves its element; in a chain it replaces that one rule in place', () => {
    const fr = { ...WANT, snats: WANT.snats.map((s) => (s.cidr === '10.0.1.6/32' ? { ...s, randomFully: false } : s)) };
    expect(lines(renderNatgw(fr, kernel(REAL_IP)).script)).toEqual([
      'delete element ip natgw snat_to_fr_len_32 { 10.0.1.6 }',
      'add element ip natgw snat_to_len_32 { 10.0.1.6 : 172.20.0.10 }',
    ]);
    const other = { ...WANT, snats: WANT.snats.map((s) => (s.cidr === '0.0.0.0/0' ? { ...s, eip: '172.20.0.10' } : s)) };
    expect(lines(renderNatgw(other, kernel(REAL_IP)).script)).toEqual([
      'delete element ip natgw snat_to_fr_len_0 { 0.0.0.0 }',
      'add element ip natgw snat_to_fr_len_0 { 0.0.0.0 : 172.20.0.10 }',
    ]);
    const inChain = { ...WANT, snats: WANT.snats.map((s) => (s.cidr === '10.0.1.0/24' && s.eip === '172.20.0.10' ? { ...s, randomFully: true } : s)) };
    expect(lines(renderNatgw(inChain, kernel(REAL_IP)).script)).toEqual([
      `delete rule ip natgw snat_10_0_1_0_24 handle ${H.snat24a}`,
      `insert rule ip natgw snat_10_0_1_0_24 position ${H.snat24b} ip saddr 10.0.1.0/24 snat ip to 172.20.0.10 fully-random`,
    ]);
  });

  it('dispatch rules out of order are moved with the fewest deletes and inserts', () => {
    // The kernel dispatches /32, /24, /0; someone moved /0's chain dispatch to the top.
    const moved = edit(REAL_IP, (items) => {
      const i = items.findIndex((x) => x['rule']?.['handle'] === H.d0);
      const [r] = items.splice(i, 1);
      const first = items.findIndex((x) => x['rule']?.['handle'] === H.d32);
      items.splice(first, 0, r!);
      return items;
    });
    expect(lines(renderNatgw(WANT, kernel(moved)).script)).toEqual([
      `delete rule ip natgw shared_snat handle ${H.d0}`,
      `insert rule ip natgw shared_snat position ${H.t0} ip saddr & 0.0.0.0 vmap @snat_len_0`,
    ]);
  });

  it('a dispatch rule not exactly as natgw writes it is not recognised, and is replaced', () => {
    const dump = parseTableListing(REAL_IP, 'ip', 'natgw');
    const rule = (h: number) => [...dump.chains.values()].flatMap((c) => c.rules).find((r) => r.handle === h)!.expr;
    expect(recogniseRule(rule(H.t24), 'ip')).toEqual({ kind: 'snat-dispatch', len: 24, via: 'eip' });
    expect(recogniseRule(rule(H.f24), 'ip')).toEqual({ kind: 'snat-dispatch', len: 24, via: 'eip-fr' });
    expect(recogniseRule(rule(H.t32), 'ip')).toEqual({ kind: 'snat-dispatch', len: 32, via: 'eip' });
    // The plain map's rule with fully-random, the fully-random map's without, a mask of another length.
    const odd = (fn: (snat: Record<string, any>) => void) => (items: Item[]) =>
      items.map((i) => {
        if (i['rule']?.['handle'] !== H.t24 && i['rule']?.['handle'] !== H.f24) return i;
        const copy = structuredClone(i);
        fn((copy['rule']!['expr'] as any[])[0]['snat']);
        return copy;
      });
    const flipped = edit(
      REAL_IP,
      odd((snat) => {
        if (snat['flags']) delete snat['flags'];
        else snat['flags'] = 'fully-random';
      }),
    );
    const masked = edit(
      REAL_IP,
      odd((snat) => {
        snat['addr']['map']['key']['&'][1] = '255.255.0.0';
      }),
    );
    for (const drift of [flipped, masked]) {
      const k = kernel(drift);
      expect(
        k.ip?.owned
          .get('shared_snat')
          ?.filter((r) => r.rule === null)
          .map((r) => r.handle),
      ).toEqual([H.t24, H.f24]);
      expect(lines(renderNatgw(WANT, k).script)).toEqual([
        `delete rule ip natgw shared_snat handle ${H.t24}`,
        `delete rule ip natgw shared_snat handle ${H.f24}`,
        `insert rule ip natgw shared_snat position ${H.d0} snat ip to ip saddr & 255.255.255.0 map @snat_to_len_24`,
        `insert rule ip natgw shared_snat position ${H.d0} snat ip to ip saddr & 255.255.255.0 map @snat_to_fr_len_24 fully-random`,
      ]);
    }
  });

  it('adopts from a data map only what its masked lookup can match, of its own family', () => {
    const odd = edit(REAL_IP, (items) =>
      items.map((i) => {
        const m = i['map'];
        // Host bits set (never matched), an IPv6 value in an IPv4 table, and one good element.
        if (m && m['name'] === 'snat_to_len_24')
          m['elem'] = [
            ['10.0.3.5', '172.20.0.10'],
            ['10.0.4.0', 'fd00:20::10'],
            ['10.0.5.0', '172.20.0.12'],
          ];
        return i;
      }),
    );
    const snats = natTablesFromKernel(kernel(odd))?.snats ?? [];
    expect(snats.filter((s) => s.cidr.startsWith('10.0.') && s.cidr.endsWith('/24')).map((s) => `${s.eip},${s.cidr}`)).toEqual([
      '172.20.0.10,10.0.1.0/24',
      '172.20.0.11,10.0.1.0/24',
      '172.20.0.12,10.0.5.0/24',
    ]);
    // The full sync deletes what was not adopted.
    expect(lines(renderNatgw(WANT, kernel(odd)).script)).toEqual(['delete element ip natgw snat_to_len_24 { 10.0.3.5, 10.0.4.0, 10.0.5.0 }']);
  });

  it('a table in the per-CIDR-chain layout (the version before data maps) is converted in one transaction, no rebuild', () => {
    const k = kernel(CHAINS_IP, CHAINS_IP6);
    // Its rules are all natgw's, and adopting it gives back the same objects.
    for (const t of [k.ip, k.ip6])
      for (const [chain, rules] of t?.owned ?? [])
        expect(
          rules.filter((r) => r.rule === null),
          chain,
        ).toEqual([]);
    expect(natTablesFromKernel(k)?.snats).toEqual(natTablesFromKernel(kernel(REAL_IP))?.snats);
    expect(lines(renderNatgw(WANT, k).script)).toEqual([
      'add map ip natgw snat_to_len_32 { type ipv4_addr : ipv4_addr; }',
      'add map ip natgw snat_to_fr_len_32 { type ipv4_addr : ipv4_addr; }',
      'add map ip natgw snat_to_len_24 { type ipv4_addr : ipv4_addr; }',
      'add map ip natgw snat_to_fr_len_24 { type ipv4_addr : ipv4_addr; }',
      'add map ip natgw snat_to_len_0 { type ipv4_addr : ipv4_addr; }',
      'add map ip natgw snat_to_fr_len_0 { type ipv4_addr : ipv4_addr; }',
      'add map ip6 natgw snat_to_len_64 { type ipv6_addr : ipv6_addr; }',
      'add map ip6 natgw snat_to_fr_len_64 { type ipv6_addr : ipv6_addr; }',
      'delete element ip natgw snat_len_32 { 10.0.1.6 }',
      'delete element ip natgw snat_len_0 { 0.0.0.0 }',
      'delete element ip6 natgw snat_len_64 { fd00:1:: }',
      'add element ip natgw snat_to_fr_len_32 { 10.0.1.6 : 172.20.0.10 }',
      'add element ip natgw snat_to_fr_len_0 { 0.0.0.0 : 172.20.0.11 }',
      'add element ip6 natgw snat_to_len_64 { fd00:1:: : fd00:20::10 }',
      'insert rule ip natgw shared_snat position 29 snat ip to ip saddr map @snat_to_len_32',
      'insert rule ip natgw shared_snat position 29 snat ip to ip saddr map @snat_to_fr_len_32 fully-random',
      'insert rule ip natgw shared_snat position 30 snat ip to ip saddr & 255.255.255.0 map @snat_to_len_24',
      'insert rule ip natgw shared_snat position 30 snat ip to ip saddr & 255.255.255.0 map @snat_to_fr_len_24 fully-random',
      'add rule ip natgw shared_snat snat ip to ip saddr & 0.0.0.0 map @snat_to_len_0',
      'add rule ip natgw shared_snat snat ip to ip saddr & 0.0.0.0 map @snat_to_fr_len_0 fully-random',
      'add rule ip6 natgw shared_snat snat ip6 to ip6 saddr & ffff:ffff:ffff:ffff:: map @snat_to_len_64',
      'add rule ip6 natgw shared_snat snat ip6 to ip6 saddr & ffff:ffff:ffff:ffff:: map @snat_to_fr_len_64 fully-random',
      'flush chain ip natgw snat_10_0_1_6_32',
      'delete chain ip natgw snat_10_0_1_6_32',
      'flush chain ip natgw snat_0_0_0_0_0',
      'delete chain ip natgw snat_0_0_0_0_0',
      'flush chain ip6 natgw snat_fd00_1___64',
      'delete chain ip6 natgw snat_fd00_1___64',
    ]);
  });
});

describe('repairs', () => {
  it('a deleted rule is put back at its place', () => {
    expect(renderNatgw(WANT, kernel(edit(REAL_IP, withoutRule(H.jump))))).toEqual({
      script: `insert rule ip natgw postrouting position ${H.hairpin} oifname "net1" jump shared_snat\n`,
      changes: 1,
    });
    expect(renderNatgw(WANT, kernel(edit(REAL_IP, withoutRule(H.fipDnat)))).script).toBe(
      `insert rule ip natgw prerouting position ${H.portDnat} dnat ip to ip daddr map @fip_dnat\n`,
    );
  });

  it('a flushed table (chains and maps empty) gets its rules and elements back, nothing recreated', () => {
    const flushed = edit(REAL_IP, (items) =>
      items
        .filter((i) => !i['rule'])
        .map((i) => {
          const set = i['map'] ?? i['set'];
          if (set) delete set['elem'];
          return i;
        }),
    );
    const script = lines(renderNatgw(WANT, kernel(flushed)).script);
    expect(script.filter((l) => /^add (table|map|set|chain)/.test(l))).toEqual([]);
    expect(script.filter((l) => l.startsWith('add rule ip natgw'))).toHaveLength(17);
    expect(script.filter((l) => l.startsWith('add element ip natgw'))).toHaveLength(7);
  });

  it('a deleted table is recreated whole', () => {
    const script = renderNatgw(WANT, kernel(null)).script;
    expect(script.startsWith('add table ip natgw\n')).toBe(true);
    expect(script).not.toContain('ip6');
  });

  it('a missing map or chain is created alone', () => {
    const noHairpinSet = edit(REAL_IP, (items) => items.filter((i) => i['set']?.['name'] !== 'hairpin_eips' && i['rule']?.['handle'] !== H.hairpin));
    expect(lines(renderNatgw(WANT, kernel(noHairpinSet)).script)).toEqual([
      'add set ip natgw hairpin_eips { type ipv4_addr; }',
      'add element ip natgw hairpin_eips { 172.20.0.10, 172.20.0.11 }',
      'add rule ip natgw postrouting oifname "eth0" meta mark & 0x1 == 0x1 ct status dnat ct original ip daddr @hairpin_eips snat ip to ct original ip daddr fully-random',
    ]);
  });

  it('a foreign rule in a natgw chain is deleted by handle', () => {
    const foreign = edit(REAL_IP, (items) => [...items, { rule: { family: 'ip', table: 'natgw', chain: 'prerouting', handle: 99, expr: [{ accept: null }] } }]);
    expect(renderNatgw(WANT, kernel(foreign)).script).toBe('delete rule ip natgw prerouting handle 99\n');
  });

  it('an object natgw never creates, or a base chain hooked otherwise, rebuilds the table in the same transaction', () => {
    const foreignChain = edit(REAL_IP, (items) => [...items, { chain: { family: 'ip', table: 'natgw', name: 'other', handle: 98 } }]);
    const s1 = lines(renderNatgw(WANT, kernel(foreignChain)).script);
    expect(s1[0]).toBe('delete table ip natgw');
    expect(s1[1]).toBe('add table ip natgw');
    const reprio = edit(REAL_IP, (items) => items.map((i) => (i['chain']?.['name'] === 'prerouting' ? { chain: { ...i['chain'], prio: 0 } } : i)));
    expect(lines(renderNatgw(WANT, kernel(reprio)).script)[0]).toBe('delete table ip natgw');
  });

  it('the ip6 table goes when the last IPv6 object goes', () => {
    const v4: NatTables = {
      ...WANT,
      eips: WANT.eips.filter((e) => !e.includes(':')),
      snats: WANT.snats.filter((s) => !s.eip.includes(':')),
      dnats: WANT.dnats.filter((d) => !d.eip.includes(':')),
    };
    expect(renderNatgw(v4, kernel(REAL_IP))).toEqual({ script: 'delete table ip6 natgw\n', changes: 1 });
  });
});

describe('interface rename', () => {
  it('a new VPC interface rewrites only the mark and hairpin rules (deletes first, then adds)', () => {
    expect(lines(renderNatgw({ ...WANT, vpcIf: 'vpc0' }, kernel(REAL_IP)).script)).toEqual([
      `delete rule ip natgw vpc_mark handle ${H.mark}`,
      `delete rule ip natgw postrouting handle ${H.hairpin}`,
      `delete rule ip6 natgw vpc_mark handle ${H6.mark}`,
      `delete rule ip6 natgw postrouting handle ${H6.hairpin}`,
      'add rule ip natgw vpc_mark iifname "vpc0" meta mark set meta mark | 0x1',
      'add rule ip natgw postrouting oifname "vpc0" meta mark & 0x1 == 0x1 ct status dnat ct original ip daddr @hairpin_eips snat ip to ct original ip daddr fully-random',
      'add rule ip6 natgw vpc_mark iifname "vpc0" meta mark set meta mark | 0x1',
      'add rule ip6 natgw postrouting oifname "vpc0" meta mark & 0x1 == 0x1 ct status dnat ct original ip6 daddr @hairpin_eips snat ip6 to ct original ip6 daddr fully-random',
    ]);
  });

  it('a new external interface rewrites only the jump to shared_snat, SNAT rules untouched', () => {
    const s = lines(renderNatgw({ ...WANT, extIf: 'ext0' }, kernel(REAL_IP)).script);
    expect(s).toEqual([
      `delete rule ip natgw postrouting handle ${H.jump}`,
      `delete rule ip6 natgw postrouting handle ${H6.jump}`,
      `insert rule ip natgw postrouting position ${H.hairpin} oifname "ext0" jump shared_snat`,
      `insert rule ip6 natgw postrouting position ${H6.hairpin} oifname "ext0" jump shared_snat`,
    ]);
    const t = natTablesFromKernel(kernel(REAL_IP));
    expect(t?.extIf).toBe('net1');
  });
});

describe('pieces', () => {
  it('refuses a FIP, DNAT or SNAT whose two addresses are of different families', () => {
    expect(() => renderNatgw({ ...WANT, fips: [{ eip: '172.20.0.11', internalIp: 'fd00::7' }] }, kernel(null))).toThrow(NftRenderError);
    expect(() =>
      renderNatgw({ ...WANT, dnats: [{ eip: 'fd00:20::10', port: 1, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 1 }] }, kernel(null)),
    ).toThrow(NftRenderError);
    expect(() => renderNatgw({ ...WANT, snats: [{ eip: '172.20.0.10', cidr: 'fd00::/64', randomFully: false }] }, kernel(null))).toThrow(NftRenderError);
  });

  it('quotes interface names', () => {
    expect(ruleText({ kind: 'vpc-mark', vpcIf: 'eth0.100' }, 'ip')).toBe('iifname "eth0.100" meta mark set meta mark | 0x1');
  });

  it('removeAll deletes only natgw tables that exist', () => {
    expect(renderRemoveAll(kernel(REAL_IP))).toBe('delete table ip natgw\ndelete table ip6 natgw\n');
    expect(renderRemoveAll(kernel(REAL_IP, null))).toBe('delete table ip natgw\n');
    expect(renderRemoveAll({ ip: null, ip6: null })).toBe('');
  });
});

describe('untrusted kernel text', () => {
  it('an element natgw could not write back verbatim rebuilds the table instead', () => {
    const odd = edit(REAL_IP, (items) =>
      items.map((i) => (i['set']?.['name'] === 'hairpin_eips' ? { set: { ...i['set'], elem: ['172.20.0.10', { weird: '} ; flush ruleset' }] } } : i)),
    );
    const script = lines(renderNatgw(WANT, kernel(odd)).script);
    expect(script[0]).toBe('delete table ip natgw');
    expect(script.join('\n')).not.toContain('flush ruleset');
  });
});

describe('a table of an earlier natgw with objects natgw no longer declares', () => {
  it('is rebuilt whole in the one transaction (a chain in the output hook, a set natgw never creates)', () => {
    const extraChain = edit(REAL_IP, (items) => [
      ...items,
      { chain: { family: 'ip', table: 'natgw', name: 'shim_notrack', handle: 98, type: 'filter', hook: 'output', prio: -300, policy: 'accept' } },
    ]);
    const extraSet = edit(REAL_IP, (items) => [
      ...items,
      { set: { family: 'ip', name: 'fip_hit', table: 'natgw', type: 'ipv4_addr', handle: 97, size: 1048576, flags: ['dynamic'] } },
    ]);
    for (const listing of [extraChain, extraSet]) {
      const script = lines(renderNatgw(WANT, kernel(listing)).script);
      expect(script[0]).toBe('delete table ip natgw');
      expect(script).toContain('add table ip natgw');
      expect(script.join('\n')).not.toMatch(/shim_notrack|fip_hit/);
    }
  });
});

describe('a chain most of whose many rules go', () => {
  it('is flushed and written whole in the one transaction, not deleted rule by rule', () => {
    const k = kernel(REAL_IP);
    const ip = k.ip!;
    const stray = Array.from({ length: 70 }, (_, i) => ({ handle: 1000 + i, rule: null }));
    const owned = new Map(ip.owned);
    owned.set('prerouting', [...(ip.owned.get('prerouting') ?? []), ...stray]);
    const script = lines(renderNatgw(WANT, { ...k, ip: { ...ip, owned } }).script);
    expect(script.filter((l) => l.includes(' prerouting'))).toEqual([
      'flush chain ip natgw prerouting',
      'add rule ip natgw prerouting dnat ip to ip daddr map @fip_dnat',
      'add rule ip natgw prerouting meta l4proto { tcp, udp } dnat ip addr . port to ip daddr . meta l4proto . th dport map @port_dnat',
    ]);
    // With a few strays, element-level deletes by handle.
    owned.set('prerouting', [...(ip.owned.get('prerouting') ?? []), ...stray.slice(0, 3)]);
    expect(lines(renderNatgw(WANT, { ...k, ip: { ...ip, owned } }).script)).toEqual(
      [1000, 1001, 1002].map((h) => `delete rule ip natgw prerouting handle ${h}`),
    );
  });
});
