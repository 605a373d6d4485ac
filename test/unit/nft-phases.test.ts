/**
 * The phased apply of a change into absent tables (nft/phases.ts, runPhases in nft/client.ts,
 * NftBackend's apply), without a kernel: the split is pure, the runner and the backend
 * run against the in-memory fake nft. The real kernel: test/netns/nft-phased.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { ExecError } from '../../src/system/exec.js';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { NftBackend } from '../../src/dataplane/netfilter/nft/backend.js';
import { runPhases } from '../../src/dataplane/netfilter/nft/client.js';
import { dropCreated, phases, type NftPhases } from '../../src/dataplane/netfilter/nft/phases.js';
import { natgwKernel } from '../../src/dataplane/netfilter/nft/readback.js';
import { planNatgw } from '../../src/dataplane/netfilter/nft/render.js';
import { NftTransaction, opText, type NftOp } from '../../src/dataplane/netfilter/nft/transaction.js';
import { accountingTx } from '../../src/dataplane/eipCounters.js';
import { FakeNftClient } from '../helpers/fakeNft.js';
import { RecordingExecutor } from '../helpers/execCalls.js';

/** `n` port DNATs, `n` FIPs, `n / 10` SNATs over n / 50 EIPs: the bulk bench's mix. */
function bulk(n: number): NatTables {
  const eips = Array.from({ length: Math.max(1, n / 50) }, (_, i) => `172.20.${1 + (i >> 8)}.${i & 255}`);
  const eip = (i: number) => eips[i % eips.length] as string;
  return {
    vpcIf: 'eth0',
    extIf: 'net1',
    eips,
    snats: Array.from({ length: Math.max(1, n / 10) }, (_, i) => ({
      eip: eip(i),
      cidr: `10.100.${i >> 8}.${((i & 255) >> 2) << 2}/30`,
      randomFully: false,
    })).filter((s, i, all) => all.findIndex((x) => x.cidr === s.cidr) === i),
    dnats: Array.from({ length: n }, (_, i) => ({
      eip: eip(i),
      port: 1024 + Math.floor(i / eips.length),
      protocol: i % 2 ? ('udp' as const) : ('tcp' as const),
      internalIp: `10.1.${(i >> 8) & 255}.${i & 255 || 1}`,
      internalPort: 80,
    })),
    fips: Array.from({ length: n }, (_, i) => ({ eip: `172.21.${i >> 8}.${i & 255}`, internalIp: `10.2.${i >> 8}.${i & 255}` })),
  };
}

const EMPTY = natgwKernel(null, null);
const ACCT = accountingTx(undefined, ['172.20.1.0', '172.20.1.1']);
const fromAbsent = (want: NatTables, append = true) => NftTransaction.concat(planNatgw(want, EMPTY).tx, append ? ACCT : undefined);
const OPTS = { minElements: 1000, groups: 2 };

/** Each element list as `table set key` lines: pieces of one list joined back. */
function elementKeys(ops: readonly NftOp[]): string[] {
  return ops.flatMap((op) => (op.object === 'element' ? op.elements.map((e) => `${op.table.family} ${op.table.name} ${op.set} ${e.key}`) : [])).sort();
}

describe('phases(): the split of a change into absent tables', () => {
  const tx = fromAbsent(bulk(2000));
  const p = phases(tx, OPTS) as NftPhases;

  it('splits a large change: the first phase creates, the groups load elements, the last hooks', () => {
    expect(p).not.toBeNull();
    expect(p.groups).toHaveLength(2);
    expect(p.created).toEqual([{ family: 'ip', name: 'natgw' }]);
    expect(p.first.ops[0]).toEqual({ verb: 'create', object: 'table', table: { family: 'ip', name: 'natgw' } });
    expect(p.first.text().startsWith('create table ip natgw\n')).toBe(true);
    expect(p.elements).toBe(elementKeys(planNatgw(bulk(2000), EMPTY).tx.ops).length);
  });

  it('puts every operation in exactly one phase (element lists possibly cut in pieces)', () => {
    const nonElements = (ops: readonly NftOp[]) => ops.filter((op) => op.object !== 'element').map((op) => opText(op).replace(/^create table/, 'add table'));
    const all = [p.first, ...p.groups, p.last].flatMap((t) => t.ops);
    expect(nonElements(all).sort()).toEqual(nonElements(tx.ops).sort());
    expect(elementKeys(all)).toEqual(elementKeys(tx.ops));
  });

  it('keeps the order of each chain, and of everything on a table it does not create', () => {
    const order = (ops: readonly NftOp[], pick: (op: NftOp) => boolean) => ops.filter(pick).map(opText);
    for (const chain of ['prerouting', 'postrouting', 'shared_snat', 'vpc_mark']) {
      const inChain = (op: NftOp) => op.object === 'rule' && op.chain === chain;
      const got = [p.first, p.last].flatMap((t) => order(t.ops, inChain));
      expect(got, chain).toEqual(order(tx.ops, inChain));
      expect(got.length, chain).toBeGreaterThan(0);
    }
    const acct = (op: NftOp) => op.table.name === 'natgw_acct';
    expect(order(p.last.ops, acct)).toEqual(order(tx.ops, acct));
    expect([p.first, ...p.groups].flatMap((t) => t.ops).filter(acct)).toEqual([]);
  });

  it('hooks nothing before the last phase, and the last phase is only hooks and foreign tables', () => {
    for (const t of [p.first, ...p.groups]) expect(t.ops.filter((op) => op.object === 'chain' && op.verb === 'add' && op.chain.base)).toEqual([]);
    const hooked = new Set(p.last.ops.flatMap((op) => (op.object === 'chain' && op.verb === 'add' && op.chain.base ? [op.chain.name] : [])));
    expect([...hooked].sort()).toEqual(['postrouting', 'prerouting', 'rx', 'tx', 'vpc_mark']);
    for (const op of p.last.ops) if (op.table.name === 'natgw' && op.object === 'rule') expect(hooked.has(op.chain), opText(op)).toBe(true);
    expect(p.last.ops.filter((op) => op.table.name === 'natgw' && op.object === 'element')).toEqual([]);
  });

  it('balances the groups by the size of their text', () => {
    const sizes = p.groups.map((g) => g.text().length);
    expect(Math.max(...sizes) / Math.min(...sizes)).toBeLessThan(1.5);
  });

  it('cuts one dominant element list into pieces, each group keeping its order', () => {
    const onlyDnat = fromAbsent({ ...bulk(2000), fips: [] }, false);
    const q = phases(onlyDnat, OPTS) as NftPhases;
    expect(q.groups).toHaveLength(2);
    expect(q.groups.every((g) => g.ops.some((op) => op.object === 'element' && op.set === 'port_dnat'))).toBe(true);
    expect(elementKeys(q.groups.flatMap((g) => g.ops))).toEqual(elementKeys(onlyDnat.ops));
  });

  it('leaves small changes, changes to existing tables and rebuilds as one transaction', () => {
    expect(phases(fromAbsent(bulk(100)), OPTS)).toBeNull();
    expect(phases(tx, { minElements: 1000, groups: 1 })).toBeNull();
    // A full sync's rebuild deletes the table in the same transaction: not created here.
    const rebuild = NftTransaction.concat(new NftTransaction().deleteTable({ family: 'ip', name: 'natgw' }), planNatgw(bulk(2000), EMPTY).tx);
    expect(phases(rebuild, OPTS)).toBeNull();
    const withDelete = NftTransaction.concat(
      planNatgw(bulk(2000), EMPTY).tx,
      new NftTransaction().deleteRule({ family: 'ip', name: 'natgw' }, 'prerouting', 3),
    );
    expect(phases(withDelete, OPTS)).toBeNull();
    // Only the accounting table's elements: a table that may exist is never split.
    expect(
      phases(
        accountingTx(
          undefined,
          Array.from({ length: 2000 }, (_, i) => `172.22.${i >> 8}.${i & 255}`),
        ),
        OPTS,
      ),
    ).toBeNull();
  });

  it('drops exactly the tables it created', () => {
    expect(dropCreated(p).text()).toBe('delete table ip natgw\n');
  });
});

/** A table's dump without handles, chains by name: what does not depend on the order of creation. */
function shape(fake: FakeNftClient, family: 'ip' | 'inet', name: string): unknown {
  const d = fake.dump(family, name);
  if (!d) return null;
  const strip = (v: unknown): unknown =>
    Array.isArray(v)
      ? v.map(strip)
      : v && typeof v === 'object'
        ? Object.fromEntries(
            Object.entries(v)
              .filter(([k]) => k !== 'handle')
              .map(([k, x]) => [k, strip(x)]),
          )
        : v;
  const chains = [...d.chains.values()].sort((a, b) => a.name.localeCompare(b.name));
  const sets = [...d.sets.values()]
    .sort((a, b) => a.name.localeCompare(b.name))
    .map((s) => ({ ...s, elements: [...s.elements].sort((a, b) => a.key.localeCompare(b.key)) }));
  return strip({ chains, sets });
}

describe('runPhases and the backend against the fake nft', () => {
  const want = bulk(2000);

  it('applies what one transaction applies, in 4 runs: first, 2 groups, last', async () => {
    const one = new FakeNftClient();
    await one.run(fromAbsent(want));
    const phased = new FakeNftClient();
    const p = phases(fromAbsent(want), OPTS) as NftPhases;
    await runPhases(phased, p);
    expect(phased.calls.map((c) => c.kind)).toEqual(['run', 'run', 'run', 'run']);
    expect(shape(phased, 'ip', 'natgw')).toEqual(shape(one, 'ip', 'natgw'));
    expect(shape(phased, 'inet', 'natgw_acct')).toEqual(shape(one, 'inet', 'natgw_acct'));
  });

  it('a refused group: the tables it created are deleted, the refusal thrown, foreign tables untouched', async () => {
    const fake = new FakeNftClient();
    await fake.run(accountingTx(undefined, ['172.20.1.0']));
    const before = shape(fake, 'inet', 'natgw_acct');
    fake.fault = (script) => (script.includes('add element ip natgw fip_snat') ? 'EINVAL' : undefined);
    const undo: unknown[] = [];
    await expect(runPhases(fake, phases(fromAbsent(want), OPTS) as NftPhases, (e) => undo.push(e))).rejects.toBeInstanceOf(ExecError);
    expect(fake.dump('ip', 'natgw')).toBeNull();
    expect(shape(fake, 'inet', 'natgw_acct')).toEqual(before);
    expect(undo).toEqual([]);
    expect(fake.calls.at(-1)).toMatchObject({ kind: 'run', script: 'delete table ip natgw\n' });
  });

  it('a refused last phase: the same', async () => {
    const fake = new FakeNftClient();
    fake.fault = (script) => (script.includes('hook prerouting') ? 'EOPNOTSUPP' : undefined);
    await expect(runPhases(fake, phases(fromAbsent(want), OPTS) as NftPhases)).rejects.toBeInstanceOf(ExecError);
    expect(fake.dump('ip', 'natgw')).toBeNull();
    expect(fake.dump('inet', 'natgw_acct')).toBeNull();
  });

  it('a table someone created meanwhile: create table is refused and that table is left as it was', async () => {
    const fake = new FakeNftClient();
    const b = new NftBackend(new RecordingExecutor(), undefined, fake, OPTS);
    await b.observe();
    await fake.run('add table ip natgw\nadd chain ip natgw theirs\n');
    const theirs = shape(fake, 'ip', 'natgw');
    await expect(b.sync(want, { mode: 'partial' })).rejects.toThrow(/File exists|EEXIST/);
    expect(shape(fake, 'ip', 'natgw')).toEqual(theirs);
    expect(fake.calls.at(-1)).toMatchObject({ kind: 'run' });
    expect((fake.calls.at(-1) as { script: string }).script).toMatch(/^create table ip natgw\n/);
  });

  it('an accounting table known absent is created with the rest: once, its elements in the groups, its hooks last', async () => {
    const created = NftTransaction.concat(planNatgw(want, EMPTY).tx, accountingTx(undefined, ['172.20.1.0', '172.20.1.1'], { absent: true }));
    expect(created.text()).not.toMatch(/^delete table inet natgw_acct$/m);
    const p = phases(created, OPTS) as NftPhases;
    expect(p.created.map((t) => `${t.family} ${t.name}`).sort()).toEqual(['inet natgw_acct', 'ip natgw']);
    expect(p.first.text().match(/^create table inet natgw_acct$/gm)).toHaveLength(1);
    expect(p.first.text()).not.toMatch(/^add table inet natgw_acct$/m);
    expect(p.groups.map((g) => g.text()).join('')).toMatch(/^add element inet natgw_acct eip_rx4 /m);
    expect(p.last.text()).toMatch(/^add chain inet natgw_acct rx \{ type filter hook prerouting/m);
    const one = new FakeNftClient();
    await one.run(created);
    const phased = new FakeNftClient();
    await runPhases(phased, p);
    expect(shape(phased, 'inet', 'natgw_acct')).toEqual(shape(one, 'inet', 'natgw_acct'));
    expect(shape(phased, 'ip', 'natgw')).toEqual(shape(one, 'ip', 'natgw'));
    // Someone made the accounting table since it was read: the first phase is refused, nothing changes.
    const theirs = new FakeNftClient();
    await theirs.run('add table inet natgw_acct\nadd chain inet natgw_acct mine\n');
    const before = shape(theirs, 'inet', 'natgw_acct');
    await expect(runPhases(theirs, p)).rejects.toThrow(/File exists|EEXIST/);
    expect(shape(theirs, 'inet', 'natgw_acct')).toEqual(before);
    expect(theirs.dump('ip', 'natgw')).toBeNull();
  });

  it('the backend: a bulk change into absent tables goes phased, its report the whole script', async () => {
    const fake = new FakeNftClient();
    const b = new NftBackend(new RecordingExecutor(), undefined, fake, OPTS);
    await b.observe();
    const dry = await b.sync(want, { mode: 'partial', dryRun: true });
    const calls = fake.calls.length;
    const r = await b.sync(want, { mode: 'partial' });
    expect(r.script).toBe(dry.script);
    expect(r.script).toBe(planNatgw(want, EMPTY).tx.text());
    expect(fake.calls.slice(calls).map((c) => c.kind === 'run' && c.script.split('\n')[0])).toEqual([
      'create table ip natgw',
      expect.stringMatching(/^add element ip natgw /),
      expect.stringMatching(/^add element ip natgw /),
      expect.stringMatching(/^add chain ip natgw \S+ \{ type /),
    ]);
    const one = new FakeNftClient();
    await one.run(planNatgw(want, EMPTY).tx);
    expect(shape(fake, 'ip', 'natgw')).toEqual(shape(one, 'ip', 'natgw'));
  });

  it('the backend: a small change into absent tables stays one transaction', async () => {
    const fake = new FakeNftClient();
    const b = new NftBackend(new RecordingExecutor(), undefined, fake, OPTS);
    await b.observe();
    const calls = fake.calls.length;
    await b.sync(bulk(100), { mode: 'partial' });
    expect(fake.calls.slice(calls).map((c) => c.kind === 'run' && c.script.split('\n')[0])).toEqual(['add table ip natgw']);
  });
});
