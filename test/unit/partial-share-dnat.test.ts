/**
 * ShareDnatTable, full and partial (SyncOptions): a partial sync plans against the view kept from
 * the last apply and runs only the apply transactions, and renders exactly what a full sync
 * renders against the kernel's listing after that apply (AFTER_T1 and AFTER_T2 are
 * `nft -j list table ip kube-ovn` of nft 1.0.6 on Linux 6.18 after syncing T1 and T2).
 */
import { describe, expect, it } from 'vitest';
import type { ShareDnat } from '../../src/model/rules.js';
import { ShareDnatTable } from '../../src/dataplane/netfilter/shareDnat.js';
import { parseTableListing } from '../../src/dataplane/netfilter/nft/readback.js';
import { planShareDnat } from '../../src/dataplane/netfilter/shareDnatRender.js';
import type { ExecRequest, ExecResult } from '../../src/system/exec.js';
import { RecordingExecutor } from '../helpers/execCalls.js';

const A: ShareDnat = {
  eip: '172.20.0.10',
  port: 8080,
  protocol: 'tcp',
  protocolText: 'TCP',
  backends: [
    { ip: '10.0.1.6', port: 80 },
    { ip: '10.0.1.7', port: 80 },
  ],
};
const B: ShareDnat = { eip: '172.20.0.10', port: 5353, protocol: 'udp', protocolText: 'udp', backends: [{ ip: '10.0.1.6', port: 53 }] };
const C: ShareDnat = { eip: '172.20.0.11', port: 443, protocol: 'tcp', protocolText: 'tcp', backends: [{ ip: '10.0.1.8', port: 8443 }] };
const T1 = [A, B];
/** A's backends change, B goes (its chain is flushed, then deleted), C comes. */
const T2 = [{ ...A, backends: [{ ip: '10.0.1.9', port: 80 }] }, C];
/** B comes back; C's protocol spelled otherwise names another chain. */
const T3 = [T2[0]!, B, { ...C, protocolText: 'TCP' }];

const listing = (items: unknown[]): string =>
  JSON.stringify({ nftables: [{ metainfo: { version: '1.0.6', release_name: 'Lester Gooch #5', json_schema_version: 1 } }, ...items] });

const AFTER_T1 = listing([
  { table: { family: 'ip', name: 'kube-ovn', handle: 1 } },
  undefined,
  {
    map: {
      family: 'ip',
      name: 'service-ips',
      table: 'kube-ovn',
      type: ['ipv4_addr', 'inet_proto', 'inet_service'],
      handle: 1,
      map: 'verdict',
      elem: [
        [{ concat: ['172.20.0.10', 'tcp', 8080] }, { goto: { target: 'dnat-597cdf0ec2be' } }],
        [{ concat: ['172.20.0.10', 'udp', 5353] }, { goto: { target: 'dnat-a824d77eccbb' } }],
      ],
    },
  },
  undefined,
  { chain: { family: 'ip', table: 'kube-ovn', name: 'prerouting', handle: 2, type: 'nat', hook: 'prerouting', prio: -150, policy: 'accept' } },
  undefined,
  { chain: { family: 'ip', table: 'kube-ovn', name: 'dnat-597cdf0ec2be', handle: 4 } },
  undefined,
  { chain: { family: 'ip', table: 'kube-ovn', name: 'dnat-a824d77eccbb', handle: 7 } },
  undefined,
  {
    rule: {
      family: 'ip',
      table: 'kube-ovn',
      chain: 'prerouting',
      handle: 3,
      expr: [
        {
          vmap: {
            key: { concat: [{ payload: { protocol: 'ip', field: 'daddr' } }, { meta: { key: 'l4proto' } }, { payload: { protocol: 'th', field: 'dport' } }] },
            data: '@service-ips',
          },
        },
      ],
    },
  },
  undefined,
  {
    rule: {
      family: 'ip',
      table: 'kube-ovn',
      chain: 'dnat-597cdf0ec2be',
      handle: 6,
      expr: [
        { match: { op: '==', left: { meta: { key: 'l4proto' } }, right: 'tcp' } },
        {
          dnat: {
            family: 'ip',
            addr: {
              map: {
                key: { numgen: { mode: 'random', mod: 2, offset: 0 } },
                data: {
                  set: [
                    [0, { concat: ['10.0.1.6', 80] }],
                    [1, { concat: ['10.0.1.7', 80] }],
                  ],
                },
              },
            },
          },
        },
      ],
    },
  },
  undefined,
  {
    rule: {
      family: 'ip',
      table: 'kube-ovn',
      chain: 'dnat-a824d77eccbb',
      handle: 9,
      expr: [
        { match: { op: '==', left: { meta: { key: 'l4proto' } }, right: 'udp' } },
        {
          dnat: { family: 'ip', addr: { map: { key: { numgen: { mode: 'random', mod: 1, offset: 0 } }, data: { set: [[0, { concat: ['10.0.1.6', 53] }]] } } } },
        },
      ],
    },
  },
]);

const AFTER_T2 = listing([
  { table: { family: 'ip', name: 'kube-ovn', handle: 1 } },
  undefined,
  {
    map: {
      family: 'ip',
      name: 'service-ips',
      table: 'kube-ovn',
      type: ['ipv4_addr', 'inet_proto', 'inet_service'],
      handle: 1,
      map: 'verdict',
      elem: [
        [{ concat: ['172.20.0.10', 'tcp', 8080] }, { goto: { target: 'dnat-597cdf0ec2be' } }],
        [{ concat: ['172.20.0.11', 'tcp', 443] }, { goto: { target: 'dnat-e75a2a5127d7' } }],
      ],
    },
  },
  undefined,
  { chain: { family: 'ip', table: 'kube-ovn', name: 'prerouting', handle: 2, type: 'nat', hook: 'prerouting', prio: -150, policy: 'accept' } },
  undefined,
  { chain: { family: 'ip', table: 'kube-ovn', name: 'dnat-597cdf0ec2be', handle: 4 } },
  undefined,
  { chain: { family: 'ip', table: 'kube-ovn', name: 'dnat-e75a2a5127d7', handle: 12 } },
  undefined,
  {
    rule: {
      family: 'ip',
      table: 'kube-ovn',
      chain: 'prerouting',
      handle: 3,
      expr: [
        {
          vmap: {
            key: { concat: [{ payload: { protocol: 'ip', field: 'daddr' } }, { meta: { key: 'l4proto' } }, { payload: { protocol: 'th', field: 'dport' } }] },
            data: '@service-ips',
          },
        },
      ],
    },
  },
  undefined,
  {
    rule: {
      family: 'ip',
      table: 'kube-ovn',
      chain: 'dnat-597cdf0ec2be',
      handle: 11,
      expr: [
        { match: { op: '==', left: { meta: { key: 'l4proto' } }, right: 'tcp' } },
        {
          dnat: { family: 'ip', addr: { map: { key: { numgen: { mode: 'random', mod: 1, offset: 0 } }, data: { set: [[0, { concat: ['10.0.1.9', 80] }]] } } } },
        },
      ],
    },
  },
  undefined,
  {
    rule: {
      family: 'ip',
      table: 'kube-ovn',
      chain: 'dnat-e75a2a5127d7',
      handle: 14,
      expr: [
        { match: { op: '==', left: { meta: { key: 'l4proto' } }, right: 'tcp' } },
        {
          dnat: {
            family: 'ip',
            addr: { map: { key: { numgen: { mode: 'random', mod: 1, offset: 0 } }, data: { set: [[0, { concat: ['10.0.1.8', 8443] }]] } } },
          },
        },
      ],
    },
  },
]);

const LIST = 'nft -j list table ip kube-ovn';
const cmd = (c: ExecRequest): string => [c.file, ...c.args].join(' ');

/** A fake nft: lists `table()` (null: no such table), and fails the transactions `refuse` picks. */
function fakeNft(table: () => string | null, refuse: (script: string) => boolean = () => false) {
  return new RecordingExecutor((req): Partial<ExecResult> | undefined => {
    if (cmd(req) === LIST) {
      const t = table();
      return t === null ? { exitCode: 1, stderr: 'Error: No such file or directory\n' } : { stdout: t };
    }
    if (cmd(req) === 'nft -f -' && refuse(req.input ?? '')) return { exitCode: 1, stderr: 'Error: Could not process rule: Device or resource busy\n' };
    return undefined;
  });
}

/** What a full sync renders against a kernel that lists `table`. */
async function fullScript(items: readonly ShareDnat[], table: string): Promise<string> {
  return (await new ShareDnatTable(fakeNft(() => table)).sync(items, { dryRun: true })).script;
}

describe('ShareDnatTable: partial sync', () => {
  it('after a full sync, partial syncs run only their transactions and render what a full sync would', async () => {
    const x = fakeNft(() => null);
    const t = new ShareDnatTable(x);
    await t.sync(T1);
    expect(x.calls.map(cmd)).toEqual([LIST, 'nft -f -']);

    x.calls.length = 0;
    const r2 = await t.sync(T2, { mode: 'partial' });
    // The main transaction, then the stale chain's delete: nothing read.
    expect(x.calls.map(cmd)).toEqual(['nft -f -', 'nft -f -']);
    expect(x.calls[1]!.input).toBe('delete chain ip kube-ovn dnat-a824d77eccbb\n');
    expect(r2.script).toBe(await fullScript(T2, AFTER_T1));
    expect(r2.changes).toBe((await new ShareDnatTable(fakeNft(() => AFTER_T1)).sync(T2, { dryRun: true })).changes);

    x.calls.length = 0;
    const r3 = await t.sync(T3, { mode: 'partial' });
    expect(x.calls.map(cmd)).toEqual(['nft -f -', 'nft -f -']);
    expect(r3.script).toBe(await fullScript(T3, AFTER_T2));

    // Converged: nothing to run at all.
    x.calls.length = 0;
    expect(await t.sync(T3, { mode: 'partial' })).toEqual({ changes: 0, script: '' });
    expect(x.calls).toEqual([]);
  });

  it('the view after T1 plans as the kernel listing after T1 does', () => {
    const after = { items: T1, leftover: [] };
    const plan = (have: Parameters<typeof planShareDnat>[1]) => {
      const p = planShareDnat(T2, have);
      return { main: p.tx.text(), staleChains: p.staleChains, changes: p.changes };
    };
    expect(plan(after)).toEqual(plan(parseTableListing(AFTER_T1, 'ip', 'kube-ovn')));
    expect(planShareDnat(T1, after).changes).toBe(0);
  });

  it('full mode (the default) always reads', async () => {
    const x = fakeNft(() => null);
    const t = new ShareDnatTable(x);
    await t.sync(T1);
    x.calls.length = 0;
    await t.sync(T2);
    expect(x.calls.map(cmd)[0]).toBe(LIST);
  });

  it('without a view, partial reads like full', async () => {
    const x = fakeNft(() => AFTER_T1);
    const r = await new ShareDnatTable(x).sync(T2, { mode: 'partial' });
    expect(x.calls.map(cmd)[0]).toBe(LIST);
    expect(r.script).toBe(await fullScript(T2, AFTER_T1));
  });

  it('a stale chain the kernel keeps (EBUSY) stays in the view, flushed: the next partial sync deletes it again', async () => {
    let busy = true;
    const x = fakeNft(
      () => null,
      (s) => busy && s.startsWith('delete chain'),
    );
    const t = new ShareDnatTable(x);
    await t.sync(T1);
    await t.sync(T2, { mode: 'partial' });
    // Both tries (all at once, then one by one) were refused.
    expect(x.calls.filter((c) => c.input?.startsWith('delete chain')).length).toBe(2);

    busy = false;
    x.calls.length = 0;
    const r = await t.sync(T2, { mode: 'partial' });
    expect(x.calls.map(cmd)).toEqual(['nft -f -']);
    expect(r).toEqual({ changes: 1, script: 'delete chain ip kube-ovn dnat-a824d77eccbb\n' });
    // As a full sync would against the listing after T2 with that chain still there, flushed.
    const kept = JSON.parse(AFTER_T2) as { nftables: unknown[] };
    kept.nftables.push({ chain: { family: 'ip', table: 'kube-ovn', name: 'dnat-a824d77eccbb', handle: 7 } });
    expect(r.script).toBe(await fullScript(T2, JSON.stringify(kept)));
  });

  it('a refused transaction forgets the view: the next partial sync reads again', async () => {
    let refuse = false;
    const x = fakeNft(
      () => AFTER_T1,
      () => refuse,
    );
    const t = new ShareDnatTable(x);
    await t.sync(T1);
    refuse = true;
    await expect(t.sync(T2, { mode: 'partial' })).rejects.toThrow(/Device or resource busy/);
    refuse = false;
    x.calls.length = 0;
    await t.sync(T2, { mode: 'partial' });
    expect(x.calls.map(cmd)[0]).toBe(LIST);
  });

  it('a dry run plans against the view and never changes it', async () => {
    const x = fakeNft(() => null);
    const t = new ShareDnatTable(x);
    await t.sync(T1);
    x.calls.length = 0;
    const dry = await t.sync(T2, { mode: 'partial', dryRun: true });
    expect(x.calls).toEqual([]);
    const real = await t.sync(T2, { mode: 'partial' });
    expect(real.script).toBe(dry.script);

    // A dry run without a view reads, and leaves the manager without one.
    const y = fakeNft(() => AFTER_T1);
    const u = new ShareDnatTable(y);
    await u.sync(T2, { mode: 'partial', dryRun: true });
    y.calls.length = 0;
    await u.sync(T2, { mode: 'partial', dryRun: true });
    expect(y.calls.map(cmd)).toEqual([LIST]);
  });
});
