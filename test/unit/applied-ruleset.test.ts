import { availableParallelism } from 'node:os';
import { describe, expect, it } from 'vitest';
import {
  type BootFacts,
  decodeAppliedRuleset,
  encodeAppliedRuleset,
  type RulesetMeta,
  replayVerdict,
  rulesetKey,
  snapshotSeal,
  type TrustFacts,
  trustVerdict,
} from '../../src/state/appliedRuleset.js';
import { replayScripts } from '../../src/dataplane/netfilter/replayRender.js';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';

const SHA = 'a'.repeat(64);
const meta = (over: Partial<RulesetMeta> = {}): RulesetMeta => ({
  natgw: '0.1.0',
  code: '123:456',
  backend: { kind: 'iptables', variant: 'legacy' },
  snapshot: SHA,
  config: { mode: 'auto', iptablesVariant: 'auto', vpcInterface: 'eth0', extInterface: 'net1' },
  cold: [{ family: 4, table: 'nat', chains: ['DNAT_FILTER', 'SHARED_SNAT'] }],
  ...over,
});
const scripts = [
  { step: { tool: 'iptables' as const, family: 4 as const }, text: '*nat\n:DNAT_FILTER - [0:0]\nCOMMIT\n' },
  { step: { tool: 'iptables' as const, family: 6 as const }, text: '*mangle\n:VPC_MARK - [0:0]\nCOMMIT\n' },
];
const facts = (over: Partial<BootFacts> = {}): BootFacts => ({
  snapshot: SHA,
  journal: false,
  locked: false,
  natgwVersion: '0.1.0',
  mode: 'auto',
  iptablesVariant: 'auto',
  backendRecord: { kind: 'iptables', variant: 'legacy' },
  ...over,
});

describe('applied-ruleset file', () => {
  it('round-trips the header and each step script', () => {
    const d = decodeAppliedRuleset(encodeAppliedRuleset(meta(), scripts));
    if (!d.ok) throw new Error(d.why);
    expect(d.header.snapshot).toBe(SHA);
    expect(d.header.steps.map((s) => s.tool)).toEqual(['iptables', 'iptables']);
    expect(d.scripts.map((b) => b.toString())).toEqual(scripts.map((s) => s.text));
  });

  it('refuses a torn file, a changed byte, a foreign or empty file', () => {
    const file = encodeAppliedRuleset(meta(), scripts);
    const torn = decodeAppliedRuleset(file.subarray(0, file.length - 3));
    expect(torn).toMatchObject({ ok: false, why: expect.stringMatching(/torn/) });
    const flipped = Buffer.from(file);
    flipped[flipped.length - 5] = 0x41;
    expect(decodeAppliedRuleset(flipped)).toMatchObject({ ok: false, why: expect.stringMatching(/sha256/) });
    expect(decodeAppliedRuleset(Buffer.from('*nat\nCOMMIT\n'))).toMatchObject({ ok: false });
    expect(decodeAppliedRuleset(Buffer.alloc(0))).toMatchObject({ ok: false });
    expect(decodeAppliedRuleset(file.subarray(0, 40))).toMatchObject({ ok: false });
  });

  it('refuses a header with a step foreign to its backend or a chain name that is not natgw-like', () => {
    const nftWithIptablesStep = encodeAppliedRuleset(meta({ backend: { kind: 'nftables' } }), scripts);
    expect(decodeAppliedRuleset(nftWithIptablesStep)).toMatchObject({ ok: false, why: expect.stringMatching(/backend/) });
    const badChain = encodeAppliedRuleset(meta({ cold: [{ family: 4, table: 'nat', chains: ['-j ACCEPT'] }] }), scripts);
    expect(decodeAppliedRuleset(badChain)).toMatchObject({ ok: false, why: expect.stringMatching(/chain/) });
  });

  it('reads the seal of a state.json', () => {
    expect(snapshotSeal(`{"sha256":"${SHA}","state":{"schema":1}}`)).toBe(SHA);
    expect(snapshotSeal('{"schema":1}')).toBeUndefined();
  });
});

describe('replayVerdict', () => {
  const h = () => {
    const d = decodeAppliedRuleset(encodeAppliedRuleset(meta(), scripts));
    if (!d.ok) throw new Error(d.why);
    return d.header;
  };
  it('replays only the snapshot it was written for, alone, under the backend it names', () => {
    expect(replayVerdict(h(), facts())).toEqual({ replay: true });
    expect(replayVerdict(h(), facts({ mode: 'iptables', iptablesVariant: 'legacy' }))).toEqual({ replay: true });
  });
  it.each([
    ['no state file', { snapshot: undefined }, /missing/],
    ['another snapshot', { snapshot: 'b'.repeat(64) }, /another snapshot/],
    ['a journal', { journal: true }, /journal/],
    ['the lock held', { locked: true }, /lock/],
    ['another natgw version', { natgwVersion: '0.2.0' }, /natgw 0.1.0/],
    ['a mode of the other backend', { mode: 'nftables' }, /GATEWAY_NETFILTER_MODE=nftables/],
    ['another iptables variant', { iptablesVariant: 'nft' }, /NATGW_IPTABLES_VARIANT=nft/],
    ['no backend record', { backendRecord: undefined }, /backend record/],
    ['an unfinished switch', { backendRecord: { kind: 'iptables', variant: 'legacy', pendingCleanup: { kind: 'nftables' } } }, /switch/],
    ['a record of another variant', { backendRecord: { kind: 'iptables', variant: 'nft' } }, /another backend/],
  ] as const)('not with %s', (_what, over, why) => {
    const v = replayVerdict(h(), facts(over as Partial<BootFacts>));
    expect(v.replay).toBe(false);
    expect(v.replay ? '' : v.why).toMatch(why);
  });
});

describe('trustVerdict', () => {
  const d = decodeAppliedRuleset(encodeAppliedRuleset(meta(), scripts));
  if (!d.ok) throw new Error(d.why);
  const t = (over: Partial<TrustFacts> = {}): TrustFacts => ({
    snapshot: SHA,
    journalEntries: 0,
    journalTorn: false,
    backend: { kind: 'iptables', variant: 'legacy' },
    natgwVersion: '0.1.0',
    code: '123:456',
    ...over,
  });
  it('trusts the replay of the very state loaded, by this code, for the backend selected', () => {
    expect(trustVerdict(d.header, t())).toEqual({ replay: true });
  });
  it.each([
    [{ snapshot: 'c'.repeat(64) }],
    [{ journalEntries: 1 }],
    [{ journalTorn: true }],
    [{ backend: { kind: 'nftables' } as const }],
    [{ backend: { kind: 'iptables', variant: 'nft' } as const }],
    [{ code: '999:1' }],
    [{ natgwVersion: '9.9.9' }],
  ])('not when %o differs', (over) => {
    expect(trustVerdict(d.header, t(over)).replay).toBe(false);
  });
  it('keys a cache by everything that makes it valid', () => {
    expect(rulesetKey(meta())).toBe(rulesetKey(meta({ cold: [] })));
    expect(rulesetKey(meta())).not.toBe(rulesetKey(meta({ snapshot: 'd'.repeat(64) })));
    expect(rulesetKey(meta())).not.toBe(rulesetKey(meta({ backend: { kind: 'nftables' } })));
  });
});

describe('replayScripts', () => {
  it('the accounting step builds only natgw_acct, only where it does not exist, with every EIP', () => {
    const acct = replayScripts(want, { kind: 'nftables' }).scripts[1]?.text ?? '';
    expect(acct.startsWith('create table inet natgw_acct\nadd table inet natgw_acct\n')).toBe(true);
    expect(acct).toMatch(/add element inet natgw_acct eip_rx4 \{ 172\.20\.0\.10 \}/);
    expect(acct.match(/^(add|delete) table (\S+ \S+)/gm)?.every((l) => l.endsWith('inet natgw_acct'))).toBe(true);
  });
  const want: NatTables = {
    vpcIf: 'eth0',
    extIf: 'net1',
    eips: ['172.20.0.10'],
    snats: [{ eip: '172.20.0.10', cidr: '10.0.1.0/24' }],
    dnats: [{ eip: '172.20.0.10', port: 8080, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 }],
    fips: [],
  } as unknown as NatTables;
  it('nftables: deletes natgw tables of both families first, then builds them', () => {
    const { scripts: s, cold } = replayScripts(want, { kind: 'nftables' });
    expect(cold).toEqual([]);
    expect(s.map((x) => x.step.tool)).toEqual(['nft', 'accounting']);
    const text = s[0]?.text ?? '';
    expect(text.startsWith('add table ip natgw\ndelete table ip natgw\nadd table ip6 natgw\ndelete table ip6 natgw\nadd table ip natgw\n')).toBe(true);
    expect(text).toContain('172.20.0.10 . tcp . 8080 : 10.0.1.6 . 80');
    expect(text).not.toMatch(/kube-ovn|natgw_acct|flush ruleset/);
  });
  it('nftables, a large state: the phases of a bulk change into absent tables, the prelude apart', () => {
    const dnats = Array.from({ length: 10_000 }, (_, i) => ({
      eip: '172.20.0.10',
      port: 20000 + (i % 40000),
      protocol: 'udp',
      internalIp: '10.0.1.6',
      internalPort: 80,
    }));
    const big = { ...want, dnats: [...(want.dnats as unknown[]), ...dnats] } as unknown as NatTables;
    const { scripts: s } = replayScripts(big, { kind: 'nftables' });
    const phases = s.filter((x) => x.step.tool === 'nft').map((x) => (x.step as { phase?: string }).phase);
    // One core: nothing to load at once, one transaction as ever.
    if (availableParallelism() < 2) return expect(phases).toEqual([undefined]);
    expect(phases[0]).toBe('prelude');
    expect(phases[1]).toBe('first');
    expect(phases.filter((p) => p === 'group').length).toBeGreaterThanOrEqual(2);
    expect(phases.at(-1)).toBe('last');
    expect(s.at(-1)?.step.tool).toBe('accounting');
    const text = (i: number) => s[i]?.text ?? '';
    expect(text(0)).toBe('add table ip natgw\ndelete table ip natgw\nadd table ip6 natgw\ndelete table ip6 natgw\n');
    // Nothing hooked before the last phase; the first creates (refused where the table exists).
    expect(text(1)).toMatch(/^create table ip natgw\n/);
    for (let i = 1; i < phases.length - 1; i++) expect(text(i)).not.toMatch(/ hook /);
    expect(text(phases.length - 1)).toMatch(/ hook prerouting /);
    // The groups together hold every element once.
    const groupText = s
      .filter((x) => (x.step as { phase?: string }).phase === 'group')
      .map((x) => x.text)
      .join('');
    for (const port of [8080, 20000, 29999]) expect(groupText.split(` . ${port} : `).length - 1).toBe(1);
    // Round trip through the file, phases kept; out of order they are refused.
    const d = decodeAppliedRuleset(encodeAppliedRuleset(meta({ backend: { kind: 'nftables' }, cold: [] }), s));
    if (!d.ok) throw new Error(d.why);
    expect(d.header.steps.filter((x) => x.tool === 'nft').map((x) => (x as { phase?: string }).phase)).toEqual(phases);
    const swapped = [s[1], s[0], ...s.slice(2)] as typeof s;
    expect(decodeAppliedRuleset(encodeAppliedRuleset(meta({ backend: { kind: 'nftables' }, cold: [] }), swapped))).toMatchObject({
      ok: false,
      why: expect.stringMatching(/phases/),
    });
    const unphased = [...s.slice(0, -1), { step: { tool: 'nft' as const }, text: 'add table ip natgw\n' }, ...s.slice(-1)];
    expect(decodeAppliedRuleset(encodeAppliedRuleset(meta({ backend: { kind: 'nftables' }, cold: [] }), unphased))).toMatchObject({
      ok: false,
      why: expect.stringMatching(/phases/),
    });
  });
  it('iptables: one IPv4 restore (nat and mangle), no IPv6 one without IPv6 objects, cold checks for all four tables', () => {
    const { scripts: s, cold } = replayScripts(want, { kind: 'iptables', variant: 'legacy' });
    expect(s.map((x) => x.step)).toEqual([{ tool: 'iptables', family: 4 }, { tool: 'accounting' }]);
    expect(s[0]?.text).toMatch(/^\*nat\n:DNAT_FILTER - \[0:0\][\s\S]*-A PREROUTING -j DNAT_FILTER[\s\S]*COMMIT\n\*mangle\n[\s\S]*COMMIT\n$/);
    expect(cold.map((c) => `${c.family}/${c.table}`)).toEqual(['4/nat', '4/mangle', '6/nat', '6/mangle']);
    expect(cold[0]?.chains).toContain('SHARED_SNAT');
    expect(cold[1]?.chains).toEqual(['VPC_MARK']);
  });
});
