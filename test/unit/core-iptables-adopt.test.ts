/**
 * Adoption from iptables-save (SPEC §3.6): what natgw's chains hold reads back into NatTables,
 * order preserved, so a restart without the state file loses nothing.
 */
import { describe, expect, it } from 'vitest';
import { canonicalOrder, type NatTables } from '../../src/dataplane/netfilter/backend.js';
import { adoptFromSave } from '../../src/dataplane/netfilter/iptables/adopt.js';
import { desiredTables, planTable, renderRestore, type TableWant } from '../../src/dataplane/netfilter/iptables/plan.js';
import { emptyTable, parseSave, type SavedTable } from '../../src/dataplane/netfilter/iptables/save.js';

/** The SavedTable a kernel holds once `want` is in place (built-in chains with natgw's jump). */
function savedOf(want: TableWant, builtins: string[]): SavedTable {
  const rules = new Map<string, string[]>();
  for (const b of builtins) rules.set(b, []);
  for (const [c, r] of want.owned) rules.set(c, [...r]);
  for (const [b, j] of want.jumps) rules.set(b, [...(rules.get(b) ?? []), j]);
  return { chains: new Set([...builtins, ...want.owned.keys()]), rules };
}

/** The same, as iptables-save text from the rendered restore script (exercises parseSave). */
function saveTextOf(table: 'nat' | 'mangle', want: TableWant, builtins: string[]): string {
  const script = renderRestore(table, planTable({ chains: new Set(builtins), rules: new Map() }, want));
  const body = script.split('\n').filter((l) => l.startsWith(':') || l.startsWith('-A '));
  return [`*${table}`, ...builtins.map((b) => `:${b} ACCEPT [0:0]`), ...body, 'COMMIT', ''].join('\n');
}

const NAT_BUILTINS = ['PREROUTING', 'INPUT', 'OUTPUT', 'POSTROUTING'];
const MANGLE_BUILTINS = ['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING'];

const FULL: NatTables = {
  vpcIf: 'eth0',
  extIf: 'net1',
  eips: ['172.18.0.11', '172.18.0.10', '172.18.0.12'],
  snats: [
    { eip: '172.18.0.10', cidr: '10.0.1.5/32', randomFully: false },
    { eip: '172.18.0.10', cidr: '10.0.1.0/24', randomFully: true },
    { eip: '172.18.0.11', cidr: '10.0.1.0/24', randomFully: true },
    { eip: '172.18.0.11', cidr: '10.0.0.0/16', randomFully: false },
    { eip: '172.18.0.12', cidr: '0.0.0.0/0', randomFully: false },
  ],
  dnats: [
    { eip: '172.18.0.11', port: 8080, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 },
    { eip: '172.18.0.10', port: 53, protocol: 'udp', internalIp: '10.0.1.7', internalPort: 5353 },
    { eip: '172.18.0.10', port: 53, protocol: 'tcp', internalIp: '10.0.1.7', internalPort: 53 },
  ],
  fips: [
    { eip: '172.18.0.20', internalIp: '10.0.1.8' },
    { eip: '172.18.0.21', internalIp: '10.0.1.8' },
    { eip: '172.18.0.19', internalIp: '10.0.1.9' },
  ],
};

describe('adoptFromSave', () => {
  it('round trip: render → SavedTable → adopt gives the same NatTables, order preserved', () => {
    const want = desiredTables(FULL);
    const got = adoptFromSave(savedOf(want.nat, NAT_BUILTINS), savedOf(want.mangle, MANGLE_BUILTINS));
    expect(got).toEqual(canonicalOrder(FULL));
  });

  it('round trip through iptables-save text and parseSave', () => {
    const want = desiredTables(FULL);
    const nat = parseSave(saveTextOf('nat', want.nat, NAT_BUILTINS));
    const mangle = parseSave(saveTextOf('mangle', want.mangle, MANGLE_BUILTINS));
    expect(adoptFromSave(nat, mangle)).toEqual(canonicalOrder(FULL));
  });

  it('round trip with other interface names', () => {
    const t: NatTables = { ...FULL, vpcIf: 'net2', extIf: 'ext-0.1' };
    const want = desiredTables(t);
    expect(adoptFromSave(savedOf(want.nat, NAT_BUILTINS), savedOf(want.mangle, MANGLE_BUILTINS))).toEqual(canonicalOrder(t));
  });

  it('round trip of many random tables', () => {
    let seed = 12345;
    const rnd = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32;
    for (let n = 0; n < 200; n++) {
      const eips = Array.from({ length: Math.floor(rnd() * 5) }, (_, i) => `172.18.${n % 200}.${i + 1}`);
      const cidrs = ['10.0.1.5/32', '10.0.1.0/24', '10.0.0.0/20', '10.0.0.0/16'];
      const t: NatTables = {
        vpcIf: 'eth0',
        extIf: 'net1',
        eips,
        snats: cidrs.flatMap((cidr) => eips.filter(() => rnd() < 0.5).map((eip) => ({ eip, cidr, randomFully: rnd() < 0.5 }))),
        dnats: eips
          .filter(() => rnd() < 0.5)
          .map((eip, i) => ({
            eip,
            port: 1 + Math.floor(rnd() * 65535),
            protocol: rnd() < 0.5 ? ('tcp' as const) : ('udp' as const),
            internalIp: `10.0.2.${i + 1}`,
            internalPort: 1 + Math.floor(rnd() * 65535),
          })),
        fips: eips.filter(() => rnd() < 0.5).map((eip, i) => ({ eip: eip.replace(/^172\.18/, '172.19'), internalIp: `10.0.3.${i + 1}` })),
      };
      if (t.snats.length === 0) continue; // extIf is only named by a SNAT rule (see below)
      const want = desiredTables(t);
      expect(adoptFromSave(savedOf(want.nat, NAT_BUILTINS), savedOf(want.mangle, MANGLE_BUILTINS))).toEqual(canonicalOrder(t));
    }
  });

  it('a half FIP (only the SNAT side) is still adopted', () => {
    const want = desiredTables(FULL);
    const nat = savedOf(want.nat, NAT_BUILTINS);
    const rules = new Map(nat.rules);
    rules.set(
      'EXCLUSIVE_DNAT',
      (rules.get('EXCLUSIVE_DNAT') ?? []).filter((r) => !r.includes('172.18.0.21')),
    );
    const got = adoptFromSave({ chains: nat.chains, rules }, savedOf(want.mangle, MANGLE_BUILTINS));
    expect(got?.fips).toHaveLength(3);
    expect(got?.fips).toContainEqual({ eip: '172.18.0.21', internalIp: '10.0.1.8' });
  });

  it('a half FIP (only the DNAT side) is adopted too', () => {
    const want = desiredTables(FULL);
    const nat = savedOf(want.nat, NAT_BUILTINS);
    const rules = new Map(nat.rules);
    rules.set('EXCLUSIVE_SNAT', []);
    expect(adoptFromSave({ chains: nat.chains, rules }, savedOf(want.mangle, MANGLE_BUILTINS))?.fips).toEqual(canonicalOrder(FULL).fips);
  });

  it('null when no natgw chain exists', () => {
    expect(adoptFromSave(emptyTable, emptyTable)).toBeNull();
    const nat = parseSave('*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-X - [0:0]\n-A POSTROUTING -j KUBE-X\nCOMMIT\n');
    const mangle = parseSave('*mangle\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n');
    expect(adoptFromSave(nat, mangle)).toBeNull();
  });

  it('a bare skeleton adopts to empty lists', () => {
    const want = desiredTables({ vpcIf: 'eth0', extIf: 'net1', eips: [], snats: [], dnats: [], fips: [] });
    const got = adoptFromSave(savedOf(want.nat, NAT_BUILTINS), savedOf(want.mangle, MANGLE_BUILTINS));
    expect(got).toEqual({ vpcIf: 'eth0', extIf: '', eips: [], snats: [], dnats: [], fips: [] });
  });

  it('extIf is empty when no SNAT rule names it (the caller falls back to where the EIPs sit)', () => {
    const t: NatTables = { ...FULL, snats: [] };
    const want = desiredTables(t);
    expect(adoptFromSave(savedOf(want.nat, NAT_BUILTINS), savedOf(want.mangle, MANGLE_BUILTINS))?.extIf).toBe('');
  });

  it('vpcIf comes from the hairpin rule when VPC_MARK is gone', () => {
    const want = desiredTables(FULL);
    const got = adoptFromSave(savedOf(want.nat, NAT_BUILTINS), emptyTable);
    expect(got?.vpcIf).toBe('eth0');
    expect(got?.eips).toEqual(canonicalOrder(FULL).eips);
  });

  it('rules without natgw shape are left out; the rest is kept in order', () => {
    const want = desiredTables(FULL);
    const nat = savedOf(want.nat, NAT_BUILTINS);
    const rules = new Map(nat.rules);
    rules.set('SHARED_SNAT', ['-s 10.9.0.0/16 -j MASQUERADE', ...(rules.get('SHARED_SNAT') ?? []), '-s 10.8.0.0/16 -o net1 -j SNAT --to-source 2001:db8::1']);
    rules.set('SHARED_DNAT', ['-d 172.18.0.10/32 -p tcp -m tcp --dport 22 -j ACCEPT', ...(rules.get('SHARED_DNAT') ?? [])]);
    rules.set('HAIRPIN_SNAT', ['-j RETURN', ...(rules.get('HAIRPIN_SNAT') ?? [])]);
    rules.set('EXCLUSIVE_DNAT', ['-d 172.18.0.0/24 -j DNAT --to-destination 10.0.0.1', ...(rules.get('EXCLUSIVE_DNAT') ?? [])]);
    expect(adoptFromSave({ chains: nat.chains, rules }, savedOf(want.mangle, MANGLE_BUILTINS))).toEqual(canonicalOrder(FULL));
  });

  it('SNAT cidrs are canonicalised on the way in', () => {
    const nat = parseSave('*nat\n:SNAT_FILTER - [0:0]\n:SHARED_SNAT - [0:0]\n-A SHARED_SNAT -s 10.0.1.7/24 -o net1 -j SNAT --to-source 1.2.3.4\nCOMMIT\n');
    expect(adoptFromSave(nat, emptyTable)?.snats).toEqual([{ eip: '1.2.3.4', cidr: '10.0.1.0/24', randomFully: false }]);
  });

  it('script-written chains (same layout) are adopted: upgrade from nat-gateway.sh', () => {
    const nat = parseSave(
      [
        '*nat',
        ':PREROUTING ACCEPT [0:0]',
        ':POSTROUTING ACCEPT [0:0]',
        ':DNAT_FILTER - [0:0]',
        ':SNAT_FILTER - [0:0]',
        ':EXCLUSIVE_DNAT - [0:0]',
        ':EXCLUSIVE_SNAT - [0:0]',
        ':SHARED_DNAT - [0:0]',
        ':SHARED_SNAT - [0:0]',
        '-A PREROUTING -j DNAT_FILTER',
        '-A POSTROUTING -j SNAT_FILTER',
        '-A EXCLUSIVE_DNAT -d 1.2.3.4/32 -j DNAT --to-destination 10.0.1.6',
        '-A EXCLUSIVE_SNAT -s 10.0.1.6/32 -j SNAT --to-source 1.2.3.4',
        '-A SHARED_DNAT -d 1.2.3.5/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.1.7:8080',
        '-A SHARED_SNAT -s 10.0.1.0/24 -o net1 -j SNAT --to-source 1.2.3.5 --random-fully',
        'COMMIT',
      ].join('\n'),
    );
    const mangle = parseSave(
      '*mangle\n:PREROUTING ACCEPT [0:0]\n:VPC_MARK - [0:0]\n-A PREROUTING -j VPC_MARK\n-A VPC_MARK -i eth0 -j MARK --set-xmark 0x1/0x1\nCOMMIT\n',
    );
    expect(adoptFromSave(nat, mangle)).toEqual({
      vpcIf: 'eth0',
      extIf: 'net1',
      eips: [],
      snats: [{ eip: '1.2.3.5', cidr: '10.0.1.0/24', randomFully: true }],
      dnats: [{ eip: '1.2.3.5', port: 80, protocol: 'tcp', internalIp: '10.0.1.7', internalPort: 8080 }],
      fips: [{ eip: '1.2.3.4', internalIp: '10.0.1.6' }],
    });
  });
});
