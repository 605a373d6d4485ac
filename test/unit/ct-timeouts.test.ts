/**
 * Connection timeouts, the pure parts and the thin layer over fakes: the configuration's
 * checks, the selection of translated flows, the nftables and iptables renderings with their
 * diffs against a read-back, and the degrade path where the tools cannot hold policies. Real
 * flows on every backend: test/netns/ct-timeouts.test.ts.
 */
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config/config.js';
import {
  compareLine,
  iptCtFamily,
  nftCtTable,
  objectName,
  parseIptCt,
  parseNfctList,
  parseNftCt,
  planIptCt,
  planNftCt,
  selectorsOf,
  timeoutObjects,
  type NftCtHave,
} from '../../src/dataplane/ctTimeoutsRender.js';
import { CtTimeouts } from '../../src/dataplane/ctTimeouts.js';
import type { NftClient } from '../../src/dataplane/netfilter/nft/client.js';
import type { Executor } from '../../src/system/exec.js';
import { desiredStateSchema } from '../../src/state/state.js';
import { resultOf } from '../helpers/execCalls.js';

const EIP = '172.20.0.10';
const state = desiredStateSchema.parse({
  initialized: true,
  interfaces: { vpc: 'eth0', ext: 'net1' },
  eips: [{ address: EIP, prefixLength: 24 }],
  snats: [
    { eip: EIP, cidr: '10.0.1.0/24' },
    { eip: EIP, cidr: '10.0.1.6/32' },
    { eip: 'fd00:20::10', cidr: 'fd00:1::/64' },
  ],
  dnats: [
    { eip: EIP, port: 8080, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 },
    { eip: EIP, port: 9000, portEnd: 9010, protocol: 'udp', internalIp: '10.0.1.7', internalPort: 9000 },
  ],
  fips: [{ eip: '172.20.0.11', internalIp: '10.0.2.5' }],
});
const policy = { tcpEstablished: 1200, tcpTransitory: 30, tcpTimeWait: 120, udp: 30 };

describe('the configuration', () => {
  const load = (env: Record<string, string>) => loadConfig({ NATGW_ENV_FILE: '/nonexistent/natgw.env', ...env });

  it('reads whole seconds in any duration unit, and nothing when unset or empty', async () => {
    const c = await load({ NATGW_CT_TIMEOUT_TCP_ESTABLISHED: '20m', NATGW_CT_TIMEOUT_UDP: '30', NATGW_CT_TIMEOUT_TCP_TIME_WAIT: '' });
    expect(c.ctTimeouts).toEqual({ tcpEstablished: 1200, udp: 30 });
    expect((await load({})).ctTimeouts).toEqual({});
  });

  it('refuses fractions of a second, zero, too long and garbage, naming the key', async () => {
    await expect(load({ NATGW_CT_TIMEOUT_UDP: '500ms' })).rejects.toThrow(/NATGW_CT_TIMEOUT_UDP: must be whole seconds such as 30s, 20m or 1h, got 500ms/);
    await expect(load({ NATGW_CT_TIMEOUT_UDP: '0s' })).rejects.toThrow(/NATGW_CT_TIMEOUT_UDP: must be between 1s and 720h \(30 days\), got 0s/);
    await expect(load({ NATGW_CT_TIMEOUT_TCP_ESTABLISHED: '721h' })).rejects.toThrow(/NATGW_CT_TIMEOUT_TCP_ESTABLISHED: must be between 1s and 720h/);
    await expect(load({ NATGW_CT_TIMEOUT_TCP_TRANSITORY: 'soon' })).rejects.toThrow(/NATGW_CT_TIMEOUT_TCP_TRANSITORY: must be whole seconds/);
  });
});

describe('what natgw translates', () => {
  it('selects DNAT and FIP destinations and the outermost SNAT and FIP sources, per family', () => {
    expect(selectorsOf(state, 4)).toEqual({
      dst: [{ addr: EIP, protocol: 'tcp', ports: [8080, 8080] }, { addr: EIP, protocol: 'udp', ports: [9000, 9010] }, { addr: '172.20.0.11' }],
      // 10.0.1.6/32 lies inside 10.0.1.0/24: an interval set refuses the overlap.
      src: ['10.0.1.0/24', '10.0.2.5/32'],
    });
    expect(selectorsOf(state, 6)).toEqual({ dst: [], src: ['fd00:1::/64'] });
    expect(selectorsOf({ ...state, initialized: false }, 4)).toEqual({ dst: [], src: [] });
  });

  it('names each policy by its values, so a changed setting is a new object', () => {
    const [tcp, udp] = timeoutObjects(policy);
    expect(tcp?.policy).toEqual([
      ['syn_sent', 30],
      ['syn_recv', 30],
      ['established', 1200],
      ['fin_wait', 30],
      ['close_wait', 30],
      ['last_ack', 30],
      ['close', 30],
      ['time_wait', 120],
    ]);
    expect(udp?.policy).toEqual([
      ['unreplied', 30],
      ['replied', 30],
    ]);
    const other = timeoutObjects({ ...policy, tcpEstablished: 600 })[0];
    expect(objectName(tcp!, 'natgw_4_')).toMatch(/^natgw_4_tcp_[0-9a-f]{8}$/);
    expect(objectName(other!, '')).not.toBe(objectName(tcp!, ''));
    expect(timeoutObjects({ udp: 5 }).map((o) => o.protocol)).toEqual(['udp']);
  });
});

describe('nftables', () => {
  const want = nftCtTable(state, policy);
  const held = (): NftCtHave => ({
    objects: new Set(want.objects.keys()),
    sets: new Map(Object.entries(want.sets).map(([k, v]) => [k, new Set(v)])),
    chains: new Map(Object.entries(want.chains).map(([k, rules]) => [k, rules.map((r) => r.id)])),
    declaredRight: true,
  });

  it('creates the whole table: objects, interval sets, the chain after conntrack', () => {
    const script = planNftCt(want, null);
    expect(script).toContain('add table inet natgw_ct\n');
    expect(script).toMatch(/ct timeout tcp_[0-9a-f]{8} \{\n\t\tprotocol tcp; l3proto ip; policy = \{ syn_sent: 30, syn_recv: 30, established: 1200,/);
    expect(script).toContain(
      `add element inet natgw_ct dst4 { ${EIP} . tcp . 8080, ${EIP} . udp . 9000-9010, 172.20.0.11 . tcp . 0-65535, 172.20.0.11 . udp . 0-65535 }`,
    );
    expect(script).toContain('add element inet natgw_ct src4 { 10.0.1.0/24, 10.0.2.5 }');
    expect(script).toContain('add chain inet natgw_ct prerouting { type filter hook prerouting priority -190; policy accept; }');
    expect(script).toContain('add rule inet natgw_ct prerouting iifname "eth0" ip saddr @src4 fib daddr type != local goto set_timeout comment "src4 eth0"');
    expect(script).toMatch(/add rule inet natgw_ct set_timeout meta l4proto udp ct timeout set "udp_[0-9a-f]{8}" comment "udp udp_[0-9a-f]{8}"/);
  });

  it('finds nothing to do when the kernel holds it, and changes only elements for a new rule', () => {
    expect(planNftCt(want, held())).toBe('');
    const more = nftCtTable({ ...state, dnats: [...state.dnats, { eip: EIP, port: 53, protocol: 'udp', internalIp: '10.0.1.6', internalPort: 53 }] }, policy);
    expect(planNftCt(more, held())).toBe(`add element inet natgw_ct dst4 { ${EIP} . udp . 53 }\n`);
    const fewer = nftCtTable({ ...state, fips: [] }, policy);
    expect(planNftCt(fewer, held())).toBe(
      'delete element inet natgw_ct dst4 { 172.20.0.11 . tcp . 0-65535, 172.20.0.11 . udp . 0-65535 }\ndelete element inet natgw_ct src4 { 10.0.2.5 }\n',
    );
  });

  it('a changed policy adds the new object, rewrites the rules naming it, then deletes the old one', () => {
    const next = nftCtTable(state, { ...policy, udp: 10 });
    const script = planNftCt(next, held());
    const lines = script.trim().split('\n');
    const oldUdp = [...want.objects.keys()].find((k) => k.startsWith('udp_'));
    expect(lines[0]).toBe('table inet natgw_ct {');
    expect(lines).toContain('flush chain inet natgw_ct set_timeout');
    expect(lines.at(-1)).toBe(`delete ct timeout inet natgw_ct ${oldUdp}`);
    expect(lines.indexOf('flush chain inet natgw_ct set_timeout')).toBeLessThan(lines.length - 1);
  });

  it('repairs a flushed chain and set, rebuilds a chain declared otherwise, and removes the table when unwanted', () => {
    const flushed = held();
    (flushed.chains as Map<string, string[]>).set('prerouting', []);
    (flushed.sets as Map<string, Set<string>>).set('src4', new Set());
    const script = planNftCt(want, flushed);
    expect(script).toContain('add element inet natgw_ct src4 { 10.0.1.0/24, 10.0.2.5 }');
    expect(script).toContain('flush chain inet natgw_ct prerouting\nadd rule inet natgw_ct prerouting ct state != new return comment "new"');
    expect(planNftCt(want, { ...held(), declaredRight: false })).toMatch(/^delete table inet natgw_ct\nadd table inet natgw_ct\n/);
    expect(planNftCt(null, held())).toBe('delete table inet natgw_ct\n');
    expect(planNftCt(null, null)).toBe('');
  });

  it('reads back what nft -j lists (nft 1.0.6)', () => {
    const json = JSON.stringify({
      nftables: [
        { metainfo: { version: '1.0.6' } },
        { table: { family: 'inet', name: 'natgw_ct', handle: 1 } },
        { 'ct timeout': { family: 'inet', name: 'udp_x', table: 'natgw_ct', handle: 3, protocol: 'udp', l3proto: 'ip', policy: { unreplied: 7, replied: 7 } } },
        {
          set: {
            family: 'inet',
            name: 'dst4',
            table: 'natgw_ct',
            type: ['ipv4_addr', 'inet_proto', 'inet_service'],
            flags: ['interval'],
            elem: [{ concat: ['127.0.0.2', 'udp', 9999] }, { concat: ['127.0.0.3', 'tcp', { range: [8000, 8100] }] }],
          },
        },
        {
          set: {
            family: 'inet',
            name: 'src4',
            table: 'natgw_ct',
            type: 'ipv4_addr',
            flags: ['interval'],
            elem: [{ prefix: { addr: '10.0.1.0', len: 24 } }, '10.0.2.5'],
          },
        },
        { chain: { family: 'inet', table: 'natgw_ct', name: 'prerouting', handle: 1, type: 'filter', hook: 'prerouting', prio: -190, policy: 'accept' } },
        { chain: { family: 'inet', table: 'natgw_ct', name: 'set_timeout', handle: 2 } },
        { rule: { family: 'inet', table: 'natgw_ct', chain: 'prerouting', handle: 8, comment: 'new', expr: [] } },
        { rule: { family: 'inet', table: 'natgw_ct', chain: 'set_timeout', handle: 12, comment: 'udp udp_x', expr: [] } },
      ],
    });
    const have = parseNftCt(json);
    expect([...have.objects]).toEqual(['udp_x']);
    expect([...(have.sets.get('dst4') ?? [])]).toEqual(['127.0.0.2 . udp . 9999', '127.0.0.3 . tcp . 8000-8100']);
    expect([...(have.sets.get('src4') ?? [])]).toEqual(['10.0.1.0/24', '10.0.2.5']);
    expect(have.chains.get('prerouting')).toEqual(['new']);
    expect(have.chains.get('set_timeout')).toEqual(['udp udp_x']);
    expect(have.declaredRight).toBe(true);
    const moved = json.replace('"prio": -190', '"prio": -300').replace('"prio":-190', '"prio":-300');
    expect(parseNftCt(moved).declaredRight).toBe(false);
  });
});

describe('iptables', () => {
  const v4 = iptCtFamily(state, policy, 4);

  it('renders the raw chains in save form and the nfct policies', () => {
    expect(v4.lines.slice(0, 6)).toEqual([
      '-A PREROUTING -j CT_TIMEOUT',
      `-A CT_TIMEOUT -d ${EIP}/32 -p tcp -m tcp --dport 8080 -g CT_TIMEOUT_SET`,
      `-A CT_TIMEOUT -d ${EIP}/32 -p udp -m udp --dport 9000:9010 -g CT_TIMEOUT_SET`,
      '-A CT_TIMEOUT -d 172.20.0.11/32 -g CT_TIMEOUT_SET',
      '-A CT_TIMEOUT -s 10.0.1.0/24 -i eth0 -m addrtype ! --dst-type LOCAL -g CT_TIMEOUT_SET',
      '-A CT_TIMEOUT -s 10.0.2.5/32 -i eth0 -m addrtype ! --dst-type LOCAL -g CT_TIMEOUT_SET',
    ]);
    const [tcpName, tcpArgs] = [...v4.policies][0] ?? [];
    expect(tcpName).toMatch(/^natgw_4_tcp_[0-9a-f]{8}$/);
    expect(tcpArgs?.slice(0, 4)).toEqual(['inet', 'tcp', 'syn_sent', '30']);
    expect(v4.lines).toContain(`-A CT_TIMEOUT_SET -p tcp -m comment --comment ${tcpName} -j CT --timeout ${tcpName}`);
    expect(iptCtFamily(state, policy, 6).policies.keys().next().value).toMatch(/^natgw_6_tcp_/);
  });

  it('compares with iptables-save, which shortens the --timeout name, and restores only on a difference', () => {
    // iptables 1.8.9 saves `--timeout natg`: the comment still names the policy.
    const save = `*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:CT_TIMEOUT - [0:0]\n:CT_TIMEOUT_SET - [0:0]\n${v4.lines.map((l) => l.replace(/--timeout \S+/, '--timeout natg')).join('\n')}\nCOMMIT\n`;
    const have = { policies: new Set(v4.policies.keys()), ...parseIptCt(save) };
    expect(have.lines).toEqual(v4.lines.map(compareLine));
    expect(planIptCt(v4, have)).toBeNull();
    const script = planIptCt(v4, { policies: new Set(), lines: [], chains: false });
    expect(script).toMatch(/^\*raw\n:CT_TIMEOUT - \[0:0\]\n:CT_TIMEOUT_SET - \[0:0\]\n-I PREROUTING 1 -j CT_TIMEOUT\n-A CT_TIMEOUT -d /);
    expect(script?.endsWith('COMMIT\n')).toBe(true);
    // Nothing wanted: the jump, then the chains go.
    expect(planIptCt(null, have)).toBe('*raw\n-D PREROUTING -j CT_TIMEOUT\n-F CT_TIMEOUT\n-F CT_TIMEOUT_SET\n-X CT_TIMEOUT\n-X CT_TIMEOUT_SET\nCOMMIT\n');
    expect(planIptCt(null, { policies: new Set(), lines: [], chains: false })).toBeNull();
  });

  it('a changed rule edits only its selector lines, whatever order the kernel holds them in', () => {
    const have = { policies: new Set(v4.policies.keys()), lines: v4.lines.map(compareLine), chains: true };
    const next = iptCtFamily(
      { ...state, fips: [], dnats: [...state.dnats, { eip: EIP, port: 53, protocol: 'udp', internalIp: '10.0.1.6', internalPort: 53 }] },
      policy,
      4,
    );
    expect(planIptCt(next, have)).toBe(
      [
        '*raw',
        ':CT_TIMEOUT_SET - [0:0]',
        '-D CT_TIMEOUT -d 172.20.0.11/32 -g CT_TIMEOUT_SET',
        '-D CT_TIMEOUT -s 10.0.2.5/32 -i eth0 -m addrtype ! --dst-type LOCAL -g CT_TIMEOUT_SET',
        `-A CT_TIMEOUT -d ${EIP}/32 -p udp -m udp --dport 53 -g CT_TIMEOUT_SET`,
        ...v4.lines.filter((l) => l.startsWith('-A CT_TIMEOUT_SET ')),
        'COMMIT',
        '',
      ].join('\n'),
    );
    const [jump, ...rest] = have.lines;
    const reordered = {
      ...have,
      lines: [jump as string, ...rest.filter((l) => l.startsWith('-A CT_TIMEOUT ')).reverse(), ...rest.filter((l) => !l.startsWith('-A CT_TIMEOUT '))],
    };
    expect(planIptCt(v4, reordered)).toBeNull();
    // A changed policy rewrites the chains.
    expect(planIptCt(iptCtFamily(state, { ...policy, udp: 10 }, 4), have)).toMatch(/^\*raw\n:CT_TIMEOUT - \[0:0\]\n:CT_TIMEOUT_SET - \[0:0\]\n/);
  });

  it("reads natgw's policies of nfct list timeout per family, and no one else's", () => {
    const text = [
      '.pol1 = {\n\t.l3proto = 2,\n\t.l4proto = 17,\n\t.policy = {\n\t\t.UNREPLIED = 5,\n\t},\n};',
      '.natgw_4_udp_0123abcd = {\n\t.l3proto = 2,\n\t.l4proto = 17,\n\t.policy = {\n\t\t.UNREPLIED = 30,\n\t},\n};',
      '.natgw_6_tcp_0123abcd = {\n\t.l3proto = 10,\n\t.l4proto = 6,\n\t.policy = {\n\t\t.ESTABLISHED = 1200,\n\t},\n};',
    ].join('\n');
    const owned = parseNfctList(text);
    expect([...owned[4]]).toEqual(['natgw_4_udp_0123abcd']);
    expect([...owned[6]]).toEqual(['natgw_6_tcp_0123abcd']);
  });
});

describe('where the kernel or the tools cannot hold policies', () => {
  it('without nfct: one warning, a note once, no change refused and nothing run after the probe', async () => {
    const calls: string[] = [];
    const exec: Executor = {
      run: async (req) => {
        calls.push(req.file);
        return resultOf(req, req.file === 'nfct' ? { exitCode: 127, failedToStart: true } : {});
      },
    };
    const warnings: unknown[] = [];
    const log = pino({ level: 'warn' }, { write: (l: string) => warnings.push(JSON.parse(l)) });
    const nft = { run: async () => undefined } as unknown as NftClient;
    const ct = new CtTimeouts(exec, nft, log, policy);
    const target = { kind: 'iptables', variant: 'legacy' } as const;
    const first = await ct.sync(state, target, { mode: 'full' });
    expect(first).toEqual({
      changes: 0,
      script: '',
      notes: ["connection timeouts not applied: nfct is not installed; translated flows keep the kernel's timeouts"],
    });
    // The first full sync also looked for what the other backends may have left (nothing here).
    expect(calls.filter((c) => c === 'nfct')).toEqual(['nfct']);
    calls.length = 0;
    expect((await ct.sync(state, target, { mode: 'partial' })).notes).toEqual([]);
    expect(await ct.sync(state, target, { mode: 'full' })).toEqual({ changes: 0, script: '', notes: [] });
    expect(calls).toEqual([]);
    expect(warnings).toHaveLength(1);
  });

  it('nftables refusing a ct timeout object: the same', async () => {
    const exec: Executor = { run: async (req) => resultOf(req, {}) };
    const nft = {
      run: async () => {
        throw new Error('Error: Could not process rule: Operation not supported');
      },
      listJson: async () => null,
    } as unknown as NftClient;
    const ct = new CtTimeouts(exec, nft, pino({ level: 'silent' }), policy);
    const r = await ct.sync(state, { kind: 'nftables' }, { mode: 'full' });
    expect(r.changes).toBe(0);
    expect(r.notes[0]).toMatch(/^connection timeouts not applied: the kernel refused a ct timeout object/);
  });
});
