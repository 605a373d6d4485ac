import { describe, expect, it } from 'vitest';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { planPartial, type NftView } from '../../src/dataplane/netfilter/nft/partial.js';
import { textPlan } from '../../src/dataplane/netfilter/nft/render.js';
import type { Dnat, Snat } from '../../src/model/rules.js';

const renderPartial = (v: NftView, next: NatTables) => {
  const p = planPartial(v, next);
  return p && textPlan(p);
};

const T: NatTables = { vpcIf: 'eth0', extIf: 'net1', eips: ['172.20.0.10'], snats: [], dnats: [], fips: [] };
const d4: Dnat = { eip: '172.20.0.10', port: 80, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8080 };
const d6a: Dnat = { eip: 'fd00:20::10', port: 80, protocol: 'tcp', internalIp: 'fd00:1::6', internalPort: 8080 };
const d6b: Dnat = { ...d6a, port: 81 };
const view = (t: NatTables, v6: boolean): NftView => ({ tables: t, families: new Set(v6 ? ['ip', 'ip6'] : ['ip']) });
const snat = (cidr: string): Snat => ({ eip: '172.20.0.10', cidr, randomFully: false });

describe('nft partial plan', () => {
  it('the first IPv6 object needs a full sync (a table to create); a v4 one does not', () => {
    expect(renderPartial(view(T, false), { ...T, dnats: [d6a] })).toBeNull();
    expect(renderPartial(view(T, false), { ...T, dnats: [d4] })?.script).toBe('add element ip natgw port_dnat { 172.20.0.10 . tcp . 80 : 10.0.1.6 . 8080 }\n');
  });

  it('the last IPv6 object gone needs a full sync (the table goes); one of two does not', () => {
    const two = { ...T, dnats: [d6a, d6b] };
    expect(renderPartial(view(two, true), { ...two, dnats: [d6a] })?.script).toBe('delete element ip6 natgw port_dnat { fd00:20::10 . tcp . 81 }\n');
    const one = { ...T, dnats: [d6a] };
    expect(renderPartial(view(one, true), { ...one, dnats: [] })).toBeNull();
  });

  it('new single-EIP SNAT CIDRs are elements, a new length three maps and dispatch rules by index; a removed CIDR touches no other', () => {
    const a = snat('10.0.1.0/24');
    const b = snat('10.0.3.0/24');
    const before = { ...T, snats: [a, b] };
    const mid = snat('10.0.2.0/24');
    const host = snat('10.0.9.9/32');
    const added = renderPartial(view(before, false), { ...before, snats: [host, a, mid, b, { ...snat('10.0.0.0/16'), randomFully: true }] });
    expect(added?.script).toBe(
      [
        'add map ip natgw snat_len_32 { type ipv4_addr : verdict; }',
        'add map ip natgw snat_to_len_32 { type ipv4_addr : ipv4_addr; }',
        'add map ip natgw snat_to_fr_len_32 { type ipv4_addr : ipv4_addr; }',
        'add map ip natgw snat_len_16 { type ipv4_addr : verdict; }',
        'add map ip natgw snat_to_len_16 { type ipv4_addr : ipv4_addr; }',
        'add map ip natgw snat_to_fr_len_16 { type ipv4_addr : ipv4_addr; }',
        'add element ip natgw snat_to_len_32 { 10.0.9.9 : 172.20.0.10 }',
        'add element ip natgw snat_to_len_24 { 10.0.2.0 : 172.20.0.10 }',
        'add element ip natgw snat_to_fr_len_16 { 10.0.0.0 : 172.20.0.10 }',
        'insert rule ip natgw shared_snat index 0 ip saddr vmap @snat_len_32',
        'insert rule ip natgw shared_snat index 1 snat ip to ip saddr map @snat_to_len_32',
        'insert rule ip natgw shared_snat index 2 snat ip to ip saddr map @snat_to_fr_len_32 fully-random',
        'add rule ip natgw shared_snat ip saddr & 255.255.0.0 vmap @snat_len_16',
        'add rule ip natgw shared_snat snat ip to ip saddr & 255.255.0.0 map @snat_to_len_16',
        'add rule ip natgw shared_snat snat ip to ip saddr & 255.255.0.0 map @snat_to_fr_len_16 fully-random',
        '',
      ].join('\n'),
    );
    const removed = renderPartial(view(before, false), { ...before, snats: [b] });
    expect(removed?.script).toBe('delete element ip natgw snat_to_len_24 { 10.0.1.0 }\n');
  });

  it('a CIDR moves between an element and its own chain in one transaction: a second EIP, a pool, one of two gone, a flag changed', () => {
    const a = snat('10.0.1.0/24');
    const a2: Snat = { ...a, eip: '172.20.0.11' };
    const one = { ...T, eips: ['172.20.0.10', '172.20.0.11'], snats: [a] };
    const two = { ...one, snats: [a, a2] };
    expect(renderPartial(view(one, false), two)?.script).toBe(
      [
        'add chain ip natgw snat_10_0_1_0_24',
        'delete element ip natgw snat_to_len_24 { 10.0.1.0 }',
        'add element ip natgw snat_len_24 { 10.0.1.0 : goto snat_10_0_1_0_24 }',
        'add rule ip natgw snat_10_0_1_0_24 ip saddr 10.0.1.0/24 snat ip to 172.20.0.10',
        'add rule ip natgw snat_10_0_1_0_24 ip saddr 10.0.1.0/24 snat ip to 172.20.0.11',
        '',
      ].join('\n'),
    );
    // The first of two goes: the second is the CIDR's only rule, an element of the map its flag names.
    expect(renderPartial(view(two, false), { ...two, snats: [{ ...a2, randomFully: true }] })?.script).toBe(
      [
        'delete element ip natgw snat_len_24 { 10.0.1.0 }',
        'add element ip natgw snat_to_fr_len_24 { 10.0.1.0 : 172.20.0.11 }',
        'flush chain ip natgw snat_10_0_1_0_24',
        'delete chain ip natgw snat_10_0_1_0_24',
        '',
      ].join('\n'),
    );
    expect(renderPartial(view(one, false), { ...one, snats: [{ ...a, randomFully: true }] })?.script).toBe(
      ['delete element ip natgw snat_to_len_24 { 10.0.1.0 }', 'add element ip natgw snat_to_fr_len_24 { 10.0.1.0 : 172.20.0.10 }', ''].join('\n'),
    );
    // A pool of one SNAT object is a chain all the same.
    expect(renderPartial(view(one, false), { ...one, snats: [{ ...a, eips: ['172.20.0.10', '172.20.0.11'] }] })?.script).toBe(
      [
        'add chain ip natgw snat_10_0_1_0_24',
        'delete element ip natgw snat_to_len_24 { 10.0.1.0 }',
        'add element ip natgw snat_len_24 { 10.0.1.0 : goto snat_10_0_1_0_24 }',
        'add rule ip natgw snat_10_0_1_0_24 ip saddr 10.0.1.0/24 snat ip to numgen inc mod 2 map { 0 : 172.20.0.10, 1 : 172.20.0.11 }',
        '',
      ].join('\n'),
    );
  });

  it('an interface renamed needs a full sync', () => {
    expect(renderPartial(view(T, false), { ...T, extIf: 'net2' })).toBeNull();
  });
});

describe('nft partial plan: a SNAT command at a thousand SNAT rules', () => {
  // A SNAT object's `randomFully` is read when its rule is rendered (and by nothing that only
  // sorts CIDRs out): counting the reads tells which objects a command rendered.
  const counted = (cidr: string, reads: { n: number }): Snat => {
    const s = { eip: '172.20.0.10', cidr } as Snat;
    Object.defineProperty(s, 'randomFully', {
      enumerable: true,
      get: () => {
        reads.n++;
        return false;
      },
    });
    return s;
  };

  it('renders only the CIDRs it touches, and the same script as a plan over every rule', () => {
    const reads = { n: 0 };
    const many = Array.from({ length: 1000 }, (_, i) => counted(`10.${100 + (i >> 8)}.${i & 255}.0/24`, reads));
    const before = { ...T, snats: many };
    const shared = { eip: '172.20.0.11', cidr: many[500]?.cidr as string, randomFully: false };
    const next = { ...before, snats: [...many.slice(0, 501), shared, ...many.slice(501), snat('192.168.0.0/16')] };
    const p = renderPartial(view(before, false), next);
    // The new /16 and the CIDR that gained a second EIP, nothing else.
    expect(reads.n).toBeLessThanOrEqual(2);
    expect(p?.script).toContain('add element ip natgw snat_len_24 { 10.101.244.0 : goto snat_10_101_244_0_24 }');
    expect(p?.script).toContain('delete element ip natgw snat_to_len_24 { 10.101.244.0 }');
    // The same objects in fresh arrays: no reference is shared, so every rule is compared.
    const copy = (s: Snat): Snat => ({ eip: s.eip, cidr: s.cidr, randomFully: s.randomFully });
    const full = renderPartial(view({ ...before, snats: many.map(copy) }, false), { ...next, snats: next.snats.map(copy) });
    expect(full?.script).toBe(p?.script);
  });
});
