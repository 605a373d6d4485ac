import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { LbSvcInputError, parseCommand } from '../../src/lbsvc/parse.js';
import { type Dnat, eipAddBatch, initBatch, type NatView, planDnatAdd, planDnatDel, undoRouteBatch } from '../../src/lbsvc/plan.js';
import { renderIptables, renderNft } from '../../src/lbsvc/render.js';
import { parseIptablesNat, parseNftTable, parseRoutes } from '../../src/lbsvc/view.js';

/** The LoadBalancer-service commands' parser, planner and renderers, without a kernel. */

const errorsOf = (f: () => unknown): readonly string[] => {
  try {
    f();
  } catch (e) {
    if (e instanceof LbSvcInputError) return e.lines;
    throw e;
  }
  throw new Error('no error');
};

const D = (eip: string, port: number, internalIp: string, internalPort = 8080, protocol: Dnat['protocol'] = 'tcp'): Dnat => ({
  eip,
  port,
  protocol,
  internalIp,
  internalPort,
});
const add = (d: Dnat, defaultGateway = '10.0.1.254') => ({ ...d, defaultGateway });
const view = (dnats: Dnat[], masquerades: string[] = []): NatView => ({ dnats, masquerades });

describe('lb-svc parser', () => {
  it('types each rule: protocol in any case, a prefix on a DNAT EIP dropped, arguments split on whitespace', () => {
    expect(parseCommand('dnat-add', ['1.2.3.4/24,80,TCP,10.96.0.10,8080,10.16.0.1 1.2.3.4,53,udp,10.96.0.10,53,10.16.0.1'])).toEqual({
      name: 'dnat-add',
      rules: [
        { eip: '1.2.3.4', port: 80, protocol: 'tcp', internalIp: '10.96.0.10', internalPort: 8080, defaultGateway: '10.16.0.1' },
        { eip: '1.2.3.4', port: 53, protocol: 'udp', internalIp: '10.96.0.10', internalPort: 53, defaultGateway: '10.16.0.1' },
      ],
    });
    expect(parseCommand('eip-add', ['172.20.0.10/24,172.20.0.1'])).toEqual({
      name: 'eip-add',
      rules: [{ eip: { address: '172.20.0.10', prefix: 24, network: '172.20.0.0' }, gateway: '172.20.0.1' }],
    });
    // dnat-del takes dnat-add's form too (the gateway is not needed).
    expect(parseCommand('dnat-del', ['1.2.3.4,80,sctp,10.96.0.10,80', '1.2.3.4,81,tcp,10.96.0.10,81,10.16.0.1'])).toMatchObject({
      rules: [{ protocol: 'sctp' }, { port: 81 }],
    });
    expect(parseCommand('init', ['ignored'])).toEqual({ name: 'init' });
    expect(parseCommand('dnat-add', [])).toEqual({ name: 'dnat-add', rules: [] });
  });

  it('reports every bad field of every rule at once, control characters escaped', () => {
    expect(errorsOf(() => parseCommand('dnat-add', ['1.2.3.4,0,icmp,10.0.0.01,8080,g', '1,2', 'a\u0007,1,tcp,1.1.1.1,1,1.1.1.1']))).toEqual([
      "Error: invalid port in dnat-add rule '1.2.3.4,0,icmp,10.0.0.01,8080,g': '0' is not a port from 1 to 65535",
      "Error: invalid protocol in dnat-add rule '1.2.3.4,0,icmp,10.0.0.01,8080,g': 'icmp' is not tcp, udp or sctp",
      "Error: invalid internalIp in dnat-add rule '1.2.3.4,0,icmp,10.0.0.01,8080,g': '10.0.0.01' is not a dotted IPv4 address",
      "Error: invalid defaultGateway in dnat-add rule '1.2.3.4,0,icmp,10.0.0.01,8080,g': 'g' is not a dotted IPv4 address",
      "Error: invalid dnat-add rule '1,2': expected eip,port,protocol,internalIp,internalPort,defaultGateway",
      "Error: invalid eip in dnat-add rule 'a\\x07,1,tcp,1.1.1.1,1,1.1.1.1': 'a\\x07' is not a dotted IPv4 address",
    ]);
  });

  it('an EIP needs its prefix and a gateway inside its network', () => {
    expect(errorsOf(() => parseCommand('eip-add', ['172.20.0.10/0,172.20.0.1', '172.20.0.10/24,172.21.0.1', '172.20.0.10/24,172.20.0.10']))).toEqual([
      "Error: invalid eip in eip-add rule '172.20.0.10/0,172.20.0.1': '172.20.0.10/0' is not an IPv4 address with a prefix length from 1 to 32 (e.g. 172.20.0.10/24)",
      "Error: invalid gateway in eip-add rule '172.20.0.10/24,172.21.0.1': '172.21.0.1' must be another address inside the EIP network",
      "Error: invalid gateway in eip-add rule '172.20.0.10/24,172.20.0.10': '172.20.0.10' must be another address inside the EIP network",
    ]);
  });
});

describe('lb-svc planner', () => {
  const a = D('1.2.3.4', 80, '10.96.0.10');

  it('adds a DNAT, its MASQUERADE and route once; nothing when all are there', () => {
    const first = planDnatAdd(view([]), new Map(), [add(a), add(a)]);
    expect(first).toEqual({
      nat: { delDnat: [], addDnat: [a], delMasq: [], addMasq: ['10.96.0.10'] },
      routes: [{ dest: '10.96.0.10', via: '10.0.1.254' }],
      delRoutes: [],
    });
    const again = planDnatAdd(view([a], ['10.96.0.10']), new Map([['10.96.0.10', '10.0.1.254']]), [add(a)]);
    expect(again).toEqual({ nat: { delDnat: [], addDnat: [], delMasq: [], addMasq: [] }, routes: [], delRoutes: [] });
  });

  it('removes copies the script left, and replaces another target, releasing what only it used', () => {
    const old = D('1.2.3.4', 80, '10.96.0.9');
    const p = planDnatAdd(view([a, a, old], ['10.96.0.10', '10.96.0.10', '10.96.0.9']), new Map([['10.96.0.9', '10.0.1.254']]), [add(a)]);
    expect(p.nat).toEqual({ delDnat: [a, old], addDnat: [], delMasq: ['10.96.0.9', '10.96.0.10'], addMasq: [] });
    expect(p.delRoutes).toEqual(['10.96.0.9']);
    expect(p.routes).toEqual([{ dest: '10.96.0.10', via: '10.0.1.254' }]);
  });

  it('deletes the named DNAT only; a MASQUERADE and route go with the last DNAT to their address, also on a retry', () => {
    const b = D('1.2.3.4', 443, '10.96.0.10', 8443);
    const routes = new Map([['10.96.0.10', '10.0.1.254']]);
    expect(planDnatDel(view([a, b], ['10.96.0.10']), routes, [a])).toEqual({
      nat: { delDnat: [a], addDnat: [], delMasq: [], addMasq: [] },
      routes: [],
      delRoutes: [],
    });
    expect(planDnatDel(view([a], ['10.96.0.10']), routes, [a]).nat.delMasq).toEqual(['10.96.0.10']);
    // The DNAT went on an earlier try; its MASQUERADE and route did not.
    expect(planDnatDel(view([], ['10.96.0.10']), routes, [a])).toEqual({
      nat: { delDnat: [], addDnat: [], delMasq: ['10.96.0.10'], addMasq: [] },
      routes: [],
      delRoutes: ['10.96.0.10'],
    });
    // Another target at the same identity is not this rule's.
    expect(planDnatDel(view([D('1.2.3.4', 80, '10.96.0.11')], ['10.96.0.11']), new Map(), [a]).nat.delDnat).toEqual([]);
  });

  it('init: ARP off only while net1 has no address; each ip rule once', () => {
    expect(initBatch('net1', 'eth0', { up: false, arp: true, hasIpv4: false }, new Set())).toEqual([
      'link set dev net1 up',
      'link set dev net1 arp off',
      'rule add iif net1 table 100',
      'rule add iif eth0 table 100',
    ]);
    expect(initBatch('net1', 'eth0', { up: true, arp: true, hasIpv4: true }, new Set(['net1', 'eth0']))).toEqual([]);
  });

  it('eip-add and the route rollback', () => {
    const command = parseCommand('eip-add', ['172.20.0.10/24,172.20.0.1']);
    if (command.name !== 'eip-add') throw new Error('not eip-add');
    const [rule] = command.rules;
    expect(eipAddBatch('net1', [rule!])).toEqual([
      'address replace 172.20.0.10/24 dev net1',
      'route replace 172.20.0.0/24 dev net1 table 100',
      'route replace default via 172.20.0.1 dev net1 table 100',
      'link set dev net1 arp on',
    ]);
    expect(
      undoRouteBatch(new Map([['10.0.0.2', '10.0.1.1']]), [
        { dest: '10.0.0.1', via: 'x' },
        { dest: '10.0.0.2', via: 'y' },
      ]),
    ).toEqual(['route del 10.0.0.1/32 table 100', 'route replace 10.0.0.2/32 via 10.0.1.1 table 100']);
  });
});

describe('lb-svc renderers and readers', () => {
  const a = D('1.2.3.4', 80, '10.96.0.10');
  const old = D('1.2.3.4', 80, '10.96.0.9', 9090, 'tcp');

  it('iptables: the script layout, round-tripped through iptables-save', () => {
    const script = renderIptables({ delDnat: [old], addDnat: [a], delMasq: ['10.96.0.9'], addMasq: ['10.96.0.10'] });
    expect(script).toBe(
      [
        '*nat',
        '-D PREROUTING -d 1.2.3.4/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.96.0.9:9090',
        '-D POSTROUTING -d 10.96.0.9/32 -j MASQUERADE',
        '-I POSTROUTING -d 10.96.0.10/32 -j MASQUERADE',
        '-A PREROUTING -d 1.2.3.4/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.96.0.10:8080',
        'COMMIT',
        '',
      ].join('\n'),
    );
    const save = [
      '*nat',
      ':PREROUTING ACCEPT [0:0]',
      '-A PREROUTING -d 1.2.3.4/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.96.0.10:8080',
      '-A PREROUTING -d 1.2.3.4/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.96.0.10:53',
      // Not of the script's form: someone else's.
      '-A PREROUTING -d 1.2.3.4/32 -i eth9 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.9.9.9:80',
      '-A POSTROUTING -d 10.96.0.10/32 -j MASQUERADE',
      '-A POSTROUTING -o net1 -j MASQUERADE',
      'COMMIT',
    ].join('\n');
    expect(parseIptablesNat(save)).toEqual({ dnats: [a, D('1.2.3.4', 53, '10.96.0.10', 53, 'udp')], masquerades: ['10.96.0.10'] });
  });

  it('nftables: the skeleton in every transaction, element changes after it; the JSON listing read back', () => {
    const script = renderNft({ delDnat: [old], addDnat: [a], delMasq: [], addMasq: ['10.96.0.10'] });
    expect(script).toContain('add table ip natgw_lbsvc\n');
    expect(script).toContain('flush chain ip natgw_lbsvc prerouting\n');
    expect(
      script.endsWith(
        [
          'delete element ip natgw_lbsvc lb_dnat { 1.2.3.4 . tcp . 80 }',
          'add element ip natgw_lbsvc lb_masq { 10.96.0.10 }',
          'add element ip natgw_lbsvc lb_dnat { 1.2.3.4 . tcp . 80 : 10.96.0.10 . 8080 }',
          '',
        ].join('\n'),
      ),
    ).toBe(true);
    // nft 1.0.6's listing of such a table.
    const json = JSON.stringify({
      nftables: [
        { metainfo: { version: '1.0.6' } },
        { table: { family: 'ip', name: 'natgw_lbsvc' } },
        { map: { name: 'lb_dnat', elem: [[{ concat: ['1.2.3.4', 'tcp', 80] }, { concat: ['10.96.0.10', 8080] }]] } },
        { set: { name: 'lb_masq', elem: ['10.96.0.10'] } },
        { chain: { name: 'prerouting', hook: 'prerouting' } },
        { chain: { name: 'postrouting', hook: 'postrouting' } },
        { rule: { chain: 'prerouting', expr: [] } },
        { rule: { chain: 'postrouting', expr: [] } },
      ],
    });
    expect(parseNftTable(json)).toEqual({ dnats: [a], masquerades: ['10.96.0.10'], intact: true });
    expect(parseNftTable(JSON.stringify({ nftables: [{ set: { name: 'lb_masq' } }] })).intact).toBe(false);
  });

  it('routes: host routes of table 100 only', () => {
    const json = JSON.stringify([
      { dst: 'default', gateway: '172.20.0.1', dev: 'net1', table: '100' },
      { dst: '10.96.0.10', gateway: '10.0.1.254', dev: 'eth0', table: '100' },
      { dst: '10.96.0.11', gateway: '10.0.1.254', dev: 'eth0' },
      { dst: '172.20.0.0/24', dev: 'net1', table: '100' },
    ]);
    expect(parseRoutes(json)).toEqual(new Map([['10.96.0.10', '10.0.1.254']]));
  });
});

describe('lb-svc in the image', () => {
  it('ships the shim where Kube-OVN runs it, and the shim only execs natgw lb-svc', () => {
    const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
    expect(readFileSync(join(root, 'image', 'Dockerfile'), 'utf8')).toMatch(/^COPY image\/lb-svc\.sh \/kube-ovn\/lb-svc\.sh$/m);
    const shim = readFileSync(join(root, 'image', 'lb-svc.sh'), 'utf8');
    expect(shim.startsWith('#!/usr/bin/env bash\n')).toBe(true);
    expect(shim).toMatch(/^exec node "\$entry" lb-svc "\$@"$/m);
  });
});
