/**
 * LinkManager.sync: every sync reads the kernel (`ip -j -batch -`, one per family) and renders
 * the `ip -batch` lines that take what it lists to the desired state. The AFTER_* listings are
 * `ip -j -batch -` (addresses trimmed to the fields natgw reads) from iproute2 6.1 on Linux 6.18
 * after applying each step, with promote_secondaries on: IPv4 primaries before secondaries, a
 * promoted secondary moved behind the last primary, IPv6 newest first.
 */
import { describe, expect, it } from 'vitest';
import { LinkManager } from '../../src/dataplane/link.js';
import { planLink, type LinkView } from '../../src/dataplane/linkPlan.js';
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
  override async promoteSecondaries(): Promise<void> {}
}

/** What a full sync renders against a kernel that lists `listing`. */
async function fullScript(want: DesiredState, previous: DesiredState, listing: Listing): Promise<string> {
  return (await new PromotingLinks(fakeIp(() => listing)).sync(want, previous, { dryRun: true })).script;
}

describe('LinkManager: sync', () => {
  it('reads the kernel at every sync, partial too, and applies with one ip -batch', async () => {
    const x = fakeIp(() => INITIAL);
    const m = new PromotingLinks(x);
    await m.sync(S1, undefined);
    expect(x.calls.map(cmd).sort()).toEqual([APPLY, READ4, READ6].sort());
    x.calls.length = 0;
    await m.sync(S1, undefined, { mode: 'partial' });
    expect(x.calls.map(cmd).sort()).toEqual([APPLY, READ4, READ6].sort());
  });

  it('renders each step against what the kernel listed after the one before', async () => {
    expect(await fullScript(S2, S1, AFTER_S1)).toBe(
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
    // The delete order follows the kernel's order after the promotion.
    expect(await fullScript(S3, S2, AFTER_S2)).toContain('addr del 2001:db8::10/64 dev net1\naddr del 172.20.0.11/24 dev net1\n');
    expect(await fullScript(S3, S3, AFTER_S3)).toBe('');
  });

  it('a refused batch fails the sync with the tool and what it refused', async () => {
    const x = fakeIp(
      () => INITIAL,
      () => true,
    );
    await expect(new PromotingLinks(x).sync(S1, undefined)).rejects.toThrow(/ip -batch - refused the address and route change/);
  });

  it('a dry run reads and plans, and changes nothing', async () => {
    const x = fakeIp(() => AFTER_S1);
    const dry = await new PromotingLinks(x).sync(S2, S1, { dryRun: true });
    expect(dry.script).toBe(await fullScript(S2, S1, AFTER_S1));
    expect(x.calls.map(cmd)).not.toContain(APPLY);
  });
});

describe('planLink: details', () => {
  it("a subnet's secondaries are deleted before its primary, in the listing's order", () => {
    const a = (address: string) => ({ address, prefixLength: 24, family: 4 as const, scope: 'global' });
    // After 10.0.0.1 was deleted with promote_secondaries on: 10.0.0.2 is the subnet's primary.
    const have: LinkView = { extAddresses: [a('10.1.0.1'), a('10.0.0.2'), a('10.1.0.2'), a('10.0.0.3')], vpcRoutes: [], extDefaults: [] };
    const previous = state({ eips: ['10.0.0.2/24', '10.0.0.3/24'], routes: [] });
    expect(planLink(have, state({ eips: [], routes: [] }), previous)).toEqual(['addr del 10.0.0.3/24 dev net1', 'addr del 10.0.0.2/24 dev net1']);
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
