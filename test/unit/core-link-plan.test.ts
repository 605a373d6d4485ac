/**
 * planLink (pure): the `ip -batch` lines that take what the kernel holds to the desired
 * addresses, routes and default routes, removing only what natgw itself programmed before.
 */
import { describe, expect, it } from 'vitest';
import { planLink, type LinkAddress, type LinkRoute, type LinkView } from '../../src/dataplane/linkPlan.js';
import { emptyState, type DesiredState } from '../../src/state/state.js';

function state(patch: Partial<DesiredState> = {}): DesiredState {
  return { ...emptyState('eth0', 'net1'), initialized: true, ...patch };
}

const addr = (address: string, prefixLength: number, scope = 'global'): LinkAddress => ({
  address,
  prefixLength,
  family: address.includes(':') ? 6 : 4,
  scope,
});

function view(p: { addrs?: LinkAddress[]; routes?: LinkRoute[]; defaults?: LinkRoute[] } = {}): LinkView {
  return { extAddresses: p.addrs ?? [], vpcRoutes: p.routes ?? [], extDefaults: p.defaults ?? [] };
}

describe('planLink: EIP addresses', () => {
  it('deletes secondaries before their primary (reverse kernel order)', () => {
    const eips = ['172.18.0.10', '172.18.0.11', '172.18.0.12'].map((address) => ({ address, prefixLength: 24 }));
    const have = view({ addrs: eips.map((e) => addr(e.address, 24)) });
    expect(planLink(have, state(), state({ eips }))).toEqual([
      'addr del 172.18.0.12/24 dev net1',
      'addr del 172.18.0.11/24 dev net1',
      'addr del 172.18.0.10/24 dev net1',
    ]);
  });

  it('a missing EIP → addr replace', () => {
    const want = state({
      eips: [
        { address: '172.18.0.10', prefixLength: 24 },
        { address: '172.18.0.11', prefixLength: 16 },
      ],
    });
    expect(planLink(view(), want, undefined)).toEqual(['addr replace 172.18.0.10/24 dev net1', 'addr replace 172.18.0.11/16 dev net1']);
  });

  it('present with the same prefix → nothing', () => {
    const want = state({ eips: [{ address: '172.18.0.10', prefixLength: 24 }] });
    expect(planLink(view({ addrs: [addr('172.18.0.10', 24)] }), want, want)).toEqual([]);
  });

  it('present with another prefix → addr replace with the wanted prefix', () => {
    const want = state({ eips: [{ address: '172.18.0.10', prefixLength: 24 }] });
    expect(planLink(view({ addrs: [addr('172.18.0.10', 16)] }), want, undefined)).toContain('addr replace 172.18.0.10/24 dev net1');
  });

  // BUG (src/dataplane/link.ts, planLink, the address loop): `ip addr replace A/24` does NOT
  // replace `A/16` — for IPv4 the kernel matches an existing address by local address AND
  // mask (find_matching_ifa), so it adds a second address (checked: after
  // `ip addr add 1.2.3.4/16 dev lo; ip addr replace 1.2.3.4/24 dev lo` both are listed).
  // planLink then keys `addrHave` by address only, so the stale /16 (and its prefix route) is
  // never removed, and eip-del removes only one of the two. Fix: key what the kernel holds by
  // address/prefix; for each wanted EIP, `addr del` every other prefix of that address that
  // natgw programmed (previous state) before/after the `addr replace`; on eip-del, delete
  // every prefix of the address that natgw programmed.
  it('another prefix: the old prefix natgw programmed is removed too', () => {
    const previous = state({ eips: [{ address: '172.18.0.10', prefixLength: 16 }] });
    const want = state({ eips: [{ address: '172.18.0.10', prefixLength: 24 }] });
    const lines = planLink(view({ addrs: [addr('172.18.0.10', 16)] }), want, previous);
    expect(lines).toContain('addr replace 172.18.0.10/24 dev net1');
    expect(lines).toContain('addr del 172.18.0.10/16 dev net1');
  });

  it('both prefixes present after an earlier replace: the stale one is removed', () => {
    const previous = state({ eips: [{ address: '172.18.0.10', prefixLength: 16 }] });
    const want = state({ eips: [{ address: '172.18.0.10', prefixLength: 24 }] });
    const lines = planLink(view({ addrs: [addr('172.18.0.10', 16), addr('172.18.0.10', 24)] }), want, previous);
    expect(lines).toEqual(['addr del 172.18.0.10/16 dev net1']);
  });

  it('an EIP removed since the previous state → addr del with the prefix the kernel holds', () => {
    const previous = state({
      eips: [
        { address: '172.18.0.10', prefixLength: 24 },
        { address: '172.18.0.11', prefixLength: 24 },
      ],
    });
    const want = state({ eips: [{ address: '172.18.0.11', prefixLength: 24 }] });
    const have = view({ addrs: [addr('172.18.0.10', 16), addr('172.18.0.11', 24)] });
    expect(planLink(have, want, previous)).toEqual(['addr del 172.18.0.10/16 dev net1']);
  });

  it('an EIP removed since the previous state but already gone → nothing', () => {
    const previous = state({ eips: [{ address: '172.18.0.10', prefixLength: 24 }] });
    expect(planLink(view({ addrs: [addr('172.18.0.11', 24)] }), state(), previous)).toEqual([]);
  });

  it('foreign addresses are never deleted (no previous, or not in previous)', () => {
    const have = view({ addrs: [addr('172.18.0.2', 24), addr('fe80::1', 64, 'link'), addr('172.18.0.10', 24)] });
    expect(planLink(have, state(), undefined)).toEqual([]);
    const previous = state({ eips: [{ address: '172.18.0.10', prefixLength: 24 }] });
    expect(planLink(have, state(), previous)).toEqual(['addr del 172.18.0.10/24 dev net1']);
  });

  it('IPv6 EIPs (API) are planned the same way, without duplicate address detection', () => {
    const want = state({ eips: [{ address: '2001:db8::10', prefixLength: 64 }] });
    expect(planLink(view(), want, undefined)).toEqual(['addr replace 2001:db8::10/64 dev net1 nodad']);
    expect(planLink(view({ addrs: [addr('2001:db8::10', 64)] }), want, undefined)).toEqual([]);
  });
});

describe('planLink: VPC routes', () => {
  const r1 = { cidr: '10.1.0.0/16', nexthop: '10.0.0.1' };
  const r2 = { cidr: '10.2.3.4/32', nexthop: '10.0.0.2' };

  it('missing → route replace via nexthop on VPC', () => {
    expect(planLink(view(), state({ routes: [r1, r2] }), undefined)).toEqual([
      'route replace 10.1.0.0/16 via 10.0.0.1 dev eth0',
      'route replace 10.2.3.4/32 via 10.0.0.2 dev eth0',
    ]);
  });

  it('present with the same gateway → nothing (host routes shown without a prefix match /32)', () => {
    const have = view({
      routes: [
        { dst: '10.1.0.0/16', gateway: '10.0.0.1' },
        { dst: '10.2.3.4', gateway: '10.0.0.2' },
      ],
    });
    expect(planLink(have, state({ routes: [r1, r2] }), undefined)).toEqual([]);
  });

  it('present with another gateway → route replace', () => {
    const have = view({ routes: [{ dst: '10.1.0.0/16', gateway: '10.0.0.9' }] });
    expect(planLink(have, state({ routes: [r1] }), undefined)).toEqual(['route replace 10.1.0.0/16 via 10.0.0.1 dev eth0']);
  });

  it('removed since the previous state and present → route del; absent → nothing', () => {
    const previous = state({ routes: [r1, r2] });
    const have = view({ routes: [{ dst: '10.1.0.0/16', gateway: '10.0.0.1' }] });
    expect(planLink(have, state(), previous)).toEqual(['route del 10.1.0.0/16 dev eth0']);
    expect(planLink(view(), state(), previous)).toEqual([]);
  });

  it('foreign routes (connected subnet, others) are never deleted', () => {
    const have = view({ routes: [{ dst: '10.0.0.0/24' }, { dst: '10.9.0.0/16', gateway: '10.0.0.5' }] });
    expect(planLink(have, state(), state({ routes: [r1] }))).toEqual([]);
    expect(planLink(have, state(), undefined)).toEqual([]);
  });
});

describe('planLink: default routes from GATEWAY_V4 / GATEWAY_V6', () => {
  it('v4 and v6 defaults with onlink when missing', () => {
    const want = state({ defaultRoutes: { v4: '172.18.0.1', v6: 'fd00::1' } });
    expect(planLink(view(), want, undefined)).toEqual([
      'route replace default via 172.18.0.1 dev net1 onlink',
      'route replace default via fd00::1 dev net1 onlink',
    ]);
  });

  it('nothing when present', () => {
    const want = state({ defaultRoutes: { v4: '172.18.0.1', v6: 'fd00::1' } });
    const have = view({
      defaults: [
        { dst: 'default', gateway: '172.18.0.1' },
        { dst: 'default', gateway: 'fd00::1' },
      ],
    });
    expect(planLink(have, want, want)).toEqual([]);
  });

  it('only the missing family is added', () => {
    const want = state({ defaultRoutes: { v4: '172.18.0.1', v6: 'fd00::1' } });
    expect(planLink(view({ defaults: [{ dst: 'default', gateway: 'fd00::1' }] }), want, undefined)).toEqual([
      'route replace default via 172.18.0.1 dev net1 onlink',
    ]);
  });

  it('a default route via another gateway is replaced', () => {
    const want = state({ defaultRoutes: { v4: '172.18.0.1' } });
    expect(planLink(view({ defaults: [{ dst: 'default', gateway: '172.18.0.254' }] }), want, undefined)).toEqual([
      'route replace default via 172.18.0.1 dev net1 onlink',
    ]);
  });

  it('no gateways recorded → no default route lines; eip-del never removes defaults', () => {
    expect(planLink(view(), state(), undefined)).toEqual([]);
    const previous = state({ eips: [{ address: '172.18.0.10', prefixLength: 24 }], defaultRoutes: { v4: '172.18.0.1' } });
    const want = state({ defaultRoutes: { v4: '172.18.0.1' } });
    const have = view({ addrs: [addr('172.18.0.10', 24)], defaults: [{ dst: 'default', gateway: '172.18.0.1' }] });
    expect(planLink(have, want, previous)).toEqual(['addr del 172.18.0.10/24 dev net1']);
  });
});

describe('planLink: one owner for the default route', () => {
  // The external default (GATEWAY_V4/V6) owns a family's default; a subnet route to it is held.
  const both = state({
    defaultRoutes: { v4: '172.20.0.1', v6: 'fd00:20::1' },
    routes: [
      { cidr: '0.0.0.0/0', nexthop: '10.0.1.254' },
      { cidr: '::/0', nexthop: 'fe80::fe' },
      { cidr: '10.0.2.0/24', nexthop: '10.0.1.254' },
    ],
  });

  it('a state holding both installs the external default and not the subnet route to it', () => {
    expect(planLink(view(), both, undefined)).toEqual([
      'route replace 10.0.2.0/24 via 10.0.1.254 dev eth0',
      'route replace default via 172.20.0.1 dev net1 onlink',
      'route replace default via fd00:20::1 dev net1 onlink',
    ]);
  });

  it('where the kernel has the subnet route on VPC, the external default takes its place without a delete first (no gap)', () => {
    const have = view({
      routes: [
        { dst: 'default', gateway: '10.0.1.254' },
        { dst: 'default', gateway: 'fe80::fe' },
        { dst: '10.0.2.0/24', gateway: '10.0.1.254' },
      ],
    });
    const previous = state({ routes: both.routes });
    expect(planLink(have, both, previous)).toEqual([
      'route replace default via 172.20.0.1 dev net1 onlink',
      'route replace default via fd00:20::1 dev net1 onlink',
    ]);
  });

  it('converges: once the kernel holds what the first sync planned, every sync plans nothing (the two never replace each other)', () => {
    const have = view({ routes: [{ dst: 'default', gateway: '10.0.1.254' }] });
    expect(planLink(have, both, state({ routes: [{ cidr: '0.0.0.0/0', nexthop: '10.0.1.254' }] })).length).toBeGreaterThan(0);
    // What the kernel lists after it: `replace default` on EXT took the place of VPC's default.
    const after = view({
      routes: [{ dst: '10.0.2.0/24', gateway: '10.0.1.254' }],
      defaults: [
        { dst: 'default', gateway: '172.20.0.1' },
        { dst: 'default', gateway: 'fd00:20::1' },
      ],
    });
    expect(planLink(after, both, both)).toEqual([]);
  });

  it('only the family the external default owns is held', () => {
    const v6Only = { ...both, defaultRoutes: { v6: 'fd00:20::1' } };
    expect(planLink(view(), v6Only, undefined)).toEqual([
      'route replace 0.0.0.0/0 via 10.0.1.254 dev eth0',
      'route replace 10.0.2.0/24 via 10.0.1.254 dev eth0',
      'route replace default via fd00:20::1 dev net1 onlink',
    ]);
  });

  it('once the external default is removed from the state, the held route is installed', () => {
    const have = view({ defaults: [{ dst: 'default', gateway: '172.20.0.1' }] });
    const want = state({ routes: [{ cidr: '0.0.0.0/0', nexthop: '10.0.1.254' }] });
    expect(planLink(have, want, { ...want, defaultRoutes: { v4: '172.20.0.1' } })).toEqual(['route replace 0.0.0.0/0 via 10.0.1.254 dev eth0']);
  });

  it('deleting the held route removes nothing from the kernel (the default is the external one)', () => {
    const have = view({ defaults: [{ dst: 'default', gateway: '172.20.0.1' }] });
    const want = state({ defaultRoutes: { v4: '172.20.0.1' } });
    const previous = { ...want, routes: [{ cidr: '0.0.0.0/0', nexthop: '10.0.1.254' }] };
    expect(planLink(have, want, previous, { addresses: new Set(), routes: new Set(['0.0.0.0/0']) })).toEqual([]);
  });
});

describe('planLink: a complete plan', () => {
  it('addresses, then routes, then default routes; converged → nothing', () => {
    const want = state({
      eips: [{ address: '172.18.0.10', prefixLength: 24 }],
      routes: [{ cidr: '10.1.0.0/16', nexthop: '10.0.0.1' }],
      defaultRoutes: { v4: '172.18.0.1' },
    });
    expect(planLink(view(), want, undefined)).toEqual([
      'addr replace 172.18.0.10/24 dev net1',
      'route replace 10.1.0.0/16 via 10.0.0.1 dev eth0',
      'route replace default via 172.18.0.1 dev net1 onlink',
    ]);
    const converged = view({
      addrs: [addr('172.18.0.10', 24)],
      routes: [{ dst: '10.1.0.0/16', gateway: '10.0.0.1' }],
      defaults: [{ dst: 'default', gateway: '172.18.0.1' }],
    });
    expect(planLink(converged, want, want)).toEqual([]);
  });

  it('uses the interface names of the desired state', () => {
    const want = {
      ...state({ eips: [{ address: '172.18.0.10', prefixLength: 24 }], routes: [{ cidr: '10.1.0.0/16', nexthop: '10.0.0.1' }] }),
      interfaces: { vpc: 'net2', ext: 'net3' },
    };
    expect(planLink(view(), want, undefined)).toEqual(['addr replace 172.18.0.10/24 dev net3', 'route replace 10.1.0.0/16 via 10.0.0.1 dev net2']);
  });
});

describe('planLink: what natgw owns besides the previous state', () => {
  const owned = (addresses: string[], routes: string[] = []) => ({ addresses: new Set(addresses), routes: new Set(routes) });
  const lines = (have: LinkView, want: DesiredState, prev: DesiredState | undefined, o: ReturnType<typeof owned>) => planLink(have, want, prev, o);

  it("removes an owned address the state does not list (every prefix), and keeps the pod's own", () => {
    const have = view({ addrs: [addr('172.20.0.2', 16), addr('172.20.0.77', 16), addr('172.20.0.77', 24)] });
    expect(lines(have, state(), state(), owned(['172.20.0.77']))).toEqual(['addr del 172.20.0.77/24 dev net1', 'addr del 172.20.0.77/16 dev net1']);
  });

  it('keeps an owned address the state wants', () => {
    const want = state({ eips: [{ address: '172.20.0.77', prefixLength: 16 }] });
    expect(lines(view({ addrs: [addr('172.20.0.77', 16)] }), want, undefined, owned(['172.20.0.77']))).toEqual([]);
  });

  it('removes an owned route that is present and unwanted; an absent one is nothing to do', () => {
    const have = view({
      routes: [
        { dst: '10.1.0.0/16', gateway: '10.0.0.1' },
        { dst: '10.3.0.0/16', gateway: '10.0.0.1' },
      ],
    });
    expect(lines(have, state(), undefined, owned([], ['10.1.0.0/16', '10.2.0.0/16']))).toEqual(['route del 10.1.0.0/16 dev eth0']);
  });
});
