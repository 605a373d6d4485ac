/**
 * Shared SNAT's per-CIDR layout on the command path (issue 8): every SNAT change is ONE small
 * nft transaction, whatever the number of other SNAT rules — a data-map element for a CIDR of
 * one EIP, a small chain for one of several, a few elements and that chain when a CIDR moves
 * between the two; the recording executor sees exactly what natgw runs. Real-kernel semantics
 * are in test/netns/snat-layout.test.ts.
 */
import { describe, expect, it } from 'vitest';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { NftBackend } from '../../src/dataplane/netfilter/nft/backend.js';
import { snatCidr } from '../../src/dataplane/netfilter/nft/snatLayout.js';
import type { Snat } from '../../src/model/rules.js';
import { RecordingExecutor } from '../helpers/execCalls.js';

const EIP = '172.20.0.10';
const EIP2 = '172.20.0.11';
const EIP3 = '172.20.0.12';
const N = 600;
/** N distinct /24s and one /16 (ordered by descending prefix length, as the state keeps them). */
const SNATS: Snat[] = [
  ...Array.from({ length: N }, (_, i): Snat => ({ eip: EIP, cidr: `10.${i >> 8}.${i & 255}.0/24`, randomFully: false })),
  { eip: EIP, cidr: '10.0.0.0/16', randomFully: true },
];
const BASE: NatTables = { vpcIf: 'eth0', extIf: 'net1', eips: [EIP, EIP2, EIP3], snats: SNATS, dnats: [], fips: [] };

async function backendAt(tables: NatTables): Promise<{ nft: NftBackend; exec: RecordingExecutor }> {
  const exec = new RecordingExecutor((r) => (r.args.includes('list') ? { exitCode: 1, stderr: 'Error: No such file or directory' } : undefined));
  const nft = new NftBackend(exec);
  await nft.sync(tables, { mode: 'full' });
  exec.calls.length = 0;
  return { nft, exec };
}

const commands = (exec: RecordingExecutor): string[] => exec.calls.map((c) => [c.file, ...c.args].join(' '));

describe('shared SNAT on the nft command path', () => {
  it('names a CIDR chain from the canonical network, one name per CIDR', () => {
    expect(snatCidr('10.0.1.0/24')).toEqual({ key: '10.0.1.0', len: 24, chain: 'snat_10_0_1_0_24' });
    expect(snatCidr('fd00:1::/64')).toEqual({ key: 'fd00:1::', len: 64, chain: 'snat_fd00_1___64' });
    expect(snatCidr('fd00:1::6/128').chain).not.toBe(snatCidr('fd00:1:0:0:0:0:0:6/12').chain);
  });

  it(`deleting one single-EIP SNAT among ${N + 1} is one transaction of one element`, async () => {
    const { nft, exec } = await backendAt(BASE);
    const gone = SNATS[300]!;
    const r = await nft.sync({ ...BASE, snats: SNATS.filter((s) => s !== gone) }, { mode: 'partial' });
    expect(commands(exec)).toEqual(['nft -f -']);
    expect(exec.calls[0]!.input).toBe('delete element ip natgw snat_to_len_24 { 10.1.44.0 }\n');
    expect(r.changes).toBe(1);
  });

  it('adding a single-EIP SNAT of a length in use is one element of the map its flag names', async () => {
    const { nft, exec } = await backendAt(BASE);
    const s: Snat = { eip: EIP2, cidr: '10.9.9.0/24', randomFully: true };
    await nft.sync({ ...BASE, snats: [...SNATS.slice(0, N), s, SNATS[N]!] }, { mode: 'partial' });
    expect(commands(exec)).toEqual(['nft -f -']);
    expect(exec.calls[0]!.input).toBe('add element ip natgw snat_to_fr_len_24 { 10.9.9.0 : 172.20.0.11 }\n');
  });

  it('a second EIP turns the element into a chain, a third is appended to it; deleting the first of two turns it back', async () => {
    const { nft, exec } = await backendAt(BASE);
    const second: Snat = { eip: EIP2, cidr: '10.0.5.0/24', randomFully: false };
    const third: Snat = { eip: EIP3, cidr: '10.0.5.0/24', randomFully: true };
    const two = [...SNATS.slice(0, 6), second, ...SNATS.slice(6)];
    await nft.sync({ ...BASE, snats: two }, { mode: 'partial' });
    expect(exec.calls.map((c) => c.input)).toEqual([
      [
        'add chain ip natgw snat_10_0_5_0_24',
        'delete element ip natgw snat_to_len_24 { 10.0.5.0 }',
        'add element ip natgw snat_len_24 { 10.0.5.0 : goto snat_10_0_5_0_24 }',
        'add rule ip natgw snat_10_0_5_0_24 ip saddr 10.0.5.0/24 snat ip to 172.20.0.10',
        'add rule ip natgw snat_10_0_5_0_24 ip saddr 10.0.5.0/24 snat ip to 172.20.0.11',
        '',
      ].join('\n'),
    ]);
    exec.calls.length = 0;
    const three = [...SNATS.slice(0, 6), second, third, ...SNATS.slice(6)];
    await nft.sync({ ...BASE, snats: three }, { mode: 'partial' });
    expect(exec.calls.map((c) => c.input)).toEqual(['add rule ip natgw snat_10_0_5_0_24 ip saddr 10.0.5.0/24 snat ip to 172.20.0.12 fully-random\n']);
    exec.calls.length = 0;
    await nft.sync({ ...BASE, snats: two }, { mode: 'partial' });
    expect(exec.calls.map((c) => c.input)).toEqual([
      [
        'flush chain ip natgw snat_10_0_5_0_24',
        'add rule ip natgw snat_10_0_5_0_24 ip saddr 10.0.5.0/24 snat ip to 172.20.0.10',
        'add rule ip natgw snat_10_0_5_0_24 ip saddr 10.0.5.0/24 snat ip to 172.20.0.11',
        '',
      ].join('\n'),
    ]);
    exec.calls.length = 0;
    await nft.sync({ ...BASE, snats: two.filter((s) => s !== SNATS[5]) }, { mode: 'partial' });
    expect(exec.calls.map((c) => c.input)).toEqual([
      [
        'delete element ip natgw snat_len_24 { 10.0.5.0 }',
        'add element ip natgw snat_to_len_24 { 10.0.5.0 : 172.20.0.11 }',
        'flush chain ip natgw snat_10_0_5_0_24',
        'delete chain ip natgw snat_10_0_5_0_24',
        '',
      ].join('\n'),
    ]);
  });

  it('a new prefix length adds its three maps and places its dispatch rules by index; the last of a length rewrites only the dispatch rules', async () => {
    const { nft, exec } = await backendAt(BASE);
    const host: Snat = { eip: EIP2, cidr: '10.0.1.6/32', randomFully: false };
    await nft.sync({ ...BASE, snats: [host, ...SNATS] }, { mode: 'partial' });
    expect(exec.calls[0]!.input).toBe(
      [
        'add map ip natgw snat_len_32 { type ipv4_addr : verdict; }',
        'add map ip natgw snat_to_len_32 { type ipv4_addr : ipv4_addr; }',
        'add map ip natgw snat_to_fr_len_32 { type ipv4_addr : ipv4_addr; }',
        'add element ip natgw snat_to_len_32 { 10.0.1.6 : 172.20.0.11 }',
        'insert rule ip natgw shared_snat index 0 ip saddr vmap @snat_len_32',
        'insert rule ip natgw shared_snat index 1 snat ip to ip saddr map @snat_to_len_32',
        'insert rule ip natgw shared_snat index 2 snat ip to ip saddr map @snat_to_fr_len_32 fully-random',
        '',
      ].join('\n'),
    );
    exec.calls.length = 0;
    await nft.sync(BASE, { mode: 'partial' });
    expect(exec.calls[0]!.input).toBe(
      [
        'flush chain ip natgw shared_snat',
        'add rule ip natgw shared_snat ip saddr & 255.255.255.0 vmap @snat_len_24',
        'add rule ip natgw shared_snat snat ip to ip saddr & 255.255.255.0 map @snat_to_len_24',
        'add rule ip natgw shared_snat snat ip to ip saddr & 255.255.255.0 map @snat_to_fr_len_24 fully-random',
        'add rule ip natgw shared_snat ip saddr & 255.255.0.0 vmap @snat_len_16',
        'add rule ip natgw shared_snat snat ip to ip saddr & 255.255.0.0 map @snat_to_len_16',
        'add rule ip natgw shared_snat snat ip to ip saddr & 255.255.0.0 map @snat_to_fr_len_16 fully-random',
        'delete map ip natgw snat_len_32',
        'delete map ip natgw snat_to_len_32',
        'delete map ip natgw snat_to_fr_len_32',
        '',
      ].join('\n'),
    );
  });

  it('the dry-run script of a full render holds the whole layout', async () => {
    const exec = new RecordingExecutor((r) => (r.args.includes('list') ? { exitCode: 1, stderr: 'Error: No such file or directory' } : undefined));
    const two: Snat = { eip: EIP2, cidr: SNATS[1]!.cidr, randomFully: false };
    const r = await new NftBackend(exec).sync({ ...BASE, snats: [SNATS[0]!, SNATS[1]!, two] }, { dryRun: true });
    for (const line of [
      'add map ip natgw snat_len_24 { type ipv4_addr : verdict; }',
      'add map ip natgw snat_to_len_24 { type ipv4_addr : ipv4_addr; }',
      'add map ip natgw snat_to_fr_len_24 { type ipv4_addr : ipv4_addr; }',
      'add chain ip natgw snat_10_0_1_0_24',
      'add element ip natgw snat_to_len_24 { 10.0.0.0 : 172.20.0.10 }',
      'add element ip natgw snat_len_24 { 10.0.1.0 : goto snat_10_0_1_0_24 }',
      'add rule ip natgw shared_snat ip saddr & 255.255.255.0 vmap @snat_len_24',
      'add rule ip natgw shared_snat snat ip to ip saddr & 255.255.255.0 map @snat_to_len_24',
      'add rule ip natgw snat_10_0_1_0_24 ip saddr 10.0.1.0/24 snat ip to 172.20.0.10',
      'add rule ip natgw snat_10_0_1_0_24 ip saddr 10.0.1.0/24 snat ip to 172.20.0.11',
    ])
      expect(r.script).toContain(line);
    expect(r.script).not.toContain('snat_10_0_0_0_24');
  });
});
