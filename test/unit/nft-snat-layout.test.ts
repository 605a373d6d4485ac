/**
 * Shared SNAT's per-CIDR layout on the command path (issue 8): every SNAT change is ONE small
 * nft transaction, whatever the number of other SNAT rules; the recording executor sees exactly
 * what natgw runs. Real-kernel semantics are in test/netns/snat-layout.test.ts.
 */
import { describe, expect, it } from 'vitest';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { NftBackend } from '../../src/dataplane/netfilter/nft/backend.js';
import { snatCidr } from '../../src/dataplane/netfilter/nft/snatLayout.js';
import type { Snat } from '../../src/model/rules.js';
import { RecordingExecutor } from '../../src/system/exec.js';

const EIP = '172.20.0.10';
const EIP2 = '172.20.0.11';
const N = 600;
/** N distinct /24s and one /16 (ordered by descending prefix length, as the state keeps them). */
const SNATS: Snat[] = [
  ...Array.from({ length: N }, (_, i): Snat => ({ eip: EIP, cidr: `10.${i >> 8}.${i & 255}.0/24`, randomFully: false })),
  { eip: EIP, cidr: '10.0.0.0/16', randomFully: true },
];
const BASE: NatTables = { vpcIf: 'eth0', extIf: 'net1', eips: [EIP, EIP2], snats: SNATS, dnats: [], fips: [] };

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

  it(`deleting one SNAT among ${N + 1} is one transaction of one element and one chain`, async () => {
    const { nft, exec } = await backendAt(BASE);
    const gone = SNATS[300]!;
    const r = await nft.sync({ ...BASE, snats: SNATS.filter((s) => s !== gone) }, { mode: 'partial' });
    expect(commands(exec)).toEqual(['nft -f -']);
    expect(exec.calls[0]!.input).toBe(
      ['delete element ip natgw snat_len_24 { 10.1.44.0 }', 'flush chain ip natgw snat_10_1_44_0_24', 'delete chain ip natgw snat_10_1_44_0_24', ''].join('\n'),
    );
    expect(r.changes).toBeLessThan(5);
  });

  it('adding a SNAT of a length in use is a chain, its rule and one element', async () => {
    const { nft, exec } = await backendAt(BASE);
    const s: Snat = { eip: EIP2, cidr: '10.9.9.0/24', randomFully: true };
    await nft.sync({ ...BASE, snats: [...SNATS.slice(0, N), s, SNATS[N]!] }, { mode: 'partial' });
    expect(commands(exec)).toEqual(['nft -f -']);
    expect(exec.calls[0]!.input).toBe(
      [
        'add chain ip natgw snat_10_9_9_0_24',
        'add rule ip natgw snat_10_9_9_0_24 ip saddr 10.9.9.0/24 snat ip to 172.20.0.11 fully-random',
        'add element ip natgw snat_len_24 { 10.9.9.0 : goto snat_10_9_9_0_24 }',
        '',
      ].join('\n'),
    );
  });

  it('a second EIP of the same CIDR is appended to its chain; deleting the first rewrites only that chain', async () => {
    const { nft, exec } = await backendAt(BASE);
    const second: Snat = { eip: EIP2, cidr: '10.0.5.0/24', randomFully: false };
    const two = [...SNATS.slice(0, 6), second, ...SNATS.slice(6)];
    await nft.sync({ ...BASE, snats: two }, { mode: 'partial' });
    expect(exec.calls.map((c) => c.input)).toEqual(['add rule ip natgw snat_10_0_5_0_24 ip saddr 10.0.5.0/24 snat ip to 172.20.0.11\n']);
    exec.calls.length = 0;
    await nft.sync({ ...BASE, snats: two.filter((s) => s !== SNATS[5]) }, { mode: 'partial' });
    expect(exec.calls.map((c) => c.input)).toEqual([
      'flush chain ip natgw snat_10_0_5_0_24\nadd rule ip natgw snat_10_0_5_0_24 ip saddr 10.0.5.0/24 snat ip to 172.20.0.11\n',
    ]);
  });

  it('a new prefix length adds its map and places its dispatch rule by index; the last of a length rewrites only the dispatch rules', async () => {
    const { nft, exec } = await backendAt(BASE);
    const host: Snat = { eip: EIP2, cidr: '10.0.1.6/32', randomFully: false };
    await nft.sync({ ...BASE, snats: [host, ...SNATS] }, { mode: 'partial' });
    expect(exec.calls[0]!.input).toBe(
      [
        'add map ip natgw snat_len_32 { type ipv4_addr : verdict; }',
        'add chain ip natgw snat_10_0_1_6_32',
        'add rule ip natgw snat_10_0_1_6_32 ip saddr 10.0.1.6 snat ip to 172.20.0.11',
        'add element ip natgw snat_len_32 { 10.0.1.6 : goto snat_10_0_1_6_32 }',
        'insert rule ip natgw shared_snat index 0 ip saddr vmap @snat_len_32',
        '',
      ].join('\n'),
    );
    exec.calls.length = 0;
    await nft.sync(BASE, { mode: 'partial' });
    expect(exec.calls[0]!.input).toBe(
      [
        'flush chain ip natgw shared_snat',
        'add rule ip natgw shared_snat ip saddr & 255.255.255.0 vmap @snat_len_24',
        'add rule ip natgw shared_snat ip saddr & 255.255.0.0 vmap @snat_len_16',
        'delete map ip natgw snat_len_32',
        'flush chain ip natgw snat_10_0_1_6_32',
        'delete chain ip natgw snat_10_0_1_6_32',
        '',
      ].join('\n'),
    );
  });

  it('the dry-run script of a full render holds the whole layout', async () => {
    const exec = new RecordingExecutor((r) => (r.args.includes('list') ? { exitCode: 1, stderr: 'Error: No such file or directory' } : undefined));
    const r = await new NftBackend(exec).sync({ ...BASE, snats: SNATS.slice(0, 2) }, { dryRun: true });
    for (const line of [
      'add map ip natgw snat_len_24 { type ipv4_addr : verdict; }',
      'add chain ip natgw snat_10_0_1_0_24',
      'add element ip natgw snat_len_24 { 10.0.0.0 : goto snat_10_0_0_0_24, 10.0.1.0 : goto snat_10_0_1_0_24 }',
      'add rule ip natgw shared_snat ip saddr & 255.255.255.0 vmap @snat_len_24',
      'add rule ip natgw snat_10_0_0_0_24 ip saddr 10.0.0.0/24 snat ip to 172.20.0.10',
    ])
      expect(r.script).toContain(line);
  });
});
