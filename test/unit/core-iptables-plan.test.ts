/**
 * The iptables plan (SPEC §2 layout): exact save-form lines, minimal element-level edits,
 * never re-declaring an existing chain (in --noflush mode that would flush it), never touching
 * foreign rules. A tiny pure interpreter applies the planned lines to a SavedTable, and a seeded
 * property test checks that applying planChain's lines to `have` gives exactly `want`.
 */
import { describe, expect, it } from 'vitest';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { desiredTables, planTable, renderRestore, type TableWant } from '../../src/dataplane/netfilter/iptables/plan.js';
import { planChain } from '../helpers/iptablesChain.js';
import { emptyTable, parseSave, type SavedTable } from '../../src/dataplane/netfilter/iptables/save.js';
import { prng } from '../helpers/prng.js';

// ---------------------------------------------------------------------------------------------
// A pure model of `iptables-restore --noflush` for the line kinds the plan emits.
// ---------------------------------------------------------------------------------------------

interface MutableTable {
  chains: Set<string>;
  rules: Map<string, string[]>;
}

const BUILTIN: Record<'nat' | 'mangle', string[]> = {
  nat: ['PREROUTING', 'INPUT', 'OUTPUT', 'POSTROUTING'],
  mangle: ['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING'],
};

function toMutable(t: SavedTable): MutableTable {
  return { chains: new Set(t.chains), rules: new Map([...t.rules].map(([k, v]) => [k, [...v]])) };
}

function toSaved(t: MutableTable): SavedTable {
  return { chains: t.chains, rules: t.rules };
}

/**
 * Apply restore lines like iptables-restore --noflush does: `:CHAIN` creates a chain or
 * FLUSHES an existing one; -A appends; -I n inserts at position n (1..len+1); -D spec deletes
 * the FIRST matching rule (or -D n deletes rule n); -F flushes. Anything invalid throws (the
 * kernel would refuse the whole transaction).
 */
function applyLines(t: SavedTable, lines: readonly string[]): SavedTable {
  const m = toMutable(t);
  const list = (chain: string): string[] => {
    if (!m.chains.has(chain)) throw new Error(`chain ${chain} does not exist`);
    let l = m.rules.get(chain);
    if (!l) {
      l = [];
      m.rules.set(chain, l);
    }
    return l;
  };
  for (const line of lines) {
    let r: RegExpExecArray | null;
    if ((r = /^:(\S+) \S+ \[\d+:\d+\]$/.exec(line))) {
      const name = r[1] ?? '';
      if (m.chains.has(name)) m.rules.set(name, []); // --noflush: a declaration flushes the chain
      m.chains.add(name);
    } else if ((r = /^-A (\S+) (.+)$/.exec(line))) {
      list(r[1] ?? '').push(r[2] ?? '');
    } else if ((r = /^-I (\S+) (\d+) (.+)$/.exec(line))) {
      const l = list(r[1] ?? '');
      const n = Number(r[2]);
      if (n < 1 || n > l.length + 1) throw new Error(`-I position ${n} out of range in ${line}`);
      l.splice(n - 1, 0, r[3] ?? '');
    } else if ((r = /^-D (\S+) (\d+)$/.exec(line))) {
      const l = list(r[1] ?? '');
      const n = Number(r[2]);
      if (n < 1 || n > l.length) throw new Error(`-D position ${n} out of range`);
      l.splice(n - 1, 1);
    } else if ((r = /^-D (\S+) (.+)$/.exec(line))) {
      const l = list(r[1] ?? '');
      const i = l.indexOf(r[2] ?? '');
      if (i === -1) throw new Error(`-D: no such rule: ${line}`);
      l.splice(i, 1);
    } else if ((r = /^-F (\S+)$/.exec(line))) {
      list(r[1] ?? '').length = 0;
    } else {
      throw new Error(`unexpected restore line: ${line}`);
    }
  }
  return toSaved(m);
}

function table(kind: 'nat' | 'mangle', rules: Record<string, string[]> = {}, extraChains: string[] = []): SavedTable {
  const chains = new Set([...BUILTIN[kind], ...extraChains, ...Object.keys(rules)]);
  return { chains, rules: new Map(Object.entries(rules).map(([k, v]) => [k, [...v]])) };
}

/** The state a kernel is in after the plan, as far as natgw is concerned. */
function expectSatisfies(after: SavedTable, want: TableWant, before: SavedTable): void {
  for (const [chain, rules] of want.owned) {
    expect(after.chains.has(chain)).toBe(true);
    expect(after.rules.get(chain) ?? []).toEqual(rules);
  }
  for (const [builtin, jump] of want.jumps) {
    const got = after.rules.get(builtin) ?? [];
    expect(got.filter((r) => r === jump)).toHaveLength(1);
    // Foreign rules keep their order.
    expect(got.filter((r) => r !== jump)).toEqual((before.rules.get(builtin) ?? []).filter((r) => r !== jump));
  }
  // Chains natgw does not own are untouched.
  for (const [chain, rules] of before.rules) {
    if (want.owned.has(chain) || want.jumps.has(chain)) continue;
    expect(after.rules.get(chain)).toEqual(rules);
  }
}

// ---------------------------------------------------------------------------------------------

const TABLES: NatTables = {
  vpcIf: 'eth0',
  extIf: 'net1',
  eips: ['172.18.0.10', '172.18.0.11'],
  snats: [
    { eip: '172.18.0.10', cidr: '10.0.1.5/32', randomFully: false },
    { eip: '172.18.0.10', cidr: '10.0.1.0/24', randomFully: true },
    { eip: '172.18.0.11', cidr: '10.0.0.0/16', randomFully: false },
  ],
  dnats: [
    { eip: '172.18.0.10', port: 8080, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 },
    { eip: '172.18.0.11', port: 53, protocol: 'udp', internalIp: '10.0.1.7', internalPort: 5353 },
  ],
  fips: [{ eip: '172.18.0.12', internalIp: '10.0.1.8' }],
};

const EMPTY: NatTables = { vpcIf: 'eth0', extIf: 'net1', eips: [], snats: [], dnats: [], fips: [] };

describe('desiredTables: the exact save forms of SPEC §2', () => {
  const want = desiredTables(TABLES);
  const rulesOf = (t: TableWant, chain: string) => (t.owned.get(chain) ?? []).map((r) => `-A ${chain} ${r}`);

  it('skeleton chains and jumps', () => {
    expect(rulesOf(want.nat, 'DNAT_FILTER')).toEqual(['-A DNAT_FILTER -j EXCLUSIVE_DNAT', '-A DNAT_FILTER -j SHARED_DNAT']);
    expect(rulesOf(want.nat, 'SNAT_FILTER')).toEqual(['-A SNAT_FILTER -j EXCLUSIVE_SNAT', '-A SNAT_FILTER -j SHARED_SNAT', '-A SNAT_FILTER -j HAIRPIN_SNAT']);
    expect([...want.nat.owned.keys()].sort()).toEqual(
      ['DNAT_FILTER', 'SNAT_FILTER', 'EXCLUSIVE_DNAT', 'EXCLUSIVE_SNAT', 'SHARED_DNAT', 'SHARED_SNAT', 'HAIRPIN_SNAT'].sort(),
    );
    expect([...want.nat.jumps]).toEqual([
      ['PREROUTING', '-j DNAT_FILTER'],
      ['POSTROUTING', '-j SNAT_FILTER'],
    ]);
    expect([...want.mangle.owned.keys()]).toEqual(['VPC_MARK']);
    expect([...want.mangle.jumps]).toEqual([['PREROUTING', '-j VPC_MARK']]);
  });

  it('VPC_MARK', () => {
    expect(rulesOf(want.mangle, 'VPC_MARK')).toEqual(['-A VPC_MARK -i eth0 -j MARK --set-xmark 0x1/0x1']);
  });

  it('floating IP pair: no -o, no --random-fully', () => {
    expect(rulesOf(want.nat, 'EXCLUSIVE_DNAT')).toEqual(['-A EXCLUSIVE_DNAT -d 172.18.0.12/32 -j DNAT --to-destination 10.0.1.8']);
    expect(rulesOf(want.nat, 'EXCLUSIVE_SNAT')).toEqual(['-A EXCLUSIVE_SNAT -s 10.0.1.8/32 -j SNAT --to-source 172.18.0.12']);
  });

  it('DNAT', () => {
    expect(rulesOf(want.nat, 'SHARED_DNAT')).toEqual([
      '-A SHARED_DNAT -d 172.18.0.10/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.0.1.6:80',
      '-A SHARED_DNAT -d 172.18.0.11/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.0.1.7:5353',
    ]);
  });

  it('SNAT in the given (descending prefix) order, with and without --random-fully', () => {
    expect(rulesOf(want.nat, 'SHARED_SNAT')).toEqual([
      '-A SHARED_SNAT -s 10.0.1.5/32 -o net1 -j SNAT --to-source 172.18.0.10',
      '-A SHARED_SNAT -s 10.0.1.0/24 -o net1 -j SNAT --to-source 172.18.0.10 --random-fully',
      '-A SHARED_SNAT -s 10.0.0.0/16 -o net1 -j SNAT --to-source 172.18.0.11',
    ]);
  });

  it('hairpin SNAT per EIP', () => {
    expect(rulesOf(want.nat, 'HAIRPIN_SNAT')).toEqual([
      '-A HAIRPIN_SNAT -o eth0 -m mark --mark 0x1/0x1 -m conntrack --ctstate DNAT --ctorigdst 172.18.0.10 -j SNAT --to-source 172.18.0.10 --random-fully',
      '-A HAIRPIN_SNAT -o eth0 -m mark --mark 0x1/0x1 -m conntrack --ctstate DNAT --ctorigdst 172.18.0.11 -j SNAT --to-source 172.18.0.11 --random-fully',
    ]);
  });

  it('empty NatTables: skeleton only', () => {
    const w = desiredTables(EMPTY);
    for (const c of ['EXCLUSIVE_DNAT', 'EXCLUSIVE_SNAT', 'SHARED_DNAT', 'SHARED_SNAT', 'HAIRPIN_SNAT']) expect(w.nat.owned.get(c)).toEqual([]);
    expect(w.nat.owned.get('SNAT_FILTER')).toHaveLength(3);
  });
});

describe('planTable', () => {
  it('an empty kernel gets chain declarations, then the rules, then the jumps', () => {
    const want = desiredTables(EMPTY);
    const plan = planTable(table('nat'), want.nat);
    expect(plan.lines).toEqual([
      ':DNAT_FILTER - [0:0]',
      ':SNAT_FILTER - [0:0]',
      ':EXCLUSIVE_DNAT - [0:0]',
      ':EXCLUSIVE_SNAT - [0:0]',
      ':SHARED_DNAT - [0:0]',
      ':SHARED_SNAT - [0:0]',
      ':HAIRPIN_SNAT - [0:0]',
      '-A DNAT_FILTER -j EXCLUSIVE_DNAT',
      '-A DNAT_FILTER -j SHARED_DNAT',
      '-A SNAT_FILTER -j EXCLUSIVE_SNAT',
      '-A SNAT_FILTER -j SHARED_SNAT',
      '-A SNAT_FILTER -j HAIRPIN_SNAT',
      '-A PREROUTING -j DNAT_FILTER',
      '-A POSTROUTING -j SNAT_FILTER',
    ]);
    expect(plan.changes).toBe(7);
    expect(renderRestore('nat', plan)).toBe(`*nat\n${plan.lines.join('\n')}\nCOMMIT\n`);

    const mangle = planTable(table('mangle'), want.mangle);
    expect(mangle.lines).toEqual([':VPC_MARK - [0:0]', '-A VPC_MARK -i eth0 -j MARK --set-xmark 0x1/0x1', '-A PREROUTING -j VPC_MARK']);
    expect(mangle.changes).toBe(2);
    expect(renderRestore('mangle', mangle)).toBe(
      '*mangle\n:VPC_MARK - [0:0]\n-A VPC_MARK -i eth0 -j MARK --set-xmark 0x1/0x1\n-A PREROUTING -j VPC_MARK\nCOMMIT\n',
    );
  });

  it('an empty kernel with rules: every rule appended, the result is exactly the desired tables', () => {
    const want = desiredTables(TABLES);
    const have = table('nat');
    const plan = planTable(have, want.nat);
    expect(plan.lines.filter((l) => l.startsWith(':'))).toHaveLength(7);
    expect(plan.lines.filter((l) => !l.startsWith(':')).every((l) => l.startsWith('-A '))).toBe(true);
    // 2 + 3 skeleton rules, 1+1 FIP, 2 DNAT, 3 SNAT, 2 hairpin, 2 jumps
    expect(plan.changes).toBe(16);
    expectSatisfies(applyLines(have, plan.lines), want.nat, have);
  });

  it('also works from emptyTable (no built-in chains known)', () => {
    const want = desiredTables(TABLES);
    const plan = planTable(emptyTable, want.nat);
    expect(plan.lines).toContain('-A PREROUTING -j DNAT_FILTER');
    expect(plan.lines).toContain('-A POSTROUTING -j SNAT_FILTER');
  });

  it('a kernel already equal: no lines, 0 changes, empty script', () => {
    const want = desiredTables(TABLES);
    for (const kind of ['nat', 'mangle'] as const) {
      const once = applyLines(table(kind), planTable(table(kind), want[kind]).lines);
      const plan = planTable(once, want[kind]);
      expect(plan).toEqual({ lines: [], changes: 0 });
      expect(renderRestore(kind, plan)).toBe('');
    }
  });

  it('a kernel already equal, read through parseSave of real iptables-save text', () => {
    const save = [
      '# Generated by iptables-save v1.8.9 (nf_tables) on Mon Jan  1 00:00:00 2024',
      '*nat',
      ':PREROUTING ACCEPT [0:0]',
      ':INPUT ACCEPT [0:0]',
      ':OUTPUT ACCEPT [0:0]',
      ':POSTROUTING ACCEPT [0:0]',
      ':DNAT_FILTER - [0:0]',
      ':EXCLUSIVE_DNAT - [0:0]',
      ':EXCLUSIVE_SNAT - [0:0]',
      ':HAIRPIN_SNAT - [0:0]',
      ':SHARED_DNAT - [0:0]',
      ':SHARED_SNAT - [0:0]',
      ':SNAT_FILTER - [0:0]',
      ':KUBE-FOREIGN - [0:0]',
      '-A PREROUTING -j KUBE-FOREIGN',
      '-A PREROUTING -j DNAT_FILTER',
      '-A POSTROUTING -j SNAT_FILTER',
      '-A POSTROUTING -s 192.168.0.0/16 -j MASQUERADE',
      '-A DNAT_FILTER -j EXCLUSIVE_DNAT',
      '-A DNAT_FILTER -j SHARED_DNAT',
      '-A EXCLUSIVE_DNAT -d 172.18.0.12/32 -j DNAT --to-destination 10.0.1.8',
      '-A EXCLUSIVE_SNAT -s 10.0.1.8/32 -j SNAT --to-source 172.18.0.12',
      '-A HAIRPIN_SNAT -o eth0 -m mark --mark 0x1/0x1 -m conntrack --ctstate DNAT --ctorigdst 172.18.0.10 -j SNAT --to-source 172.18.0.10 --random-fully',
      '-A HAIRPIN_SNAT -o eth0 -m mark --mark 0x1/0x1 -m conntrack --ctstate DNAT --ctorigdst 172.18.0.11 -j SNAT --to-source 172.18.0.11 --random-fully',
      '-A SHARED_DNAT -d 172.18.0.10/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.0.1.6:80',
      '-A SHARED_DNAT -d 172.18.0.11/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.0.1.7:5353',
      '-A SHARED_SNAT -s 10.0.1.5/32 -o net1 -j SNAT --to-source 172.18.0.10',
      '-A SHARED_SNAT -s 10.0.1.0/24 -o net1 -j SNAT --to-source 172.18.0.10 --random-fully',
      '-A SHARED_SNAT -s 10.0.0.0/16 -o net1 -j SNAT --to-source 172.18.0.11',
      '-A SNAT_FILTER -j EXCLUSIVE_SNAT',
      '-A SNAT_FILTER -j SHARED_SNAT',
      '-A SNAT_FILTER -j HAIRPIN_SNAT',
      'COMMIT',
      '# Completed on Mon Jan  1 00:00:00 2024',
      '',
    ].join('\n');
    const have = parseSave(save);
    expect(have.chains.has('KUBE-FOREIGN')).toBe(true);
    expect(have.rules.get('SHARED_SNAT')).toHaveLength(3);
    expect(planTable(have, desiredTables(TABLES).nat)).toEqual({ lines: [], changes: 0 });
  });

  it('a missing rule in the middle: one -I at its position', () => {
    const want = desiredTables(TABLES);
    const full = applyLines(table('nat'), planTable(table('nat'), want.nat).lines);
    const snats = full.rules.get('SHARED_SNAT') ?? [];
    const have: SavedTable = { chains: full.chains, rules: new Map([...full.rules, ['SHARED_SNAT', [snats[0] ?? '', snats[2] ?? '']]]) };
    const plan = planTable(have, want.nat);
    expect(plan.lines).toEqual(['-I SHARED_SNAT 2 -s 10.0.1.0/24 -o net1 -j SNAT --to-source 172.18.0.10 --random-fully']);
    expect(plan.changes).toBe(1);
  });

  it('a missing first or last rule: -I 1 or -A', () => {
    expect(planChain('C', ['b', 'c'], ['a', 'b', 'c']).lines).toEqual(['-I C 1 a']);
    expect(planChain('C', ['a', 'b'], ['a', 'b', 'c']).lines).toEqual(['-A C c']);
  });

  it('an extra rule: one -D', () => {
    const want = desiredTables(TABLES);
    const full = applyLines(table('nat'), planTable(table('nat'), want.nat).lines);
    const dnats = [...(full.rules.get('SHARED_DNAT') ?? [])];
    const stray = '-d 172.18.0.99/32 -p tcp -m tcp --dport 22 -j DNAT --to-destination 10.0.1.99:22';
    dnats.splice(1, 0, stray);
    const have: SavedTable = { chains: full.chains, rules: new Map([...full.rules, ['SHARED_DNAT', dnats]]) };
    const plan = planTable(have, want.nat);
    expect(plan.lines).toEqual(['-D SHARED_DNAT 2']);
    expect(plan.changes).toBe(1);
  });

  it('reordered rules: -F and a full rewrite of that chain only', () => {
    const want = desiredTables(TABLES);
    const full = applyLines(table('nat'), planTable(table('nat'), want.nat).lines);
    const snats = [...(full.rules.get('SHARED_SNAT') ?? [])].reverse();
    const have: SavedTable = { chains: full.chains, rules: new Map([...full.rules, ['SHARED_SNAT', snats]]) };
    const plan = planTable(have, want.nat);
    expect(plan.lines).toEqual([
      '-F SHARED_SNAT',
      '-A SHARED_SNAT -s 10.0.1.5/32 -o net1 -j SNAT --to-source 172.18.0.10',
      '-A SHARED_SNAT -s 10.0.1.0/24 -o net1 -j SNAT --to-source 172.18.0.10 --random-fully',
      '-A SHARED_SNAT -s 10.0.0.0/16 -o net1 -j SNAT --to-source 172.18.0.11',
    ]);
    expect(plan.changes).toBe(6);
  });

  it('a duplicated built-in jump: one -D per extra copy, foreign rules untouched', () => {
    const want = desiredTables(EMPTY);
    const full = applyLines(table('nat'), planTable(table('nat'), want.nat).lines);
    const have: SavedTable = {
      chains: full.chains,
      rules: new Map([
        ...full.rules,
        ['PREROUTING', ['-j KUBE-A', '-j DNAT_FILTER', '-j KUBE-B', '-j DNAT_FILTER']],
        ['POSTROUTING', ['-j SNAT_FILTER', '-j SNAT_FILTER', '-j SNAT_FILTER', '-s 10.0.0.0/8 -j MASQUERADE']],
      ]),
    };
    const plan = planTable(have, want.nat);
    expect(plan.lines).toEqual(['-D PREROUTING -j DNAT_FILTER', '-D POSTROUTING -j SNAT_FILTER', '-D POSTROUTING -j SNAT_FILTER']);
    expect(plan.changes).toBe(3);
    const after = applyLines(have, plan.lines);
    expect(after.rules.get('PREROUTING')).toEqual(['-j KUBE-A', '-j KUBE-B', '-j DNAT_FILTER']);
    expect(after.rules.get('POSTROUTING')).toEqual(['-j SNAT_FILTER', '-s 10.0.0.0/8 -j MASQUERADE']);
  });

  it('existing chains are never re-declared, even when empty', () => {
    const want = desiredTables(TABLES);
    const have = table('nat', {}, [...want.nat.owned.keys()]);
    const plan = planTable(have, want.nat);
    expect(plan.lines.filter((l) => l.startsWith(':'))).toEqual([]);
    expectSatisfies(applyLines(have, plan.lines), want.nat, have);
    // Only the missing one is declared.
    const partial = table(
      'nat',
      {},
      [...want.nat.owned.keys()].filter((c) => c !== 'HAIRPIN_SNAT'),
    );
    expect(planTable(partial, want.nat).lines.filter((l) => l.startsWith(':'))).toEqual([':HAIRPIN_SNAT - [0:0]']);
  });

  it('foreign rules in built-in chains and foreign chains are untouched', () => {
    const want = desiredTables(TABLES);
    const have = table('nat', {
      PREROUTING: ['-j KUBE-SERVICES', '-d 10.96.0.1/32 -j DNAT --to-destination 10.0.0.1'],
      POSTROUTING: ['-j KUBE-POSTROUTING', '-o net1 -j MASQUERADE'],
      'KUBE-SERVICES': ['-j RETURN'],
      OUTPUT: ['-j KUBE-SERVICES'],
    });
    const plan = planTable(have, want.nat);
    for (const l of plan.lines) {
      expect(l).not.toMatch(/^-[DIF] (PREROUTING|POSTROUTING|OUTPUT|KUBE-SERVICES)\b/);
      expect(l).not.toMatch(/^:(PREROUTING|POSTROUTING|OUTPUT|INPUT|KUBE-SERVICES) /);
    }
    const after = applyLines(have, plan.lines);
    expectSatisfies(after, want.nat, have);
    expect(after.rules.get('PREROUTING')).toEqual(['-j KUBE-SERVICES', '-d 10.96.0.1/32 -j DNAT --to-destination 10.0.0.1', '-j DNAT_FILTER']);
    expect(planTable(after, want.nat)).toEqual({ lines: [], changes: 0 });
  });

  it('mangle: a VPC_MARK for another interface is replaced', () => {
    const want = desiredTables(TABLES);
    const have = table('mangle', { PREROUTING: ['-j VPC_MARK'], VPC_MARK: ['-i eth9 -j MARK --set-xmark 0x1/0x1'] });
    const plan = planTable(have, want.mangle);
    expect(plan.lines).toEqual(['-D VPC_MARK 1', '-A VPC_MARK -i eth0 -j MARK --set-xmark 0x1/0x1']);
    expectSatisfies(applyLines(have, plan.lines), want.mangle, have);
  });
});

// ---------------------------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------------------------

function shuffle<T>(rnd: () => number, xs: T[]): T[] {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(rnd() * (i + 1));
    [xs[i], xs[j]] = [xs[j] as T, xs[i] as T];
  }
  return xs;
}

/**
 * A random (have, want) pair. `want` has unique rules (natgw's desired rules are unique by
 * identity); `have` is a mutation of want: drops, extras, swaps, or a full shuffle, and
 * optionally duplicated copies of wanted rules.
 */
function randomCase(rnd: () => number, duplicates: boolean): { have: string[]; want: string[] } {
  const universe = Array.from({ length: 12 }, (_, i) => `-s 10.0.${i}.0/24 -o net1 -j SNAT --to-source 1.2.3.${i}`);
  const want = shuffle(rnd, [...universe]).slice(0, Math.floor(rnd() * 9));
  let have: string[];
  const mode = rnd();
  if (mode < 0.15) have = [];
  else if (mode < 0.3) have = shuffle(rnd, [...want]);
  else {
    have = want.filter(() => rnd() > 0.3);
    const extras = universe.filter((r) => !want.includes(r));
    const nExtra = Math.floor(rnd() * 4);
    for (let i = 0; i < nExtra && extras.length; i++) {
      have.splice(Math.floor(rnd() * (have.length + 1)), 0, extras[Math.floor(rnd() * extras.length)] ?? '');
    }
    if (rnd() < 0.2 && have.length >= 2) {
      const i = Math.floor(rnd() * have.length);
      const j = Math.floor(rnd() * have.length);
      [have[i], have[j]] = [have[j] ?? '', have[i] ?? ''];
    }
  }
  if (duplicates && want.length > 0) {
    const n = 1 + Math.floor(rnd() * 3);
    for (let i = 0; i < n; i++) have.splice(Math.floor(rnd() * (have.length + 1)), 0, want[Math.floor(rnd() * want.length)] ?? '');
  }
  return { have, want };
}

function applyChain(have: string[], lines: readonly string[]): string[] {
  const t = applyLines({ chains: new Set(['C']), rules: new Map([['C', have]]) }, lines);
  return [...(t.rules.get('C') ?? [])];
}

describe('planChain property: applying the lines to have yields exactly want', () => {
  it('500 random cases without duplicated kernel rules', () => {
    const rnd = prng(0xc0ffee);
    for (let n = 0; n < 500; n++) {
      const { have, want } = randomCase(rnd, false);
      const plan = planChain('C', have, want);
      const after = applyChain(have, plan.lines);
      expect(after, JSON.stringify({ n, have, want, lines: plan.lines })).toEqual(want);
      // Minimal when nothing needed, and changes count sensible.
      if (have.join('\n') === want.join('\n')) expect(plan.lines).toEqual([]);
      expect(plan.changes).toBeGreaterThanOrEqual(plan.lines.length === 0 ? 0 : 1);
      // Idempotence: a second plan on the result does nothing.
      expect(planChain('C', after, want)).toEqual({ lines: [], changes: 0 });
    }
  });

  it('element-level edits when the kept rules are in order (no -F)', () => {
    const rnd = prng(42);
    for (let n = 0; n < 500; n++) {
      const universe = Array.from({ length: 10 }, (_, i) => `r${i}`);
      const want = universe.filter(() => rnd() < 0.6);
      // have: an order-preserving subset of want plus extras not in want.
      const have = want.filter(() => rnd() < 0.7);
      for (const x of universe.filter((r) => !want.includes(r))) if (rnd() < 0.3) have.splice(Math.floor(rnd() * (have.length + 1)), 0, x);
      const plan = planChain('C', have, want);
      expect(plan.lines.some((l) => l.startsWith('-F'))).toBe(false);
      const missing = want.filter((r) => !have.includes(r)).length;
      const extra = have.filter((r) => !want.includes(r)).length;
      expect(plan.lines).toHaveLength(missing + extra);
      expect(plan.changes).toBe(missing + extra);
      expect(applyChain(have, plan.lines)).toEqual(want);
    }
  });

  // BUG (src/dataplane/netfilter/iptables/plan.ts, planChain, the `-D ${chain} ${r}` lines):
  // when the kernel holds a wanted rule twice, planChain keeps the FIRST copy and deletes the
  // later one by spec, but `iptables -D CHAIN <spec>` removes the FIRST matching rule. E.g.
  // have [a, b, a], want [a, b] → `-D C a` → kernel [b, a] (wrong order, and 1 change reported
  // as success). In SNAT_FILTER that puts SHARED_SNAT before EXCLUSIVE_SNAT. Fix: delete by
  // position (`-D CHAIN <n>`, highest index first, computed before the inserts), or keep the
  // LAST copies of duplicated rules as "kept", or fall back to -F + rewrite when a deleted
  // spec also occurs among the kept rules.
  it('500 random cases with duplicated copies of wanted rules in the kernel', () => {
    const rnd = prng(7);
    for (let n = 0; n < 500; n++) {
      const { have, want } = randomCase(rnd, true);
      const plan = planChain('C', have, want);
      expect(applyChain(have, plan.lines), JSON.stringify({ n, have, want, lines: plan.lines })).toEqual(want);
    }
  });

  it('minimal example of the duplicate bug: have [a, b, a], want [a, b]', () => {
    const plan = planChain('C', ['a', 'b', 'a'], ['a', 'b']);
    expect(applyChain(['a', 'b', 'a'], plan.lines)).toEqual(['a', 'b']);
  });

  it('the duplicate bug in the skeleton: SNAT_FILTER with a second EXCLUSIVE_SNAT jump', () => {
    const want = desiredTables(EMPTY);
    const have = table(
      'nat',
      {
        PREROUTING: ['-j DNAT_FILTER'],
        POSTROUTING: ['-j SNAT_FILTER'],
        DNAT_FILTER: ['-j EXCLUSIVE_DNAT', '-j SHARED_DNAT'],
        SNAT_FILTER: ['-j EXCLUSIVE_SNAT', '-j SHARED_SNAT', '-j HAIRPIN_SNAT', '-j EXCLUSIVE_SNAT'],
      },
      ['EXCLUSIVE_DNAT', 'EXCLUSIVE_SNAT', 'SHARED_DNAT', 'SHARED_SNAT', 'HAIRPIN_SNAT'],
    );
    const after = applyLines(have, planTable(have, want.nat).lines);
    expect(after.rules.get('SNAT_FILTER')).toEqual(['-j EXCLUSIVE_SNAT', '-j SHARED_SNAT', '-j HAIRPIN_SNAT']);
  });

  it('500 random whole-table cases: owned chains exact, one jump each, foreign rules untouched', () => {
    const rnd = prng(99);
    const eipsU = ['172.18.0.10', '172.18.0.11', '172.18.0.12', '172.18.0.13'];
    const cidrsU = ['10.0.1.5/32', '10.0.1.0/24', '10.0.2.0/24', '10.0.0.0/16'];
    for (let n = 0; n < 500; n++) {
      const sub = <T>(xs: readonly T[]): T[] => xs.filter(() => rnd() < 0.5);
      const nat: NatTables = {
        vpcIf: 'eth0',
        extIf: 'net1',
        eips: sub(eipsU),
        snats: cidrsU.flatMap((cidr) => sub(eipsU).map((eip) => ({ eip, cidr, randomFully: rnd() < 0.5 }))),
        dnats: sub(eipsU).map((eip, i) => ({
          eip,
          port: 80 + i,
          protocol: rnd() < 0.5 ? ('tcp' as const) : ('udp' as const),
          internalIp: '10.0.1.6',
          internalPort: 80,
        })),
        fips: sub(eipsU).map((eip, i) => ({ eip, internalIp: `10.0.3.${i + 1}` })),
      };
      const want = desiredTables(nat).nat;
      // A kernel: some owned chains present with a mutated rule list (no duplicates),
      // foreign rules around the jumps.
      const rules: Record<string, string[]> = {};
      const chains: string[] = [];
      for (const [chain, list] of want.owned) {
        if (rnd() < 0.2) continue;
        chains.push(chain);
        // Some wanted rules dropped, maybe a stray rule, sometimes shuffled.
        const stray = [`-j RETURN`, `-s 192.168.${n % 250}.0/24 -j ACCEPT`];
        const h = list.filter(() => rnd() < 0.7);
        if (rnd() < 0.3) h.splice(Math.floor(rnd() * (h.length + 1)), 0, stray[Math.floor(rnd() * stray.length)] ?? '');
        if (rnd() < 0.1) shuffle(rnd, h);
        rules[chain] = h;
      }
      const jumps = (builtin: string, jump: string) => {
        const l = [`-j KUBE-${builtin}`];
        const copies = Math.floor(rnd() * 3);
        for (let i = 0; i < copies; i++) l.splice(Math.floor(rnd() * (l.length + 1)), 0, jump);
        if (rnd() < 0.5) l.push('-o net9 -j MASQUERADE');
        return l;
      };
      rules.PREROUTING = jumps('PREROUTING', '-j DNAT_FILTER');
      rules.POSTROUTING = jumps('POSTROUTING', '-j SNAT_FILTER');
      rules['KUBE-FOREIGN'] = ['-j RETURN'];
      const have = table('nat', rules, chains);
      const plan = planTable(have, want);
      const after = applyLines(have, plan.lines);
      expectSatisfies(after, want, have);
      expect(planTable(after, want)).toEqual({ lines: [], changes: 0 });
      // Declarations only for chains that did not exist.
      for (const l of plan.lines.filter((x) => x.startsWith(':'))) expect(have.chains.has(l.slice(1).split(' ')[0] ?? '')).toBe(false);
    }
  });
});

describe('parseSave', () => {
  it('collects chains (built-in and user) and rules per chain in order; ignores comments and table lines', () => {
    const t = parseSave('# x\n*nat\n:PREROUTING ACCEPT [1:2]\n:FOO - [0:0]\n-A FOO -j RETURN\n-A PREROUTING -j FOO\n-A FOO -s 1.2.3.4/32 -j ACCEPT\nCOMMIT\n');
    expect([...t.chains]).toEqual(['PREROUTING', 'FOO']);
    expect(t.rules.get('FOO')).toEqual(['-j RETURN', '-s 1.2.3.4/32 -j ACCEPT']);
    expect(t.rules.get('PREROUTING')).toEqual(['-j FOO']);
  });

  it('an empty table has no chains', () => {
    const t = parseSave('');
    expect(t.chains.size).toBe(0);
    expect(t.rules.size).toBe(0);
  });

  it('reads input without a final newline', () => {
    const t = parseSave(':A - [0:0]\n-A A -j RETURN');
    expect(t.rules.get('A')).toEqual(['-j RETURN']);
  });
});

describe('planChain on long chains', () => {
  const rules = (from: number, n: number) =>
    Array.from({ length: n }, (_, i) => `-s 10.${(from + i) >> 8}.${(from + i) & 255}.0/24 -j SNAT --to-source 1.2.3.4`);

  it('rewrites a long chain most of whose rules go (one flush, then appends)', () => {
    const plan = planChain('SHARED_SNAT', rules(0, 200), rules(1000, 200));
    expect(plan.lines[0]).toBe('-F SHARED_SNAT');
    expect(plan.lines.slice(1)).toEqual(rules(1000, 200).map((r) => `-A SHARED_SNAT ${r}`));
  });

  it('keeps element-level edits when a few rules of a long chain change', () => {
    const have = rules(0, 200);
    const want = [...have.slice(0, 100), ...have.slice(110), ...rules(5000, 3)];
    const plan = planChain('SHARED_SNAT', have, want);
    expect(plan.lines).not.toContain('-F SHARED_SNAT');
    expect(plan.lines.filter((l) => l.startsWith('-D '))).toHaveLength(10);
    expect(plan.lines.filter((l) => l.startsWith('-A '))).toHaveLength(3);
  });
});

describe('planChain deleting by spec (partial sync)', () => {
  it('a rule that occurs once goes by its spec, a duplicated one by its position', () => {
    expect(planChain('C', ['a', 'b', 'c'], ['a', 'c'], { deleteBySpec: true }).lines).toEqual(['-D C b']);
    expect(planChain('C', ['a', 'b', 'b', 'c'], ['a', 'b', 'c'], { deleteBySpec: true }).lines).toEqual(['-D C 3']);
    expect(planChain('C', ['a', 'b', 'c'], ['a', 'c']).lines).toEqual(['-D C 2']);
  });
});
