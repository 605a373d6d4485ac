/**
 * NftTransaction (typed operations → one nft script) and the fake nft behind NftClient, without
 * a kernel. The fake's faithfulness to the kernel is test/netns/fake-nft-faithful.test.ts; here
 * its contract: all or nothing, handles, the refusals natgw relies on, listings read-back parses.
 */
import { describe, expect, it } from 'vitest';
import { ExecError } from '../../src/system/exec.js';
import { natgwKernel, recogniseRule } from '../../src/dataplane/netfilter/nft/readback.js';
import { planNatgw, textPlan } from '../../src/dataplane/netfilter/nft/render.js';
import { NftTransaction, type NftOp } from '../../src/dataplane/netfilter/nft/transaction.js';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { FakeNftClient } from '../helpers/fakeNft.js';
import { parseNftScript } from '../helpers/fakeNftScript.js';

const T = { family: 'ip', name: 'natgw' } as const;
const WANT: NatTables = {
  vpcIf: 'eth0',
  extIf: 'net1',
  eips: ['172.20.0.10'],
  snats: [{ eip: '172.20.0.10', cidr: '10.0.1.0/24', randomFully: false }],
  dnats: [{ eip: '172.20.0.10', port: 80, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8080 }],
  fips: [{ eip: '172.20.0.11', internalIp: '10.0.1.7' }],
};

describe('NftTransaction', () => {
  it('renders each operation as the line nft reads, in order, as one script', () => {
    const tx = new NftTransaction()
      .addTable(T)
      .addMap(T, { name: 'm', type: 'ipv4_addr . inet_proto . inet_service', map: 'verdict' })
      .addSet(T, { name: 's', type: 'ipv4_addr', counter: true })
      .addChain(T, { name: 'pre', base: { type: 'nat', hook: 'prerouting', priority: 'dstnat', policy: 'accept' } })
      .addChain(T, { name: 'rx', base: { type: 'filter', hook: 'prerouting', priority: -160 } })
      .addChain(T, { name: 'dnat-0123456789ab' })
      .addElements(T, 'm', [
        { key: '1.2.3.4 . tcp . 80', value: 'goto dnat-0123456789ab' },
        { key: '1.2.3.4 . udp . 53', value: 'goto dnat-0123456789ab' },
      ])
      .addElements(T, 's', [])
      .deleteElements(T, 's', ['fd00::1'])
      .addRule(T, 'pre', { text: 'iifname "eth0" counter' })
      .insertRule(T, 'pre', { text: 'counter' }, 7)
      .insertRule(T, 'pre', { text: 'counter' })
      .deleteRule(T, 'pre', 9)
      .flushChain(T, 'pre')
      .deleteChain(T, 'dnat-0123456789ab')
      .deleteSet(T, 'map', 'm')
      .deleteTable(T);
    expect(tx.text()).toBe(
      `${[
        'add table ip natgw',
        'add map ip natgw m { type ipv4_addr . inet_proto . inet_service : verdict; }',
        'add set ip natgw s { type ipv4_addr; counter; }',
        'add chain ip natgw pre { type nat hook prerouting priority dstnat; policy accept; }',
        'add chain ip natgw rx { type filter hook prerouting priority -160; }',
        'add chain ip natgw dnat-0123456789ab',
        'add element ip natgw m { 1.2.3.4 . tcp . 80 : goto dnat-0123456789ab, 1.2.3.4 . udp . 53 : goto dnat-0123456789ab }',
        'delete element ip natgw s { fd00::1 }',
        'add rule ip natgw pre iifname "eth0" counter',
        'insert rule ip natgw pre position 7 counter',
        'insert rule ip natgw pre counter',
        'delete rule ip natgw pre handle 9',
        'flush chain ip natgw pre',
        'delete chain ip natgw dnat-0123456789ab',
        'delete map ip natgw m',
        'delete table ip natgw',
      ].join('\n')}\n`,
    );
    expect(new NftTransaction().text()).toBe('');
    expect(NftTransaction.concat(new NftTransaction().addTable(T), undefined, new NftTransaction().deleteTable(T)).text()).toBe(
      'add table ip natgw\ndelete table ip natgw\n',
    );
  });

  it('refuses, where it is added, a value nft could read as syntax', () => {
    const tx = new NftTransaction();
    expect(() => tx.addElements(T, 's', [{ key: '1.2.3.4 }; flush ruleset; {' }])).toThrow(TypeError);
    expect(() => tx.addChain(T, { name: 'a b' })).toThrow(TypeError);
    expect(() => tx.deleteRule(T, 'c', -1)).toThrow(TypeError);
    expect(() => tx.addTable({ family: 'ip', name: 'x;y' })).toThrow(TypeError);
    expect(tx.isEmpty).toBe(true);
  });

  it('reads back from its own text (the fake accepts scripts handed as text)', () => {
    const plan = planNatgw(WANT, natgwKernel(null, null));
    const strip = (ops: readonly NftOp[]) => ops.map((op) => (op.object === 'rule' && op.verb !== 'delete' ? { ...op, rule: { text: op.rule.text } } : op));
    expect(strip(parseNftScript(plan.tx.text()).ops)).toEqual(strip(plan.tx.ops));
    expect(() => parseNftScript('flush ruleset\n')).toThrow(/not natgw's nft grammar/);
  });
});

describe('FakeNftClient', () => {
  it('lists what natgw wrote as the read-back parses it: its rules recognised, a plan against it empty', async () => {
    const nft = new FakeNftClient();
    await nft.run(planNatgw(WANT, natgwKernel(null, null)).tx);
    const dump = await nft.list('ip', 'natgw');
    expect([...dump!.chains.values()].flatMap((c) => c.rules.map((r) => recogniseRule(r.expr, 'ip')?.kind))).toEqual([
      'vpc-mark',
      'fip-dnat',
      'port-dnat',
      'fip-snat',
      'snat-jump',
      'hairpin',
      // A CIDR of one EIP is a data-map element: its length's three dispatch rules, no chain of its own.
      'snat-dispatch',
      'snat-dispatch',
      'snat-dispatch',
    ]);
    // Handles as the kernel numbers them: one counter per table; the port-DNAT rule's `{ tcp, udp }` takes one too.
    // (As a real kernel (6.18, nft 1.0.6) numbered the same table.)
    expect([...dump!.sets.values()].map((s) => s.handle)).toEqual([1, 2, 3, 4, 5, 6, 7]);
    expect([...dump!.chains.values()].map((c) => [c.handle, c.rules.map((r) => r.handle)])).toEqual([
      [8, [12]],
      [9, [13, 15]],
      [10, [16, 17, 18]],
      [11, [19, 20, 21]],
    ]);
    expect(textPlan(planNatgw(WANT, natgwKernel(dump, await nft.list('ip6', 'natgw')))).script).toBe('');
    expect(await nft.list('ip', 'nothing')).toBeNull();
  });

  it('applies all or nothing; a refusal is a ExecError, and handles the kernel gave out stay used', async () => {
    const nft = new FakeNftClient();
    await nft.run('add table ip t\nadd chain ip t c\nadd set ip t s { type ipv4_addr; }\n');
    const bad = new NftTransaction()
      .addElements({ family: 'ip', name: 't' }, 's', [{ key: '1.1.1.1' }])
      .addRule({ family: 'ip', name: 't' }, 'c', { text: 'counter' })
      .deleteRule({ family: 'ip', name: 't' }, 'c', 99);
    const err = await nft.run(bad).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ExecError);
    expect((err as ExecError).stderr).toBe('Error: Could not process rule: No such file or directory\ndelete rule ip t c handle 99\n');
    const t = nft.dump('ip', 't')!;
    expect(t.sets.get('s')!.elements).toEqual([]);
    expect(t.chains.get('c')!.rules).toEqual([]);
    await nft.run('add rule ip t c counter\n');
    expect(
      nft
        .dump('ip', 't')!
        .chains.get('c')!
        .rules.map((r) => r.handle),
    ).toEqual([4]);
    // Refused by nft itself (no such set): nothing reached the kernel, nothing was numbered.
    await expect(nft.run('add rule ip t c counter\nadd element ip t zz { 1.1.1.1 }\n')).rejects.toThrow(/No such file or directory/);
    await nft.run('add rule ip t c counter\n');
    expect(
      nft
        .dump('ip', 't')!
        .chains.get('c')!
        .rules.map((r) => r.handle),
    ).toEqual([4, 5]);
    expect(nft.calls.filter((c) => c.kind === 'run' && c.refused).length).toBe(2);
  });

  it('refuses what the kernel refuses: a bound key, a missing element, a chain in use, a set in use', async () => {
    const nft = new FakeNftClient();
    await nft.run(
      'add table ip t\nadd map ip t m { type ipv4_addr : ipv4_addr; }\nadd map ip t v { type ipv4_addr : verdict; }\nadd set ip t s { type ipv4_addr; }\n' +
        'add chain ip t d\nadd chain ip t c\nadd rule ip t c ip daddr @s\nadd element ip t v { 1.1.1.1 : goto d }\nadd element ip t m { 1.1.1.1 : 2.2.2.2 }\n',
    );
    const refusal = (script: string) =>
      nft.run(script).then(
        () => 'applied',
        (e: ExecError) => /: ([^:\n]+)\n/.exec(e.stderr)?.[1],
      );
    expect(await refusal('add element ip t m { 1.1.1.1 : 2.2.2.2 }\n')).toBe('applied');
    expect(await refusal('add element ip t m { 1.1.1.1 : 3.3.3.3 }\n')).toBe('File exists');
    expect(await refusal('delete element ip t m { 9.9.9.9 }\n')).toBe('No such file or directory');
    expect(await refusal('delete chain ip t d\n')).toBe('Device or resource busy');
    expect(await refusal('delete chain ip t c\n')).toBe('Device or resource busy');
    expect(await refusal('delete set ip t s\n')).toBe('Device or resource busy');
    expect(await refusal('add element ip t v { 2.2.2.2 : goto nowhere }\n')).toBe('No such file or directory');
    // Removed in the same transaction, the reference no longer holds the chain.
    expect(await refusal('delete element ip t v { 1.1.1.1 }\ndelete chain ip t d\nflush chain ip t c\ndelete chain ip t c\ndelete set ip t s\n')).toBe(
      'applied',
    );
    expect([...nft.dump('ip', 't')!.chains.keys()]).toEqual([]);
  });
});
