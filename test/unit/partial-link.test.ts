/**
 * LinkManager, full and partial (SyncOptions): a partial sync plans against the view kept from
 * the last apply, runs only `ip -batch -`, and renders exactly what a full sync renders against
 * the kernel's listing after that apply. The AFTER_* listings are `ip -j -batch -` (addresses
 * trimmed to the fields natgw reads) from iproute2 6.1 on Linux 6.18 after applying each step,
 * with promote_secondaries on: IPv4 primaries before secondaries, a promoted secondary moved
 * behind the last primary, IPv6 newest first. The view keeps only each subnet's own order.
 */
import { describe, expect, it } from 'vitest';
import { LinkManager, linkOps, linkViewAfter, planLink, type LinkAddress, type LinkOp, type LinkView } from '../../src/dataplane/link.js';
import { emptyState, type DesiredState } from '../../src/state/state.js';
import type { ExecRequest, ExecResult } from '../../src/system/exec.js';
import { RecordingExecutor } from '../helpers/execCalls.js';

interface Listing {
  readonly v4: string;
  readonly v6: string;
}

const V6_NONE = '[{"dst":"fe80::/64","protocol":"kernel","metric":256,"flags":[],"pref":"medium"}]\n[]\n';
const LL = '{"family":"inet6","local":"fe80::1029:ccff:fe70:1e3d","prefixlen":64,"scope":"link"}';
const CONNECTED = '{"dst":"10.0.1.0/24","protocol":"kernel","scope":"link","prefsrc":"10.0.1.1","flags":[]}';

const INITIAL: Listing = {
  v4: `[{"ifname":"net1","addr_info":[${LL}]}]\n[${CONNECTED}]\n[]\n`,
  v6: V6_NONE,
};
const AFTER_S1: Listing = {
  v4:
    '[{"ifname":"net1","addr_info":[{"family":"inet","local":"172.20.0.10","prefixlen":24,"scope":"global"},' +
    `{"family":"inet","local":"172.20.0.11","prefixlen":24,"scope":"global","secondary":true},${LL}]}]\n` +
    `[${CONNECTED},{"dst":"10.1.0.0/16","gateway":"10.0.1.254","flags":[]}]\n` +
    '[{"dst":"default","gateway":"172.20.0.1","flags":["onlink"]}]\n',
  v6: V6_NONE,
};
const AFTER_S2: Listing = {
  v4:
    '[{"ifname":"net1","addr_info":[{"family":"inet","local":"10.9.0.5","prefixlen":16,"scope":"global"},' +
    '{"family":"inet","local":"172.20.0.11","prefixlen":24,"scope":"global"},' +
    '{"family":"inet","local":"172.20.0.12","prefixlen":24,"scope":"global","secondary":true},' +
    `{"family":"inet6","local":"2001:db8::10","prefixlen":64,"scope":"global"},${LL}]}]\n` +
    `[${CONNECTED},{"dst":"10.1.0.0/16","gateway":"10.0.1.253","flags":[]},{"dst":"10.2.3.4","gateway":"10.0.1.254","flags":[]}]\n` +
    '[{"dst":"default","gateway":"172.20.0.254","flags":["onlink"]}]\n',
  v6: V6_NONE,
};
const AFTER_S3: Listing = {
  v4:
    '[{"ifname":"net1","addr_info":[{"family":"inet","local":"10.9.0.5","prefixlen":16,"scope":"global"},' +
    '{"family":"inet","local":"172.20.0.12","prefixlen":24,"scope":"global"},' +
    '{"family":"inet","local":"172.20.0.13","prefixlen":24,"scope":"global","secondary":true},' +
    `{"family":"inet6","local":"2001:db8::11","prefixlen":64,"scope":"global"},${LL}]}]\n` +
    `[${CONNECTED},{"dst":"10.1.0.0/16","gateway":"10.0.1.253","flags":[]}]\n` +
    '[{"dst":"default","gateway":"172.20.0.254","flags":["onlink"]}]\n',
  v6:
    '[{"dst":"fe80::/64","protocol":"kernel","metric":256,"flags":[],"pref":"medium"}]\n' +
    '[{"dst":"default","gateway":"2001:db8::1","metric":1024,"flags":["onlink"],"pref":"medium"}]\n',
};

const eip = (a: string) => ({ address: a.split('/')[0]!, prefixLength: Number(a.split('/')[1]) });
function state(p: { eips: string[]; routes: [string, string][]; v4?: string; v6?: string }): DesiredState {
  return {
    ...emptyState('eth0', 'net1'),
    initialized: true,
    eips: p.eips.map(eip),
    routes: p.routes.map(([cidr, nexthop]) => ({ cidr, nexthop })),
    defaultRoutes: { ...(p.v4 ? { v4: p.v4 } : {}), ...(p.v6 ? { v6: p.v6 } : {}) },
  };
}
const S1 = state({ eips: ['172.20.0.10/24', '172.20.0.11/24'], routes: [['10.1.0.0/16', '10.0.1.254']], v4: '172.20.0.1' });
/** A new secondary, a new primary in another subnet, IPv6, the first primary deleted (its secondary is promoted), routes and the default changed. */
const S2 = state({
  eips: ['172.20.0.11/24', '172.20.0.12/24', '10.9.0.5/16', '2001:db8::10/64'],
  routes: [
    ['10.1.0.0/16', '10.0.1.253'],
    ['10.2.3.4/32', '10.0.1.254'],
  ],
  v4: '172.20.0.254',
});
/** The promoted primary deleted in turn, IPv6 swapped, a host route deleted, an IPv6 default added. */
const S3 = state({
  eips: ['172.20.0.12/24', '10.9.0.5/16', '172.20.0.13/24', '2001:db8::11/64'],
  routes: [['10.1.0.0/16', '10.0.1.253']],
  v4: '172.20.0.254',
  v6: '2001:db8::1',
});

const cmd = (c: ExecRequest): string => [c.file, ...c.args].join(' ');
const READ4 = 'ip -j -batch -';
const READ6 = 'ip -6 -j -batch -';
const APPLY = 'ip -batch -';

function fakeIp(listing: () => Listing, refuse: () => boolean = () => false) {
  return new RecordingExecutor((req): Partial<ExecResult> | undefined => {
    if (cmd(req) === READ4) return { stdout: listing().v4 };
    if (cmd(req) === READ6) return { stdout: listing().v6 };
    if (cmd(req) === APPLY && refuse()) return { exitCode: 2, stderr: 'RTNETLINK answers: File exists\nCommand failed -:1\n' };
    return undefined;
  });
}

/** promote_secondaries lives in the gateway's /proc, not this test process's: say it is on. */
class PromotingLinks extends LinkManager {
  override async promoteSecondaries(): Promise<boolean> {
    return true;
  }
}

/** Whether a partial sync of `s` would plan without reading (asked with a dry run, which changes nothing). */
async function trusts(m: LinkManager, x: RecordingExecutor, s: DesiredState): Promise<boolean> {
  x.calls.length = 0;
  await m.sync(s, s, { mode: 'partial', dryRun: true });
  return !x.calls.map(cmd).includes(READ4);
}

/** What a full sync renders against a kernel that lists `listing`. */
async function fullScript(want: DesiredState, previous: DesiredState, listing: Listing): Promise<string> {
  return (await new PromotingLinks(fakeIp(() => listing)).sync(want, previous, { dryRun: true })).script;
}

describe('LinkManager: partial sync', () => {
  it('after a full sync, partial syncs run only ip -batch and render what a full sync would', async () => {
    const x = fakeIp(() => INITIAL);
    const m = new PromotingLinks(x);
    await m.sync(S1, undefined);
    expect(x.calls.map(cmd).sort()).toEqual([APPLY, READ4, READ6].sort());

    x.calls.length = 0;
    const r2 = await m.sync(S2, S1, { mode: 'partial' });
    expect(x.calls.map(cmd)).toEqual([APPLY]);
    expect(r2.script).toBe(await fullScript(S2, S1, AFTER_S1));
    expect(r2.script).toBe(
      [
        'addr replace 172.20.0.12/24 dev net1',
        'addr replace 10.9.0.5/16 dev net1',
        'addr replace 2001:db8::10/64 dev net1 nodad',
        'addr del 172.20.0.10/24 dev net1',
        'route replace 10.1.0.0/16 via 10.0.1.253 dev eth0',
        'route replace 10.2.3.4/32 via 10.0.1.254 dev eth0',
        'route replace default via 172.20.0.254 dev net1 onlink',
        '',
      ].join('\n'),
    );

    x.calls.length = 0;
    const r3 = await m.sync(S3, S2, { mode: 'partial' });
    expect(x.calls.map(cmd)).toEqual([APPLY]);
    expect(r3.script).toBe(await fullScript(S3, S2, AFTER_S2));
    // The delete order follows the kernel's order, which the view tracked through the promotion.
    expect(r3.script).toContain('addr del 2001:db8::10/64 dev net1\naddr del 172.20.0.11/24 dev net1\n');

    x.calls.length = 0;
    expect(await m.sync(S3, S3, { mode: 'partial' })).toEqual({ changes: 0, script: '' });
    expect(x.calls).toEqual([]);
    expect((await new PromotingLinks(fakeIp(() => AFTER_S3)).sync(S3, S3, { dryRun: true })).changes).toBe(0);
  });

  it("the view after each step holds the listing's addresses, each IPv4 subnet in the listing's order", async () => {
    const view = (l: Listing) => new LinkManager(fakeIp(() => l)).view(S1);
    const v1 = linkViewAfter(await view(INITIAL), linkOps(await view(INITIAL), S1, undefined));
    const v2 = linkViewAfter(v1, linkOps(v1, S2, S1));
    const v3 = linkViewAfter(v2, linkOps(v2, S3, S2));
    const addrs = (v: LinkView) => v.extAddresses.map((a) => `${a.address}/${a.prefixLength}`);
    // What the deletes' order rests on: a subnet's primary first, then its secondaries as they came.
    const subnet = (v: LinkView, prefix: string) => addrs(v).filter((a) => a.startsWith(prefix));
    for (const [mine, listing] of [
      [v1, AFTER_S1],
      [v2, AFTER_S2],
      [v3, AFTER_S3],
    ] as const) {
      const kernel = await view(listing);
      expect([...addrs(mine)].sort()).toEqual([...addrs(kernel)].sort());
      expect(subnet(mine, '172.20.0.')).toEqual(subnet(kernel, '172.20.0.'));
    }
  });

  it('full mode (the default) reads every time; partial without a view reads', async () => {
    const x = fakeIp(() => AFTER_S1);
    const m = new PromotingLinks(x);
    await m.sync(S1, S1, { mode: 'partial' });
    expect(x.calls.map(cmd).sort()).toEqual([READ4, READ6].sort());
    x.calls.length = 0;
    await m.sync(S1, S1);
    expect(x.calls.map(cmd).sort()).toEqual([READ4, READ6].sort());
  });

  it('a refused batch forgets the view: the next partial sync reads again', async () => {
    let refuse = false;
    const x = fakeIp(
      () => INITIAL,
      () => refuse,
    );
    const m = new PromotingLinks(x);
    await m.sync(S1, undefined);
    refuse = true;
    await expect(m.sync(S2, S1, { mode: 'partial' })).rejects.toThrow(/ip -batch - refused the address and route change/);
    expect(await trusts(m, x, S2)).toBe(false);
    refuse = false;
    x.calls.length = 0;
    await m.sync(S2, S1, { mode: 'partial' });
    expect(x.calls.map(cmd)).toContain(READ4);
  });

  it('forget(), other interface names, and promote_secondaries not confirmed all mean a read', async () => {
    const x = fakeIp(() => INITIAL);
    const m = new PromotingLinks(x);
    await m.sync(S1, undefined);
    m.forget();
    x.calls.length = 0;
    await m.sync(S1, S1, { mode: 'partial' });
    expect(x.calls.map(cmd)).toContain(READ4);

    await m.sync(S1, S1);
    expect(await trusts(m, x, S1)).toBe(true);
    expect(await trusts(m, x, { ...S1, interfaces: { vpc: 'eth0', ext: 'net2' } })).toBe(false);

    // Without promote_secondaries the kernel may have taken 172.20.0.11 along with the primary it deleted.
    class NotPromoting extends LinkManager {
      override async promoteSecondaries(): Promise<boolean> {
        return false;
      }
    }
    const y = fakeIp(() => AFTER_S1);
    const n = new NotPromoting(y);
    await n.sync(S2, S1);
    expect(await trusts(n, y, S2)).toBe(false);
    // Deleting a whole subnet is safe either way.
    const zx = fakeIp(() => AFTER_S1);
    const z = new NotPromoting(zx);
    await z.sync(state({ eips: [], routes: [['10.1.0.0/16', '10.0.1.254']], v4: '172.20.0.1' }), S1);
    expect(await trusts(z, zx, S1)).toBe(true);
  });

  it('a dry run plans against the view and never changes it', async () => {
    const x = fakeIp(() => INITIAL);
    const m = new PromotingLinks(x);
    await m.sync(S1, undefined);
    x.calls.length = 0;
    const dry = await m.sync(S2, S1, { mode: 'partial', dryRun: true });
    expect(x.calls).toEqual([]);
    expect((await m.sync(S2, S1, { mode: 'partial' })).script).toBe(dry.script);

    const y = fakeIp(() => AFTER_S1);
    const n = new PromotingLinks(y);
    await n.sync(S2, S1, { dryRun: true });
    expect(await trusts(n, y, S2)).toBe(false);
  });
});

describe('planLink and the view: details', () => {
  it("a subnet's addresses keep their order in the view through a primary's delete: its secondaries are deleted first", () => {
    const a = (address: string, prefixLength = 24): LinkAddress => ({ address, prefixLength, family: address.includes(':') ? 6 : 4, scope: 'global' });
    const add = (x: LinkAddress): LinkOp => ({ kind: 'addr-replace', address: x.address, prefixLength: x.prefixLength });
    const start = linkViewAfter(
      { extAddresses: [], vpcRoutes: [], extDefaults: [] },
      [a('10.0.0.1'), a('10.1.0.1'), a('10.1.0.2'), a('10.0.0.2'), a('10.0.0.3'), a('2001:db8::10', 64)].map(add),
    );
    const after = linkViewAfter(start, [{ kind: 'addr-del', address: '10.0.0.1', prefixLength: 24 }]);
    expect(after.extAddresses.map((x) => x.address).filter((x) => x.startsWith('10.0.0.'))).toEqual(['10.0.0.2', '10.0.0.3']);
    // 10.0.0.2 is the subnet's primary now: 10.0.0.3 goes before it.
    const previous = state({ eips: ['10.0.0.2/24', '10.0.0.3/24'], routes: [] });
    expect(planLink(after, state({ eips: [], routes: [] }), previous)).toEqual(['addr del 10.0.0.3/24 dev net1', 'addr del 10.0.0.2/24 dev net1']);
  });

  it('a deleted route is gone from the view: adding it back is planned', () => {
    const s = state({ eips: [], routes: [['10.2.3.4/32', '10.0.1.254']] });
    const have: LinkView = { extAddresses: [], vpcRoutes: [{ dst: '10.2.3.4', gateway: '10.0.1.254' }], extDefaults: [] };
    const gone = linkViewAfter(have, linkOps(have, state({ eips: [], routes: [] }), s));
    expect(planLink(gone, s, undefined)).toEqual(['route replace 10.2.3.4/32 via 10.0.1.254 dev eth0']);
  });

  it("a default route on VPC is listed as `default`: the state's 0.0.0.0/0 is present, and stays quiet", () => {
    const have: LinkView = {
      extAddresses: [],
      vpcRoutes: [
        { dst: 'default', gateway: '10.0.1.254' },
        { dst: 'default', gateway: 'fd00::1' },
      ],
      extDefaults: [],
    };
    const want = state({
      eips: [],
      routes: [
        ['0.0.0.0/0', '10.0.1.254'],
        ['::/0', 'fd00::1'],
      ],
    });
    expect(planLink(have, want, want)).toEqual([]);
    expect(planLink(have, state({ eips: [], routes: [] }), want)).toEqual(['route del 0.0.0.0/0 dev eth0', 'route del ::/0 dev eth0']);
  });

  it("a default route is one per family whatever its device: VPC's and EXT's replace each other", () => {
    const have: LinkView = { extAddresses: [], vpcRoutes: [], extDefaults: [{ dst: 'default', gateway: '172.20.0.1' }] };
    const vpcDefault = linkViewAfter(have, [{ kind: 'route-replace', cidr: '0.0.0.0/0', nexthop: '10.0.1.254' }]);
    expect(vpcDefault.extDefaults).toEqual([]);
    const back = linkViewAfter(vpcDefault, [{ kind: 'default', gateway: '172.20.0.1' }]);
    expect(back.vpcRoutes).toEqual([]);
    expect(back.extDefaults).toEqual([{ dst: 'default', gateway: '172.20.0.1' }]);
  });

  it('an IPv6 EIP with a new prefix: the old prefix goes first (IPv6 keys an address without it)', () => {
    const have: LinkView = { extAddresses: [{ address: '2001:db8::10', prefixLength: 80, family: 6, scope: 'global' }], vpcRoutes: [], extDefaults: [] };
    const want = state({ eips: ['2001:db8::10/64'], routes: [] });
    expect(planLink(have, want, state({ eips: ['2001:db8::10/80'], routes: [] }))).toEqual([
      'addr del 2001:db8::10/80 dev net1',
      'addr replace 2001:db8::10/64 dev net1 nodad',
    ]);
  });

  it('deletes thousands of addresses in reverse kernel order', () => {
    const n = 20_000;
    const addrs = Array.from({ length: n }, (_, i) => ({
      address: `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`,
      prefixLength: 8,
      family: 4 as const,
      scope: 'global',
    }));
    const previous = { ...state({ eips: [], routes: [] }), eips: addrs.map((a) => ({ address: a.address, prefixLength: 8 })) };
    // Its cost at this size is a figure of the benchmarks (bulk replace), not an assertion here.
    const lines = planLink({ extAddresses: addrs, vpcRoutes: [], extDefaults: [] }, state({ eips: [], routes: [] }), previous);
    expect(lines).toHaveLength(n);
    expect(lines[0]).toBe(`addr del ${addrs[n - 1]!.address}/8 dev net1`);
    expect(lines.at(-1)).toBe(`addr del ${addrs[0]!.address}/8 dev net1`);
  });
});
