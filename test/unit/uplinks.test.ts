/**
 * Several external interfaces (model/uplinks.ts, dataplane/linkUplinksPlan.ts and the pieces of
 * the link, netfilter and config layers that follow the EIP's uplink), without a kernel.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { resolveEipInterface, uplinkFor, eipInterface, eipUplinkOf, type Interfaces } from '../../src/model/uplinks.js';
import { allocateQos } from '../../src/state/qosOperations.js';
import { desiredDevices } from '../../src/dataplane/qos/render.js';
import {
  planUplinks,
  ownedRules,
  ownedRoutes,
  ruleText,
  routeText,
  nftMarksScript,
  iptMarksScript,
  UPLINK_TABLES,
} from '../../src/dataplane/linkUplinksPlan.js';
import { planLink, type LinkAddress, type LinkView } from '../../src/dataplane/linkPlan.js';
import { natTablesOf } from '../../src/dataplane/netfilter/backend.js';
import { desiredTables } from '../../src/dataplane/netfilter/iptables/plan.js';
import { snatSpecs } from '../../src/dataplane/netfilter/iptables/ruleText.js';
import { emptyState, type DesiredState } from '../../src/state/state.js';
import { addEip } from '../../src/state/operations.js';
import { loadConfig } from '../../src/config/config.js';
import { ValidationError } from '../../src/model/errors.js';

const TWO: DesiredState['interfaces'] = { vpc: 'eth0', ext: 'net1', secondary: [{ name: 'net2', gateway: '172.21.0.1' }] };

function state(patch: Partial<DesiredState> = {}): DesiredState {
  return { ...emptyState('eth0', 'net1'), initialized: true, interfaces: TWO, ...patch };
}

const addr = (address: string, prefixLength: number, dev?: string): LinkAddress => ({
  address,
  prefixLength,
  family: 4,
  scope: 'global',
  ...(dev ? { dev } : {}),
});

describe('which uplink an EIP lives on', () => {
  const nets = [
    { dev: 'net1', cidr: '172.20.0.5/24' },
    { dev: 'net2', cidr: '172.21.0.2/24' },
    { dev: 'net2', cidr: '172.20.0.0/16' },
  ];

  it('the longest connected prefix among the uplinks, as `ip route get` would answer', () => {
    expect(uplinkFor('172.20.0.10', ['net1', 'net2'], nets)).toBe('net1');
    expect(uplinkFor('172.20.9.10', ['net1', 'net2'], nets)).toBe('net2');
    expect(uplinkFor('172.21.0.10', ['net1', 'net2'], nets)).toBe('net2');
    expect(uplinkFor('10.9.9.9', ['net1', 'net2'], nets)).toBeUndefined();
    // A network of another interface is no uplink's.
    expect(uplinkFor('10.0.1.5', ['net1', 'net2'], [{ dev: 'eth0', cidr: '10.0.1.1/24' }])).toBeUndefined();
    // A tie goes to the earlier uplink.
    expect(
      uplinkFor(
        '172.22.0.1',
        ['net1', 'net2'],
        [
          { dev: 'net2', cidr: '172.22.0.0/24' },
          { dev: 'net1', cidr: '172.22.0.9/24' },
        ],
      ),
    ).toBe('net1');
  });

  it('with one external interface the EIP is taken as given', () => {
    const one: Interfaces = { vpc: 'eth0', ext: 'net1' };
    const eip = { address: '9.9.9.9', prefixLength: 24 };
    expect(resolveEipInterface(one, eip, undefined, [])).toBe(eip);
    expect(eipInterface(one, { interface: 'net2' })).toBe('net1');
  });

  it('explicit, then held, then connected network, then the gateway in its network; else a typed error', () => {
    const eip: { address: string; prefixLength: number; interface?: string } = { address: '172.21.0.10', prefixLength: 24 };
    expect(resolveEipInterface(TWO, { ...eip, interface: 'net1' }, undefined, nets).interface).toBe('net1');
    expect(resolveEipInterface(TWO, eip, { interface: 'net1' }, nets).interface).toBe('net1');
    expect(resolveEipInterface(TWO, eip, undefined, nets).interface).toBe('net2');
    // No address on either uplink: the uplink whose gateway lies in the EIP's network.
    const gws = [
      { dev: 'net1', gateway: '172.20.0.1' },
      { dev: 'net2', gateway: '172.21.0.1' },
    ];
    expect(resolveEipInterface(TWO, eip, undefined, [], gws).interface).toBe('net2');
    expect(resolveEipInterface(TWO, { ...eip, address: '172.20.0.10' }, undefined, [], gws).interface).toBe('net1');
    const none = () => resolveEipInterface(TWO, { address: '10.9.9.9', prefixLength: 24 }, undefined, nets, gws);
    expect(none).toThrow(ValidationError);
    expect(none).toThrow(/^Error: EIP 10\.9\.9\.9\/24 is in no network of the external interfaces \(net1, net2\)/);
    expect(() => resolveEipInterface(TWO, { ...eip, interface: 'net7' }, undefined, nets)).toThrow(
      /interface 'net7' of EIP 172\.21\.0\.10 is not an external interface/,
    );
  });

  it('eip-add keeps the decision in the state; a re-add that moves it is an update', () => {
    const s = state({ defaultRoutes: {} });
    const r = addEip(s, { address: '172.21.0.10', prefixLength: 24 }, { v4: '172.20.0.1' });
    expect(r.state.eips).toEqual([{ address: '172.21.0.10', prefixLength: 24, interface: 'net2' }]);
    expect(addEip(r.state, { address: '172.21.0.10', prefixLength: 24 }, {}).effects).toEqual([]);
    const moved = addEip(r.state, { address: '172.21.0.10', prefixLength: 24, interface: 'net1' }, {});
    expect(moved.state.eips[0]?.interface).toBe('net1');
    expect(moved.effects).toEqual([{ kind: 'garp', ip: '172.21.0.10' }]);
  });
});

describe('addresses on each uplink (link.ts)', () => {
  const eipA = { address: '172.20.0.10', prefixLength: 24, interface: 'net1' };
  const eipB = { address: '172.21.0.10', prefixLength: 24, interface: 'net2' };
  const withNet2 = (addrs: LinkAddress[]): LinkView => ({ extAddresses: addrs, vpcRoutes: [], extDefaults: [], devices: new Set(['net2']) });

  it('each EIP goes up on its own interface', () => {
    expect(planLink(withNet2([]), state({ eips: [eipA, eipB] }), undefined)).toEqual([
      'addr replace 172.20.0.10/24 dev net1',
      'addr replace 172.21.0.10/24 dev net2',
    ]);
    expect(planLink(withNet2([addr('172.20.0.10', 24), addr('172.21.0.10', 24, 'net2')]), state({ eips: [eipA, eipB] }), undefined)).toEqual([]);
  });

  it('an EIP that moved goes up on its new interface before it leaves the old one', () => {
    const have = withNet2([addr('172.21.0.10', 24)]);
    expect(planLink(have, state({ eips: [eipB] }), undefined)).toEqual(['addr replace 172.21.0.10/24 dev net2', 'addr del 172.21.0.10/24 dev net1']);
  });

  it('back to one interface: an EIP of the dropped uplink goes up on the primary and leaves the dropped one', () => {
    const one = state({ interfaces: { vpc: 'eth0', ext: 'net1' }, eips: [eipB] });
    expect(planLink(withNet2([addr('172.21.0.10', 24, 'net2')]), one, state({ eips: [eipB] }))).toEqual([
      'addr replace 172.21.0.10/24 dev net1',
      'addr del 172.21.0.10/24 dev net2',
    ]);
  });

  it('a deleted EIP leaves whichever uplink holds it; a gone uplink holds its EIPs back without failing the rest', () => {
    expect(planLink(withNet2([addr('172.21.0.10', 24, 'net2')]), state(), state({ eips: [eipB] }))).toEqual(['addr del 172.21.0.10/24 dev net2']);
    const gone: LinkView = { extAddresses: [], vpcRoutes: [], extDefaults: [], devices: new Set() };
    expect(planLink(gone, state({ eips: [eipA, eipB] }), undefined)).toEqual(['addr replace 172.20.0.10/24 dev net1']);
  });
});

describe('NAT rules follow the EIP’s uplink', () => {
  const s = state({
    eips: [
      { address: '172.20.0.10', prefixLength: 24, interface: 'net1' },
      { address: '172.21.0.10', prefixLength: 24, interface: 'net2' },
    ],
    snats: [
      { eip: '172.21.0.10', cidr: '10.0.1.7/32', randomFully: false },
      { eip: '172.20.0.10', cidr: '10.0.1.0/24', randomFully: false },
    ],
  });

  it('iptables: each SNAT rule matches its EIP’s interface', () => {
    const t = natTablesOf(s);
    expect(t.uplinks).toEqual(['net2']);
    expect(desiredTables(t).nat.owned.get('SHARED_SNAT')).toEqual([
      '-s 10.0.1.7/32 -o net2 -j SNAT --to-source 172.21.0.10',
      '-s 10.0.1.0/24 -o net1 -j SNAT --to-source 172.20.0.10',
    ]);
    const pool = { eip: '172.20.0.10', cidr: '10.0.2.0/24', randomFully: false, eips: ['172.20.0.10', '172.21.0.10'] };
    expect(snatSpecs(pool, 'net1', t.eipIf).map((l) => l.split(' -o ')[1]?.split(' ')[0])).toEqual(['net1', 'net2']);
  });

  it('one external interface: natTablesOf and the rules are as before', () => {
    const one = { ...s, interfaces: { vpc: 'eth0', ext: 'net1' } };
    const t = natTablesOf(one);
    expect('uplinks' in t || 'eipIf' in t).toBe(false);
    expect(desiredTables(t).nat.owned.get('SHARED_SNAT')).toEqual([
      '-s 10.0.1.7/32 -o net1 -j SNAT --to-source 172.21.0.10',
      '-s 10.0.1.0/24 -o net1 -j SNAT --to-source 172.20.0.10',
    ]);
  });
});

describe('policy routing of secondary uplinks (linkUplinksPlan.ts)', () => {
  const s = state({
    eips: [
      { address: '172.20.0.10', prefixLength: 24, interface: 'net1' },
      { address: '172.21.0.10', prefixLength: 24, interface: 'net2' },
    ],
    snats: [
      { eip: '172.20.0.10', cidr: '10.0.1.6/32', randomFully: false },
      { eip: '172.20.0.10', cidr: '10.0.9.0/24', randomFully: false },
      { eip: '172.21.0.10', cidr: '10.0.1.0/24', randomFully: false },
    ],
    fips: [{ eip: '172.21.0.10', internalIp: '10.0.3.3' }],
  });

  it('nothing with one external interface or before init', () => {
    expect(planUplinks({ ...s, interfaces: { vpc: 'eth0', ext: 'net1' } }).rules).toEqual([]);
    expect(planUplinks({ ...s, initialized: false }).marks).toEqual([]);
  });

  it('marks, EIP sources, VPC sources longest first (a covered primary source kept on main), a table per secondary', () => {
    const p = planUplinks(s);
    expect(p.rules.map(ruleText)).toEqual([
      'pref 7200 from all fwmark 0x10000/0xff0000 lookup main',
      'pref 7201 from all fwmark 0x20000/0xff0000 lookup main suppress_prefixlength 0',
      'pref 7202 from all fwmark 0x20000/0xff0000 lookup 7101',
      'pref 7300 from 172.21.0.10 lookup main suppress_prefixlength 0',
      'pref 7301 from 172.21.0.10 lookup 7101',
      // 10.0.1.6 is inside net2's 10.0.1.0/24 and NATed on net1: it keeps the main table.
      'pref 7400 from 10.0.1.6 iif eth0 lookup main',
      'pref 7425 from 10.0.1.0/24 iif eth0 lookup main suppress_prefixlength 0',
      'pref 7426 from 10.0.1.0/24 iif eth0 lookup 7101',
      'pref 7401 from 10.0.3.3 iif eth0 lookup main suppress_prefixlength 0',
      'pref 7402 from 10.0.3.3 iif eth0 lookup 7101',
    ]);
    expect(p.routes.map(routeText)).toEqual(['default via 172.21.0.1 dev net2 onlink table 7101', 'unreachable default metric 4278198272 table 7101']);
    expect(p.marks).toEqual([
      { dev: 'net1', mark: 0x10000 },
      { dev: 'net2', mark: 0x20000 },
    ]);
  });

  it('without a gateway the secondary table holds only its unreachable default', () => {
    const p = planUplinks({ ...s, interfaces: { vpc: 'eth0', ext: 'net1', secondary: [{ name: 'net2' }] } });
    expect(p.routes.map(routeText)).toEqual(['unreachable default metric 4278198272 table 7101']);
  });

  it('reads back its own rules and routes in the same spelling (so a steady gateway is quiet)', () => {
    const rules = JSON.stringify([
      { priority: 0, src: 'all', table: 'local' },
      { priority: 7200, src: 'all', fwmark: '0x10000', fwmask: '0xff0000', table: 'main' },
      { priority: 7201, src: 'all', fwmark: '0x20000', fwmask: '0xff0000', table: 'main', suppress_prefixlen: 0 },
      { priority: 7301, src: '172.21.0.10', table: '7101' },
      { priority: 7426, src: '10.0.1.0', srclen: 24, iif: 'eth0', iif_detached: null, table: '7101' },
      { priority: 7450, src: 'all', fwmark: '0x5', table: 'main' },
      { priority: 32766, src: 'all', table: 'main' },
    ]);
    expect(ownedRules(rules)).toEqual([
      'pref 7200 from all fwmark 0x10000/0xff0000 lookup main',
      'pref 7201 from all fwmark 0x20000/0xff0000 lookup main suppress_prefixlength 0',
      'pref 7301 from 172.21.0.10 lookup 7101',
      'pref 7426 from 10.0.1.0/24 iif eth0 lookup 7101',
      'pref 7450 from all fwmark 0x5/0xffffffff lookup main',
    ]);
    const lines = UPLINK_TABLES.map(() => '[]');
    lines[0] = JSON.stringify([
      { dst: 'default', gateway: '172.21.0.1', dev: 'net2', flags: ['onlink'] },
      { type: 'unreachable', dst: 'default', flags: [], metric: 4278198272 },
      { dst: '192.0.2.0/24', gateway: '172.21.0.9', dev: 'net2', flags: [] },
    ]);
    expect(ownedRoutes(lines).map(routeText)).toEqual([
      'default via 172.21.0.1 dev net2 onlink table 7101',
      'unreachable default metric 4278198272 table 7101',
      '192.0.2.0/24 table 7101',
    ]);
  });

  it('connection marks: set on the first packet in by each uplink, restored on the VPC side', () => {
    const p = planUplinks(s);
    expect(nftMarksScript(p)).toContain('iifname "net2" ct state new ct mark set ct mark and 0xff00ffff or 0x20000');
    expect(nftMarksScript(p)).toContain('iifname "eth0" ct mark and 0xff0000 != 0 meta mark set ct mark and 0xff0000');
    expect(iptMarksScript(p, false, false).split('\n')).toEqual([
      '*mangle',
      ':NATGW_UPLINKS - [0:0]',
      '-A NATGW_UPLINKS -i net1 -m conntrack --ctstate NEW -j CONNMARK --set-xmark 0x10000/0xff0000',
      '-A NATGW_UPLINKS -i net2 -m conntrack --ctstate NEW -j CONNMARK --set-xmark 0x20000/0xff0000',
      '-A NATGW_UPLINKS -i eth0 -j CONNMARK --restore-mark --nfmask 0xff0000 --ctmask 0xff0000',
      '-I PREROUTING 1 -j NATGW_UPLINKS',
      'COMMIT',
      '',
    ]);
    expect(iptMarksScript(planUplinks(state({ interfaces: { vpc: 'eth0', ext: 'net1' } })), true, true)).toBe(
      '*mangle\n-D PREROUTING -j NATGW_UPLINKS\n:NATGW_UPLINKS - [0:0]\n-X NATGW_UPLINKS\nCOMMIT\n',
    );
  });
});

describe('QoS follows the EIP’s uplink', () => {
  it("each EIP rule shapes its own interface, an ingress one that interface's IFB", () => {
    const s = state({
      eips: [
        { address: '172.20.0.10', prefixLength: 24, interface: 'net1' },
        { address: '172.21.0.10', prefixLength: 24, interface: 'net2' },
      ],
      eipQos: [
        { direction: 'egress', ip: '172.20.0.10', priority: 1, rate: '10', burst: '1' },
        { direction: 'egress', ip: '172.21.0.10', priority: 1, rate: '10', burst: '1' },
        { direction: 'ingress', ip: '172.21.0.10', priority: 1, rate: '10', burst: '1' },
      ],
    });
    const allocated = allocateQos(s);
    const devs = desiredDevices(eipUplinkOf(s), allocated.eipQos, allocated.qos);
    expect([...devs.keys()].sort()).toEqual(['ifb-net2', 'net1', 'net2']);
    expect(devs.get('ifb-net2')?.ingressOf).toBe('net2');
    // One external interface: every EIP rule on it, as before.
    const one = { ...s, interfaces: { vpc: 'eth0', ext: 'net1' } };
    expect([...desiredDevices(eipUplinkOf(one), allocateQos(one).eipQos, []).keys()].sort()).toEqual(['ifb-net1', 'net1']);
  });
});

describe('configuration', () => {
  it('EXTERNAL_INTERFACE may list the uplinks; NATGW_UPLINK_GATEWAYS names their next hops', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'natgw-uplinks-'));
    try {
      const file = path.join(dir, 'nat-gateway.env');
      writeFileSync(file, 'EXTERNAL_INTERFACE=net1, net2\nNATGW_UPLINK_GATEWAYS=net2=172.21.0.1\n');
      const c = await loadConfig({ NATGW_ENV_FILE: file, NATGW_STATE_DIR: dir });
      expect({ ext: c.extInterface, more: c.secondaryExtInterfaces, gws: c.uplinkGateways }).toEqual({
        ext: 'net1',
        more: ['net2'],
        gws: { net2: '172.21.0.1' },
      });
      writeFileSync(file, 'NATGW_UPLINK_GATEWAYS=net2:172.21.0.1\n');
      await expect(loadConfig({ NATGW_ENV_FILE: file, NATGW_STATE_DIR: dir })).rejects.toThrow(/NATGW_UPLINK_GATEWAYS: must be a comma-separated list/);
      writeFileSync(file, 'EXTERNAL_INTERFACE=net1,net;2\n');
      await expect(loadConfig({ NATGW_ENV_FILE: file, NATGW_STATE_DIR: dir })).rejects.toThrow(/EXTERNAL_INTERFACE/);
      writeFileSync(file, 'EXTERNAL_INTERFACE=net1\n');
      const one = await loadConfig({ NATGW_ENV_FILE: file, NATGW_STATE_DIR: dir });
      expect('secondaryExtInterfaces' in one || 'uplinkGateways' in one).toBe(false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
