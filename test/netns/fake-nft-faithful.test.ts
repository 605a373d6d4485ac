/**
 * The fake nft (test/helpers/fakeNft.ts) against the kernel: the same natgw transactions —
 * full and partial NAT syncs, share DNAT, accounting, from a seeded random walk with changes
 * behind natgw's back and the refusals they cause — are run against a real network namespace
 * and against the fake, and after every step both must have accepted or refused alike and
 * list the same tables: chains with handles and hooks, rules as natgw recognises them (and,
 * where the fake holds a rule's JSON, that JSON as the kernel lists it), sets with their
 * elements. A plan rendered from each side's read-back must be the same text, so the fake's
 * handles are the kernel's. Then the refusals one by one, with the kernel's errno.
 */
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ExecError } from '../../src/system/exec.js';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { accountingOf, accountingTx, ACCT_TABLE } from '../../src/dataplane/eipCounters.js';
import { SystemNftClient, type NftClient } from '../../src/dataplane/netfilter/nft/client.js';
import { planPartial, type NftView } from '../../src/dataplane/netfilter/nft/partial.js';
import { natgwKernel, sameExpr } from '../../src/dataplane/netfilter/nft/readback.js';
import { CHAIN, NATGW_TABLE, NFT_FAMILIES, SET, needsFamily, planNatgw } from '../../src/dataplane/netfilter/nft/render.js';
import { NftTransaction, type NftTableFamily } from '../../src/dataplane/netfilter/nft/transaction.js';
import type { NftTableDump } from '../../src/dataplane/netfilter/nft/types.js';
import { KUBE_OVN_TABLE, deleteChainsTx, planShareDnat } from '../../src/dataplane/netfilter/shareDnatRender.js';
import type { Dnat, Fip, ShareDnat, Snat } from '../../src/model/rules.js';
import { FakeNftClient } from '../helpers/fakeNft.js';
import { tableView } from '../helpers/nftDump.js';
import { NetnsExecutor } from '../helpers/netnsExecutor.js';
import { prng } from '../helpers/prng.js';

const NS = `ngfk${randomBytes(3).toString('hex')}`;
const TABLES: ReadonlyArray<[NftTableFamily, string]> = [
  ['ip', NATGW_TABLE],
  ['ip6', NATGW_TABLE],
  ['ip', KUBE_OVN_TABLE],
  ['inet', ACCT_TABLE],
];

beforeAll(async () => {
  await execa('ip', ['netns', 'add', NS]);
});

afterAll(async () => {
  await execa('ip', ['netns', 'del', NS], { reject: false });
});

/**
 * A plan's text with the elements of each line in sorted order: stale elements are written in
 * the order the read-back lists them, which is the kernel's hash order and the fake's insertion order.
 */
const sorted = (script: string): string => script.replace(/\{ ([^{}]+) \}$/gm, (_, list: string) => `{ ${list.split(', ').sort().join(', ')} }`);

const ERRNO = /No such file or directory|File exists|Device or resource busy|Operation not supported|Invalid argument/;

/** The kernel and the fake, driven as one: every call goes to both, and their answers must agree. */
class Twins {
  readonly real: NftClient = new SystemNftClient(new NetnsExecutor(NS));
  readonly fake = new FakeNftClient();

  /** Run on both; true when both applied, false when both refused (with the same errno). */
  async run(real: NftTransaction | string, fake: NftTransaction | string = real, what = ''): Promise<boolean> {
    const outcome = async (c: NftClient, tx: NftTransaction | string): Promise<string> => {
      try {
        await c.run(tx);
        return 'applied';
      } catch (e) {
        if (!(e instanceof ExecError)) throw e;
        return `refused: ${ERRNO.exec(e.stderr)?.[0] ?? e.stderr}`;
      }
    };
    const [r, f] = [await outcome(this.real, real), await outcome(this.fake, fake)];
    expect(f, `${what}: the fake's answer to\n${typeof real === 'string' ? real : real.text()}`).toBe(r);
    return r === 'applied';
  }

  async lists(family: NftTableFamily, table: string): Promise<[NftTableDump | null, NftTableDump | null]> {
    return [await this.real.list(family, table), await this.fake.list(family, table)];
  }

  /** Both list these tables alike (by default, every table natgw writes). */
  async same(what: string, tables = TABLES): Promise<void> {
    for (const [family, table] of tables) {
      const [r, f] = await this.lists(family, table);
      expect(tableView(f), `${what}: table ${family} ${table}`).toEqual(tableView(r));
      // Where the fake holds a rule's JSON (natgw's own rules), it is what the kernel lists.
      for (const [name, chain] of f?.chains ?? []) {
        chain.rules.forEach((rule, i) => {
          const kernel = r?.chains.get(name)?.rules[i]?.expr;
          if (!(rule.expr[0] as { opaque?: string }).opaque) expect(sameExpr(rule.expr, kernel), `${what}: ${family} ${table} ${name} rule ${i}`).toBe(true);
        });
      }
    }
  }
}

// ---------------------------------------------------------------------------------
// The random walk's moves
// ---------------------------------------------------------------------------------

const dnat = (i: number, to: number): Dnat => ({
  eip: `172.20.0.${10 + (i % 5)}`,
  port: 1000 + i,
  protocol: i % 3 === 0 ? 'udp' : 'tcp',
  internalIp: `10.0.1.${to}`,
  internalPort: 80 + (i % 7),
});
const fip = (i: number, to: number): Fip => ({ eip: `172.20.1.${i}`, internalIp: `10.0.2.${to}` });
const fip6 = (i: number): Fip => ({ eip: `fd00:20::${i + 16}`, internalIp: `fd00:10::${i + 2}` });
const snat = (i: number): Snat => {
  const len = [24, 16, 32][i % 3]!;
  const cidr = len === 24 ? `10.${i % 4}.${i}.0/24` : len === 16 ? `10.${i}.0.0/16` : `10.9.${i}.1/32`;
  return { eip: `172.20.0.${10 + (i % 3)}`, cidr, randomFully: i % 2 === 0 };
};
const share = (i: number, n: number): ShareDnat => ({
  eip: `172.20.3.${i % 4}`,
  port: 2000 + i,
  protocol: i % 2 ? 'udp' : 'tcp',
  protocolText: i % 5 === 0 ? 'TCP' : i % 2 ? 'udp' : 'tcp',
  backends: Array.from({ length: n }, (_, k) => ({ ip: `10.0.1.${10 + k}`, port: 80 + k })),
});

/** One NAT change, keeping references as the engine's operations do (a partial sync diffs by reference). */
function natStep(t: NatTables, rnd: () => number): NatTables {
  const i = Math.floor(rnd() * 24);
  const to = 2 + Math.floor(rnd() * 5);
  const dkey = (d: Dnat) => `${d.eip}/${d.port}/${d.protocol}`;
  switch (Math.floor(rnd() * 9)) {
    case 0:
    case 1: {
      const d = dnat(i, to);
      return { ...t, dnats: [...t.dnats.filter((x) => dkey(x) !== dkey(d)), d] };
    }
    case 2:
      return { ...t, dnats: t.dnats.filter((x) => dkey(x) !== dkey(dnat(i, 0))) };
    case 3: {
      const f = i % 3 === 2 ? fip6(i) : fip(i, to);
      return { ...t, fips: [...t.fips.filter((x) => x.eip !== f.eip), f] };
    }
    case 4:
      return { ...t, fips: t.fips.filter((x) => x.eip !== fip(i, 0).eip && x.eip !== fip6(i).eip) };
    case 5: {
      const s = snat(i);
      if (t.snats.some((x) => x.eip === s.eip && x.cidr === s.cidr)) return t;
      const len = Number(s.cidr.split('/')[1]);
      const at = t.snats.findIndex((x) => Number(x.cidr.split('/')[1]) < len);
      const snats = [...t.snats];
      snats.splice(at === -1 ? snats.length : at, 0, s);
      return { ...t, snats };
    }
    case 6:
      return { ...t, snats: t.snats.filter((x) => !(x.cidr === snat(i).cidr && x.eip === snat(i).eip)) };
    case 7:
      return { ...t, vpcIf: t.vpcIf === 'eth0' ? 'vpc1' : 'eth0' };
    default: {
      const e = `172.20.0.${10 + (i % 8)}`;
      return { ...t, eips: t.eips.includes(e) ? t.eips.filter((x) => x !== e) : [...t.eips, e] };
    }
  }
}

describe('the fake nft against the kernel', () => {
  it('a random walk of natgw transactions, with drift and refusals, leaves both alike after every step', async () => {
    const k = new Twins();
    const rnd = prng(20240611);
    let t: NatTables = { vpcIf: 'eth0', extIf: 'net1', eips: ['172.20.0.10'], snats: [], dnats: [], fips: [] };
    let view: NftView | undefined;
    let shares: ShareDnat[] = [];
    let refusals = 0;
    const viewOf = (x: NatTables): NftView => ({ tables: x, families: new Set(NFT_FAMILIES.filter((f) => needsFamily(x, f))) });

    /** A full NAT sync: rendered from each side's read-back, which must give the same text. */
    const fullNat = async (what: string): Promise<void> => {
      const [r4, f4] = await k.lists('ip', NATGW_TABLE);
      const [r6, f6] = await k.lists('ip6', NATGW_TABLE);
      const real = planNatgw(t, natgwKernel(r4, r6));
      const fake = planNatgw(t, natgwKernel(f4, f6));
      expect(sorted(fake.tx.text()), `${what}: the plan from the fake's read-back`).toBe(sorted(real.tx.text()));
      view = (await k.run(real.tx, fake.tx, what)) ? viewOf(t) : undefined;
    };

    await fullNat('start');
    for (let s = 0; s < 200; s++) {
      const what = `step ${s}`;
      const move = Math.floor(rnd() * 12);
      if (move <= 5) {
        t = natStep(t, rnd);
        const partial = view && planPartial(view, t);
        if (partial) {
          const ok = await k.run(partial.tx, partial.tx, what);
          if (!ok) refusals++;
          view = ok ? viewOf(t) : undefined;
        } else {
          await fullNat(what);
        }
      } else if (move === 6) {
        await fullNat(what);
      } else if (move <= 8) {
        const i = Math.floor(rnd() * 12);
        const d = share(i, 1 + Math.floor(rnd() * 3));
        const same = (x: ShareDnat) => x.eip === d.eip && x.port === d.port && x.protocol === d.protocol;
        shares = rnd() < 0.3 ? shares.filter((x) => !same(x)) : [...shares.filter((x) => !same(x)), d];
        const [r, f] = await k.lists('ip', KUBE_OVN_TABLE);
        const real = planShareDnat(shares, r);
        const fake = planShareDnat(shares, f);
        expect(sorted(fake.tx.text()), `${what}: share DNAT plan from the fake's read-back`).toBe(sorted(real.tx.text()));
        if (await k.run(real.tx, fake.tx, what)) await k.run(deleteChainsTx(real.staleChains), deleteChainsTx(fake.staleChains), what);
      } else if (move === 9) {
        const [r, f] = await k.lists('inet', ACCT_TABLE);
        const have = (d: NftTableDump | null) => {
          const a = d && accountingOf(d);
          return a?.complete ? new Set(a.traffic.keys()) : undefined;
        };
        await k.run(accountingTx(have(r), t.eips), accountingTx(have(f), t.eips), what);
      } else {
        // Someone else edits natgw's tables: the kept view goes stale, and a later partial
        // sync may be refused by both.
        const [, f] = await k.lists('ip', NATGW_TABLE);
        const T = { family: 'ip', name: NATGW_TABLE } as const;
        const element = [SET.portDnat, SET.fipDnat, SET.hairpinEips].map(
          (n) => f?.sets.get(n)?.elements.at(-1) && ([n, f.sets.get(n)!.elements.at(-1)!.key] as const),
        )[Math.floor(rnd() * 3)];
        const snatRule = f?.chains.get(CHAIN.sharedSnat)?.rules[0];
        const gone = t.dnats[0];
        const drift = new NftTransaction();
        if (move === 10 && gone && view) drift.deleteElements(T, SET.portDnat, [`${gone.eip} . ${gone.protocol} . ${gone.port}`]);
        else if (move === 10 && element) drift.deleteElements(T, element[0], [element[1]]);
        else if (snatRule && rnd() < 0.5) drift.deleteRule(T, CHAIN.sharedSnat, snatRule.handle);
        else if (f) drift.addRule(T, CHAIN.postrouting, { text: 'meta l4proto tcp counter' });
        await k.run(drift.text(), drift.text(), `${what} (drift)`);
        if (move === 10 && gone && view) {
          // natgw removes the DNAT that is already gone, planning against its stale view.
          t = { ...t, dnats: t.dnats.slice(1), eips: [...t.eips, '172.20.0.99'] };
          const partial = planPartial(view, t);
          expect(partial, what).not.toBeNull();
          expect(await k.run(partial!.tx, partial!.tx, `${what} (stale view)`), what).toBe(false);
          refusals++;
          view = undefined;
          t = { ...t, eips: t.eips.filter((e) => e !== '172.20.0.99') };
        }
      }
      await k.same(what);
    }
    // The walk went where it should: objects of every kind, and refusals that left both alike.
    const [, f4] = await k.lists('ip', NATGW_TABLE);
    expect(f4?.sets.get(SET.portDnat)?.elements.length).toBeGreaterThan(3);
    expect(f4?.chains.get(CHAIN.sharedSnat)?.rules.length).toBeGreaterThan(0);
    expect(refusals).toBeGreaterThan(0);
    expect((await k.lists('ip', KUBE_OVN_TABLE))[1]?.chains.size).toBeGreaterThan(1);
  }, 180_000);

  it('refuses what the kernel refuses, with its errno, and consumes handles as it does', async () => {
    const k = new Twins();
    await k.run(
      'add table ip f\nadd chain ip f c\nadd chain ip f d\nadd set ip f s { type ipv4_addr; }\nadd map ip f m { type ipv4_addr : ipv4_addr; }\n' +
        'add map ip f v { type ipv4_addr : verdict; }\nadd chain ip f b { type nat hook postrouting priority srcnat; policy accept; }\n' +
        'add rule ip f b ip daddr @s\nadd rule ip f b oifname "x" jump c\nadd element ip f v { 1.1.1.1 : goto d }\nadd element ip f m { 1.1.1.1 : 2.2.2.2 }\n' +
        'add rule ip f c meta l4proto { tcp, udp } counter\n',
      undefined,
      'setup',
    );
    const cases = [
      'delete element ip f m { 9.9.9.9 }',
      'add element ip f m { 1.1.1.1 : 2.2.2.3 }',
      'add element ip f m { 1.1.1.1 : 2.2.2.2 }',
      'add element ip f m { 5.5.5.5 : 1.1.1.1, 5.5.5.5 : 1.1.1.2 }',
      'add element ip f zz { 1.1.1.1 }',
      'add element ip f v { 2.2.2.2 : goto zz }',
      'delete chain ip f c',
      'delete chain ip f d',
      'delete chain ip f zz',
      'flush chain ip f zz',
      'delete rule ip f b handle 999',
      'insert rule ip f b position 999 counter',
      'add rule ip f b jump zz',
      'add rule ip f zz counter',
      'add rule ip f b ip saddr @zz',
      'delete set ip f s',
      'add set ip f s { type ipv6_addr; }',
      'add chain ip f b { type nat hook prerouting priority dstnat; policy accept; }',
      'add chain ip f d { type filter hook prerouting priority 0; policy accept; }',
      'delete table ip zz',
      // Atomic: the first line would apply alone, the second is refused.
      'add element ip f s { 3.3.3.3 }\ndelete element ip f s { 4.4.4.4 }',
      'flush chain ip f c\ndelete chain ip f c',
      'delete element ip f v { 1.1.1.1 }\ndelete chain ip f d',
    ];
    for (const script of cases) {
      // A rule before each case: a handle taken by a refused transaction shows in the next listing.
      await k.run(`add rule ip f b counter\n${script}\n`, undefined, script);
      await k.run('add rule ip f b counter\n', undefined, script);
      await k.same(script, [['ip', 'f']]);
    }
    await k.run('delete table ip f\n', undefined, 'cleanup');
  }, 60_000);
});
