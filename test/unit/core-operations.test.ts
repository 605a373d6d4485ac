/**
 * Pure operations over the desired state (SPEC §2): strict adds by identity, lenient deletes,
 * conflicts with the script's message text, SNAT ordering, effects for the engine, and no
 * mutation of the input.
 */
import { describe, expect, it } from 'vitest';
import { ConflictError, RuleConflictError } from '../../src/model/errors.js';
import { worded } from '../../src/engine/conflicts.js';
import type { Dnat, Fip, ShareDnat, Snat } from '../../src/model/rules.js';
import { emptyState, type DesiredState } from '../../src/state/state.js';
import {
  addDnat,
  addEip,
  addFip,
  addRoute,
  addShareDnat,
  addSnat,
  delDnat,
  delEip,
  delFip,
  delRoute,
  delShareDnat,
  delSnat,
  type OpResult,
} from '../../src/state/operations.js';
import { prng } from '../helpers/prng.js';

/** Recursively freeze a value so that any mutation throws (ESM code runs in strict mode). */
function deepFreeze<T>(v: T): T {
  if (v !== null && typeof v === 'object' && !Object.isFrozen(v)) {
    Object.freeze(v);
    for (const k of Object.keys(v as object)) deepFreeze((v as Record<string, unknown>)[k]);
  }
  return v;
}

const clone = <T>(v: T): T => structuredClone(v);

function base(): DesiredState {
  return { ...emptyState('eth0', 'net1'), initialized: true };
}

/** A frozen state built from a base with some lists filled. */
function frozen(patch: Partial<DesiredState> = {}): DesiredState {
  return deepFreeze({ ...base(), ...clone(patch) });
}

/** Run an op on a frozen copy, check the input is untouched, return the result. */
function run(s: DesiredState, op: (s: DesiredState) => OpResult): OpResult {
  const input = deepFreeze(clone(s));
  const before = clone(input);
  const r = op(input);
  expect(input).toEqual(before);
  return r;
}

function conflict(fn: () => unknown): ConflictError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(ConflictError);
    const err = e as ConflictError;
    expect(err.kind).toBe('conflict');
    expect(err.stream).toBe('stdout');
    // A rule conflict's message quotes the existing iptables rule as every door words it.
    return worded(err) as ConflictError;
  }
  throw new Error('expected a ConflictError');
}

const snat = (eip: string, cidr: string, randomFully = false): Snat => ({ eip, cidr, randomFully });

describe('floating IPs', () => {
  const f: Fip = { eip: '1.2.3.4', internalIp: '10.0.1.6' };

  it('adds an absent FIP, without effects', () => {
    const r = run(base(), (s) => addFip(s, f));
    expect(r.state.fips).toEqual([f]);
    expect(r.effects).toEqual([]);
  });

  it('same internal IP again: success, nothing changes (the very same state object)', () => {
    const s = frozen({ fips: [f] });
    const r = addFip(s, { ...f });
    expect(r.state).toBe(s);
    expect(r.effects).toEqual([]);
  });

  it('another internal IP: conflict with the exact script message, state untouched', () => {
    const s = frozen({ fips: [f] });
    const err = conflict(() => addFip(s, { eip: '1.2.3.4', internalIp: '10.0.1.7' }));
    expect(err.message).toBe(
      'eip 1.2.3.4 already bindTo rule: -A EXCLUSIVE_DNAT -d 1.2.3.4/32 -j DNAT --to-destination 10.0.1.6, but expected internalIp 10.0.1.7',
    );
    expect(s.fips).toEqual([f]);
  });

  it('the conflict carries both floating IPs, typed', () => {
    const wanted = { eip: '1.2.3.4', internalIp: '10.0.1.7' };
    let err: unknown;
    try {
      addFip(frozen({ fips: [f] }), wanted);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(RuleConflictError);
    expect((err as RuleConflictError).conflict).toEqual({ kind: 'fip', wanted, existing: f });
  });

  it('the same internal IP may be bound by several EIPs', () => {
    let s = base();
    s = run(s, (x) => addFip(x, f)).state;
    s = run(s, (x) => addFip(x, { eip: '1.2.3.5', internalIp: '10.0.1.6' })).state;
    s = run(s, (x) => addFip(x, { eip: '1.2.3.6', internalIp: '10.0.1.6' })).state;
    expect(s.fips).toEqual([f, { eip: '1.2.3.5', internalIp: '10.0.1.6' }, { eip: '1.2.3.6', internalIp: '10.0.1.6' }]);
  });

  it('delete removes the FIP and flushes conntrack for the EIP as destination', () => {
    const s = frozen({ fips: [f, { eip: '1.2.3.5', internalIp: '10.0.1.6' }] });
    const r = run(s, (x) => delFip(x, '1.2.3.4'));
    expect(r.state.fips).toEqual([{ eip: '1.2.3.5', internalIp: '10.0.1.6' }]);
    expect(r.effects).toEqual([{ kind: 'conntrack-flush', dst: '1.2.3.4' }]);
  });

  it('delete of an absent FIP is success (and still flushes stale conntrack)', () => {
    const s = frozen({ fips: [f] });
    const r = run(s, (x) => delFip(x, '9.9.9.9'));
    expect(r.state).toEqual(s);
    expect(r.effects).toEqual([{ kind: 'conntrack-flush', dst: '9.9.9.9' }]);
  });
});

describe('DNAT', () => {
  const d: Dnat = { eip: '1.2.3.4', port: 8080, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 };

  it('adds an absent DNAT', () => {
    const r = run(base(), (s) => addDnat(s, d));
    expect(r.state.dnats).toEqual([d]);
    expect(r.effects).toEqual([]);
  });

  it('same target: no change', () => {
    const s = frozen({ dnats: [d] });
    const r = addDnat(s, { ...d });
    expect(r.state).toBe(s);
    expect(r.effects).toEqual([]);
  });

  it('other internal IP or port: conflict with the exact script message', () => {
    const s = frozen({ dnats: [d] });
    expect(conflict(() => addDnat(s, { ...d, internalIp: '10.0.1.7' })).message).toBe(
      'dnat (1.2.3.4, 8080, tcp) already exists: -A SHARED_DNAT -d 1.2.3.4/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.0.1.6:80, but expected 10.0.1.7:80',
    );
    expect(conflict(() => addDnat(s, { ...d, internalPort: 81 })).message).toBe(
      'dnat (1.2.3.4, 8080, tcp) already exists: -A SHARED_DNAT -d 1.2.3.4/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.0.1.6:80, but expected 10.0.1.6:81',
    );
  });

  it('identity is (eip, port, protocol): another protocol, port or eip is a different rule', () => {
    let s: DesiredState = frozen({ dnats: [d] });
    s = run(s, (x) => addDnat(x, { ...d, protocol: 'udp', internalIp: '10.0.1.9' })).state;
    s = run(s, (x) => addDnat(x, { ...d, port: 8081, internalIp: '10.0.1.9' })).state;
    s = run(s, (x) => addDnat(x, { ...d, eip: '1.2.3.5', internalIp: '10.0.1.9' })).state;
    expect(s.dnats).toHaveLength(4);
    expect(s.dnats[0]).toEqual(d);
  });

  it('delete removes the identity and flushes conntrack for dst, protocol and port', () => {
    const other: Dnat = { ...d, protocol: 'udp' };
    const s = frozen({ dnats: [d, other] });
    const r = run(s, (x) => delDnat(x, { eip: '1.2.3.4', port: 8080, protocol: 'tcp' }));
    expect(r.state.dnats).toEqual([other]);
    expect(r.effects).toEqual([{ kind: 'conntrack-flush', dst: '1.2.3.4', protocol: 'tcp', port: 8080 }]);
  });

  it('delete of an absent DNAT is success', () => {
    const s = frozen({ dnats: [d] });
    const r = run(s, (x) => delDnat(x, { eip: '1.2.3.4', port: 9999, protocol: 'tcp' }));
    expect(r.state.dnats).toEqual([d]);
    expect(r.effects).toEqual([{ kind: 'conntrack-flush', dst: '1.2.3.4', protocol: 'tcp', port: 9999 }]);
  });
});

describe('SNAT', () => {
  it('keeps descending prefix length: /16, /20, /24, /32 added in order end up /32, /24, /20, /16', () => {
    let s = base();
    for (const c of ['10.0.0.0/16', '10.0.0.0/20', '10.0.1.0/24', '10.0.1.5/32']) s = run(s, (x) => addSnat(x, snat('1.2.3.4', c))).state;
    expect(s.snats.map((x) => x.cidr)).toEqual(['10.0.1.5/32', '10.0.1.0/24', '10.0.0.0/20', '10.0.0.0/16']);
  });

  it('any insertion order gives the same descending order', () => {
    const cidrs = ['10.0.0.0/16', '10.0.0.0/20', '10.0.1.0/24', '10.0.1.5/32', '0.0.0.0/0', '10.0.0.0/8'];
    const perms = [
      [0, 1, 2, 3, 4, 5],
      [5, 4, 3, 2, 1, 0],
      [3, 0, 5, 1, 4, 2],
      [4, 2, 0, 5, 3, 1],
    ];
    for (const p of perms) {
      let s = base();
      for (const i of p) s = run(s, (x) => addSnat(x, snat('1.2.3.4', cidrs[i] ?? ''))).state;
      expect(s.snats.map((x) => x.cidr)).toEqual(['10.0.1.5/32', '10.0.1.0/24', '10.0.0.0/20', '10.0.0.0/16', '10.0.0.0/8', '0.0.0.0/0']);
    }
  });

  it('equal length: a new rule goes after the existing ones', () => {
    let s = base();
    s = run(s, (x) => addSnat(x, snat('1.2.3.4', '10.0.0.0/16'))).state;
    s = run(s, (x) => addSnat(x, snat('1.2.3.4', '10.0.1.0/24'))).state;
    s = run(s, (x) => addSnat(x, snat('1.2.3.4', '10.0.2.0/24'))).state;
    s = run(s, (x) => addSnat(x, snat('1.2.3.4', '10.0.3.0/24'))).state;
    s = run(s, (x) => addSnat(x, snat('1.2.3.4', '10.1.0.0/16'))).state;
    expect(s.snats.map((x) => x.cidr)).toEqual(['10.0.1.0/24', '10.0.2.0/24', '10.0.3.0/24', '10.0.0.0/16', '10.1.0.0/16']);
  });

  it('duplicates are ignored: same state object, whatever --random-fully says', () => {
    const s = frozen({ snats: [snat('1.2.3.4', '10.0.1.0/24')] });
    expect(addSnat(s, snat('1.2.3.4', '10.0.1.0/24')).state).toBe(s);
    expect(addSnat(s, snat('1.2.3.4', '10.0.1.0/24', true)).state).toBe(s);
    expect(addSnat(s, snat('1.2.3.4', '10.0.1.0/24')).effects).toEqual([]);
  });

  it('several EIPs per CIDR and several CIDRs per EIP', () => {
    let s = base();
    s = run(s, (x) => addSnat(x, snat('1.2.3.4', '10.0.1.0/24'))).state;
    s = run(s, (x) => addSnat(x, snat('1.2.3.5', '10.0.1.0/24'))).state;
    s = run(s, (x) => addSnat(x, snat('1.2.3.4', '10.0.2.0/24', true))).state;
    s = run(s, (x) => addSnat(x, snat('1.2.3.4', '10.0.3.0/25'))).state;
    expect(s.snats).toEqual([
      snat('1.2.3.4', '10.0.3.0/25'),
      snat('1.2.3.4', '10.0.1.0/24'),
      snat('1.2.3.5', '10.0.1.0/24'),
      snat('1.2.3.4', '10.0.2.0/24', true),
    ]);
  });

  it('delete removes only that identity; absent is success; no effects', () => {
    const s = frozen({ snats: [snat('1.2.3.4', '10.0.1.0/24'), snat('1.2.3.5', '10.0.1.0/24'), snat('1.2.3.4', '10.0.2.0/24')] });
    const r = run(s, (x) => delSnat(x, { eip: '1.2.3.4', cidr: '10.0.1.0/24' }));
    expect(r.state.snats).toEqual([snat('1.2.3.5', '10.0.1.0/24'), snat('1.2.3.4', '10.0.2.0/24')]);
    expect(r.effects).toEqual([]);
    const r2 = run(s, (x) => delSnat(x, { eip: '9.9.9.9', cidr: '10.0.1.0/24' }));
    expect(r2.state).toEqual(s);
    expect(r2.effects).toEqual([]);
  });
});

describe('EIPs', () => {
  it('eip-add records the EIP and asks for a gratuitous ARP', () => {
    const r = run(base(), (s) => addEip(s, { address: '1.2.3.4', prefixLength: 24 }, {}));
    expect(r.state.eips).toEqual([{ address: '1.2.3.4', prefixLength: 24 }]);
    expect(r.effects).toEqual([{ kind: 'garp', ip: '1.2.3.4' }]);
    expect(r.state.defaultRoutes).toEqual({});
  });

  it('re-adding with the same prefix changes nothing and announces nothing (a resent command)', () => {
    const s = frozen({ eips: [{ address: '1.2.3.4', prefixLength: 24 }] });
    const r = run(s, (x) => addEip(x, { address: '1.2.3.4', prefixLength: 24 }, {}));
    expect(r.state).toEqual(s);
    expect(r.effects).toEqual([]);
    // A resent command that also names the gateway still records it, without an announcement.
    const g = run(s, (x) => addEip(x, { address: '1.2.3.4', prefixLength: 24 }, { v4: '1.2.3.1' }));
    expect(g.state.defaultRoutes).toEqual({ v4: '1.2.3.1' });
    expect(g.effects).toEqual([]);
  });

  it('a changed prefix announces the EIP; a new EIP beside held ones announces only itself', () => {
    const s = frozen({ eips: [{ address: '1.2.3.4', prefixLength: 24 }] });
    expect(run(s, (x) => addEip(x, { address: '1.2.3.4', prefixLength: 16 }, {})).effects).toEqual([{ kind: 'garp', ip: '1.2.3.4' }]);
    expect(run(s, (x) => addEip(x, { address: '1.2.3.5', prefixLength: 24 }, {})).effects).toEqual([{ kind: 'garp', ip: '1.2.3.5' }]);
  });

  it('a new prefix length replaces the old one in place', () => {
    const s = frozen({
      eips: [
        { address: '1.2.3.3', prefixLength: 24 },
        { address: '1.2.3.4', prefixLength: 24 },
        { address: '1.2.3.5', prefixLength: 24 },
      ],
    });
    const r = run(s, (x) => addEip(x, { address: '1.2.3.4', prefixLength: 16 }, {}));
    expect(r.state.eips).toEqual([
      { address: '1.2.3.3', prefixLength: 24 },
      { address: '1.2.3.4', prefixLength: 16 },
      { address: '1.2.3.5', prefixLength: 24 },
    ]);
  });

  it('records default routes from the gateways; a later eip-add without them keeps them', () => {
    let s = base();
    s = run(s, (x) => addEip(x, { address: '1.2.3.4', prefixLength: 24 }, { v4: '1.2.3.1' })).state;
    expect(s.defaultRoutes).toEqual({ v4: '1.2.3.1' });
    s = run(s, (x) => addEip(x, { address: '1.2.3.5', prefixLength: 24 }, {})).state;
    expect(s.defaultRoutes).toEqual({ v4: '1.2.3.1' });
    s = run(s, (x) => addEip(x, { address: '1.2.3.6', prefixLength: 24 }, { v6: 'fd00::1' })).state;
    expect(s.defaultRoutes).toEqual({ v4: '1.2.3.1', v6: 'fd00::1' });
    s = run(s, (x) => addEip(x, { address: '1.2.3.7', prefixLength: 24 }, { v4: '1.2.3.254', v6: 'fd00::2' })).state;
    expect(s.defaultRoutes).toEqual({ v4: '1.2.3.254', v6: 'fd00::2' });
  });

  it('an empty gateway (GATEWAY_V4="") records nothing', () => {
    const r = run(base(), (s) => addEip(s, { address: '1.2.3.4', prefixLength: 24 }, { v4: '', v6: '' }));
    expect(r.state.defaultRoutes).toEqual({});
  });

  it('eip-del removes the EIP; default routes stay; absent is success', () => {
    const s = frozen({
      eips: [
        { address: '1.2.3.4', prefixLength: 24 },
        { address: '1.2.3.5', prefixLength: 24 },
      ],
      defaultRoutes: { v4: '1.2.3.1' },
    });
    const r = run(s, (x) => delEip(x, '1.2.3.4'));
    expect(r.state.eips).toEqual([{ address: '1.2.3.5', prefixLength: 24 }]);
    expect(r.state.defaultRoutes).toEqual({ v4: '1.2.3.1' });
    // The delete names its address: it leaves the interface whether or not the state listed it (SPEC §5).
    expect(r.effects).toEqual([{ kind: 'release', address: '1.2.3.4' }]);
    const r2 = run(s, (x) => delEip(x, '9.9.9.9'));
    expect(r2.state).toEqual(s);
    expect(r2.effects).toEqual([{ kind: 'release', address: '9.9.9.9' }]);
  });
});

describe('share DNAT', () => {
  const d: ShareDnat = { eip: '1.2.3.4', port: 80, protocol: 'tcp', protocolText: 'tcp', backends: [{ ip: '10.0.1.6', port: 8080 }] };

  it('adds an absent identity', () => {
    const r = run(base(), (s) => addShareDnat(s, d));
    expect(r.state.shareDnats).toEqual([d]);
    expect(r.effects).toEqual([]);
  });

  it('re-adding replaces the backends (and the protocol text) in place, never conflicts', () => {
    const other: ShareDnat = { ...d, port: 81 };
    const s = frozen({ shareDnats: [d, other] });
    const next: ShareDnat = {
      ...d,
      protocolText: 'TCP',
      backends: [
        { ip: '10.0.1.7', port: 80 },
        { ip: '10.0.1.8', port: 81 },
      ],
    };
    const r = run(s, (x) => addShareDnat(x, next));
    expect(r.state.shareDnats).toEqual([next, other]);
    expect(r.effects).toEqual([]);
  });

  it('re-adding the same backends leaves an equal state', () => {
    const s = frozen({ shareDnats: [d] });
    expect(run(s, (x) => addShareDnat(x, clone(d))).state).toEqual(s);
  });

  it('delete removes the identity and flushes conntrack for it; absent is success', () => {
    const other: ShareDnat = { ...d, protocol: 'udp', protocolText: 'udp' };
    const s = frozen({ shareDnats: [d, other] });
    const r = run(s, (x) => delShareDnat(x, { eip: '1.2.3.4', port: 80, protocol: 'tcp' }));
    expect(r.state.shareDnats).toEqual([other]);
    expect(r.effects).toEqual([{ kind: 'conntrack-flush', dst: '1.2.3.4', protocol: 'tcp', port: 80 }]);
    const r2 = run(s, (x) => delShareDnat(x, { eip: '1.2.3.4', port: 99, protocol: 'tcp' }));
    expect(r2.state.shareDnats).toEqual([d, other]);
  });
});

describe('routes', () => {
  it('adds, and same nexthop again is a no-op (same object)', () => {
    const r = run(base(), (s) => addRoute(s, { cidr: '10.1.0.0/16', nexthop: '10.0.0.1' }));
    expect(r.state.routes).toEqual([{ cidr: '10.1.0.0/16', nexthop: '10.0.0.1' }]);
    const s = deepFreeze(r.state);
    expect(addRoute(s, { cidr: '10.1.0.0/16', nexthop: '10.0.0.1' }).state).toBe(s);
  });

  it('another nexthop replaces the route in place (ip route replace)', () => {
    const s = frozen({
      routes: [
        { cidr: '10.1.0.0/16', nexthop: '10.0.0.1' },
        { cidr: '10.2.0.0/16', nexthop: '10.0.0.1' },
      ],
    });
    const r = run(s, (x) => addRoute(x, { cidr: '10.1.0.0/16', nexthop: '10.0.0.2' }));
    expect(r.state.routes).toEqual([
      { cidr: '10.1.0.0/16', nexthop: '10.0.0.2' },
      { cidr: '10.2.0.0/16', nexthop: '10.0.0.1' },
    ]);
    expect(r.effects).toEqual([]);
  });

  it('delete removes by cidr; absent is success', () => {
    const s = frozen({
      routes: [
        { cidr: '10.1.0.0/16', nexthop: '10.0.0.1' },
        { cidr: '10.2.0.0/16', nexthop: '10.0.0.1' },
      ],
    });
    expect(run(s, (x) => delRoute(x, '10.1.0.0/16')).state.routes).toEqual([{ cidr: '10.2.0.0/16', nexthop: '10.0.0.1' }]);
    expect(run(s, (x) => delRoute(x, '10.9.0.0/16')).state).toEqual(s);
    expect(run(s, (x) => delRoute(x, '10.9.0.0/16')).effects).toEqual([{ kind: 'release', route: '10.9.0.0/16' }]);
  });
});

describe('routes: one owner for the default route', () => {
  const gw = { v4: '172.20.0.1', v6: 'fd00:20::1' };

  it('a subnet route to 0.0.0.0/0 is refused while the external default (GATEWAY_V4) owns it, naming both and the way out', () => {
    const s = frozen({ defaultRoutes: { v4: gw.v4 } });
    const e = conflict(() => addRoute(s, { cidr: '0.0.0.0/0', nexthop: '10.0.1.254' }));
    expect(e.message).toBe(
      'subnet route 0.0.0.0/0 via 10.0.1.254 conflicts with the default route via 172.20.0.1 dev net1 that eip-add installs from GATEWAY_V4, ' +
        'which owns the default: route 0.0.0.0/1 and 128.0.0.0/1 via 10.0.1.254 on eth0 instead, ' +
        'or remove defaultRoutes.v4 from the state (PUT /v1/state) and unset GATEWAY_V4 to hand the default to eth0',
    );
    // Narrower routes and the other family's default are not the owned one.
    expect(run(s, (x) => addRoute(x, { cidr: '0.0.0.0/1', nexthop: '10.0.1.254' })).state.routes).toHaveLength(1);
    expect(run(s, (x) => addRoute(x, { cidr: '::/0', nexthop: 'fe80::1' })).state.routes).toEqual([{ cidr: '::/0', nexthop: 'fe80::1' }]);
  });

  it('::/0 is refused while GATEWAY_V6 owns the IPv6 default', () => {
    const e = conflict(() => addRoute(frozen({ defaultRoutes: { v6: gw.v6 } }), { cidr: '::/0', nexthop: 'fe80::1' }));
    expect(e.message).toContain('subnet route ::/0 via fe80::1 conflicts with the default route via fd00:20::1 dev net1 that eip-add installs from GATEWAY_V6');
    expect(e.message).toContain('route ::/1 and 8000::/1 via fe80::1 on eth0 instead');
    expect(e.message).toContain('remove defaultRoutes.v6 from the state (PUT /v1/state) and unset GATEWAY_V6');
  });

  it('without an external default the subnet route takes the default, as the script did', () => {
    const r = run(frozen({ defaultRoutes: { v6: gw.v6 } }), (x) => addRoute(x, { cidr: '0.0.0.0/0', nexthop: '10.0.1.254' }));
    expect(r.state.routes).toEqual([{ cidr: '0.0.0.0/0', nexthop: '10.0.1.254' }]);
  });

  it('either order ends with the external default owning it: eip-add after the route keeps the route (held), a route after eip-add is refused', () => {
    const route = { cidr: '0.0.0.0/0', nexthop: '10.0.1.254' };
    const eip = { address: '172.20.0.10', prefixLength: 24 };
    const routeFirst = run(run(base(), (x) => addRoute(x, route)).state, (x) => addEip(x, eip, { v4: gw.v4 })).state;
    expect(routeFirst.defaultRoutes).toEqual({ v4: gw.v4 });
    expect(routeFirst.routes).toEqual([route]);
    const eipFirst = run(base(), (x) => addEip(x, eip, { v4: gw.v4 })).state;
    conflict(() => addRoute(eipFirst, route));
    // The answer depends on the state alone: a re-send of the held route is refused too.
    conflict(() => addRoute(routeFirst, route));
    // And the held route goes as any other.
    expect(run(routeFirst, (x) => delRoute(x, '0.0.0.0/0')).state.routes).toEqual([]);
  });
});

describe('purity', () => {
  it('random sequences of operations never mutate a (deep-frozen) input and keep the invariants', () => {
    const rnd = prng(20240601);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)] as T;
    const eips = ['1.2.3.4', '1.2.3.5', '1.2.3.6'];
    const ips = ['10.0.1.6', '10.0.1.7'];
    const cidrs = ['10.0.0.0/16', '10.0.1.0/24', '10.0.2.0/24', '10.0.1.5/32', '10.0.0.0/20'];
    const ops: ((s: DesiredState) => OpResult)[] = [
      (s) => addEip(s, { address: pick(eips), prefixLength: pick([24, 16]) }, rnd() < 0.5 ? { v4: '1.2.3.1' } : {}),
      (s) => delEip(s, pick(eips)),
      (s) => addFip(s, { eip: pick(eips), internalIp: pick(ips) }),
      (s) => delFip(s, pick(eips)),
      (s) => addDnat(s, { eip: pick(eips), port: pick([80, 443]), protocol: pick(['tcp', 'udp'] as const), internalIp: pick(ips), internalPort: 80 }),
      (s) => delDnat(s, { eip: pick(eips), port: pick([80, 443]), protocol: pick(['tcp', 'udp'] as const) }),
      (s) => addSnat(s, snat(pick(eips), pick(cidrs), rnd() < 0.5)),
      (s) => delSnat(s, { eip: pick(eips), cidr: pick(cidrs) }),
      (s) => addShareDnat(s, { eip: pick(eips), port: 80, protocol: 'tcp', protocolText: 'tcp', backends: [{ ip: pick(ips), port: 80 }] }),
      (s) => delShareDnat(s, { eip: pick(eips), port: 80, protocol: 'tcp' }),
      (s) => addRoute(s, { cidr: pick(cidrs), nexthop: pick(ips) }),
      (s) => delRoute(s, pick(cidrs)),
    ];
    let s = deepFreeze(base());
    for (let i = 0; i < 2000; i++) {
      const before = clone(s);
      let r: OpResult;
      try {
        r = pick(ops)(s);
      } catch (e) {
        expect(e).toBeInstanceOf(ConflictError);
        expect(s).toEqual(before);
        continue;
      }
      expect(s).toEqual(before);
      s = deepFreeze(r.state);
      // Invariants: SNATs sorted by descending prefix, identities unique.
      const lens = s.snats.map((x) => Number(x.cidr.split('/')[1]));
      expect(lens).toEqual([...lens].sort((a, b) => b - a));
      expect(new Set(s.snats.map((x) => `${x.eip}|${x.cidr}`)).size).toBe(s.snats.length);
      expect(new Set(s.fips.map((x) => x.eip)).size).toBe(s.fips.length);
      expect(new Set(s.dnats.map((x) => `${x.eip}|${x.port}|${x.protocol}`)).size).toBe(s.dnats.length);
      expect(new Set(s.shareDnats.map((x) => `${x.eip}|${x.port}|${x.protocol}`)).size).toBe(s.shareDnats.length);
      expect(new Set(s.eips.map((x) => x.address)).size).toBe(s.eips.length);
      expect(new Set(s.routes.map((x) => x.cidr)).size).toBe(s.routes.length);
    }
  });
});
