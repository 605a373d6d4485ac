import { describe, expect, it } from 'vitest';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { renderPartial, type NftView } from '../../src/dataplane/netfilter/nft/partial.js';
import type { Dnat, Snat } from '../../src/model/rules.js';

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

  it('new SNAT CIDRs are chains and elements, a new length a map and a dispatch rule by index; a removed CIDR touches no other', () => {
    const a = snat('10.0.1.0/24');
    const b = snat('10.0.3.0/24');
    const before = { ...T, snats: [a, b] };
    const mid = snat('10.0.2.0/24');
    const host = snat('10.0.9.9/32');
    const added = renderPartial(view(before, false), { ...before, snats: [host, a, mid, b, snat('10.0.0.0/16')] });
    expect(added?.script).toBe(
      [
        'add map ip natgw snat_len_32 { type ipv4_addr : verdict; }',
        'add map ip natgw snat_len_16 { type ipv4_addr : verdict; }',
        'add chain ip natgw snat_10_0_9_9_32',
        'add rule ip natgw snat_10_0_9_9_32 ip saddr 10.0.9.9 snat ip to 172.20.0.10',
        'add chain ip natgw snat_10_0_2_0_24',
        'add rule ip natgw snat_10_0_2_0_24 ip saddr 10.0.2.0/24 snat ip to 172.20.0.10',
        'add chain ip natgw snat_10_0_0_0_16',
        'add rule ip natgw snat_10_0_0_0_16 ip saddr 10.0.0.0/16 snat ip to 172.20.0.10',
        'add element ip natgw snat_len_32 { 10.0.9.9 : goto snat_10_0_9_9_32 }',
        'add element ip natgw snat_len_24 { 10.0.2.0 : goto snat_10_0_2_0_24 }',
        'add element ip natgw snat_len_16 { 10.0.0.0 : goto snat_10_0_0_0_16 }',
        'insert rule ip natgw shared_snat index 0 ip saddr vmap @snat_len_32',
        'add rule ip natgw shared_snat ip saddr & 255.255.0.0 vmap @snat_len_16',
        '',
      ].join('\n'),
    );
    const removed = renderPartial(view(before, false), { ...before, snats: [b] });
    expect(removed?.script).toBe(
      ['delete element ip natgw snat_len_24 { 10.0.1.0 }', 'flush chain ip natgw snat_10_0_1_0_24', 'delete chain ip natgw snat_10_0_1_0_24', ''].join('\n'),
    );
  });

  it('an interface renamed needs a full sync', () => {
    expect(renderPartial(view(T, false), { ...T, extIf: 'net2' })).toBeNull();
  });
});
