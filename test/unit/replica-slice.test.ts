/**
 * Active-active replicas, pure parts: the SNAT port slice (configuration, both renderers and
 * their read-back), the drop of invalid packets, conntrackd.conf in the active-active mode, the
 * `external inject` statistics of conntrackd 1.4.7 with the external cache disabled, and the
 * replica role (no gratuitous ARP in active-active).
 */
import { describe, expect, it } from 'vitest';
import { loadConfig, ConfigError } from '../../src/config/config.js';
import { parsePortSlice } from '../../src/config/portSlice.js';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { desiredTables, planTable, savedAfter } from '../../src/dataplane/netfilter/iptables/plan.js';
import { adoptFromSave } from '../../src/dataplane/netfilter/iptables/adopt.js';
import { parseSave } from '../../src/dataplane/netfilter/iptables/save.js';
import { recogniseRule } from '../../src/dataplane/netfilter/nft/readback.js';
import { desiredFamily, ruleJson } from '../../src/dataplane/netfilter/nft/render.js';
import { planPartial } from '../../src/dataplane/netfilter/nft/partial.js';
import { replicaRulesOf } from '../../src/engine/backendSelect.js';
import { ReplicaRole } from '../../src/engine/replicaRole.js';
import { conntrackdPaths, renderConntrackdConf } from '../../src/ha/render.js';
import { parseConntrackdStats } from '../../src/ha/stats.js';

const PORTS = { lo: 1024, hi: 33279 };
const BASE: NatTables = {
  vpcIf: 'eth0',
  extIf: 'net1',
  eips: ['172.20.0.10', '172.20.0.11'],
  snats: [
    { eip: '172.20.0.10', cidr: '10.0.1.0/24', randomFully: true },
    { eip: '172.20.0.10', cidr: '10.0.2.0/24', randomFully: false },
    { eip: '172.20.0.11', cidr: '10.0.3.0/24', randomFully: true, eips: ['172.20.0.11', '172.20.0.10'] },
  ],
  dnats: [],
  fips: [],
};

describe('NATGW_SNAT_PORT_SLICE', () => {
  it('cuts 1024-65535 into count slices by index, or takes an explicit range', () => {
    expect(parsePortSlice('0/2')).toEqual({ lo: 1024, hi: 33279, spec: '0/2' });
    expect(parsePortSlice('1/2')).toEqual({ lo: 33280, hi: 65535, spec: '1/2' });
    expect(parsePortSlice(' 2/3 ')).toEqual({ lo: 44032, hi: 65535, spec: '2/3' });
    expect(parsePortSlice('20000-29999')).toEqual({ lo: 20000, hi: 29999, spec: '20000-29999' });
  });

  it('refuses what is not a slice, saying how to write one', () => {
    expect(parsePortSlice('2/2')).toMatch(/index counts from 0 and must be below 2/);
    expect(parsePortSlice('0/0')).toMatch(/count must be 1 to 64/);
    expect(parsePortSlice('3000-2000')).toMatch(/lo <= hi/);
    expect(parsePortSlice('2000-2100')).toMatch(/at least 256 ports/);
    expect(parsePortSlice('first')).toMatch(/must be <index>\/<count> .* or a port range <lo>-<hi>/);
  });

  it('is read from the configuration, and a bad value stops start-up naming the key', async () => {
    const env = { NATGW_ENV_FILE: '/nonexistent/natgw.env', NATGW_HA_PEERS: '10.99.0.2', NATGW_HA_MODE: 'active-active' };
    const c = await loadConfig({ ...env, NATGW_SNAT_PORT_SLICE: '1/2' });
    expect(c.ha?.mode).toBe('active-active');
    expect(c.ha?.snatPortSlice).toEqual({ lo: 33280, hi: 65535, spec: '1/2' });
    expect(replicaRulesOf(c)).toEqual({ snatPorts: { lo: 33280, hi: 65535 }, dropInvalid: true, handOff: { peers: ['10.99.0.2'], rate: 10_000 } });
    const noHandOff = await loadConfig({ ...env, NATGW_HA_HAND_OFF: 'off' });
    expect(replicaRulesOf(noHandOff)).toEqual({ dropInvalid: true });
    await expect(loadConfig({ ...env, NATGW_HA_HAND_OFF: 'yes' })).rejects.toThrow(/NATGW_HA_HAND_OFF/);
    const three = await loadConfig({ ...env, NATGW_HA_PEERS: '10.99.0.2,10.99.0.3', NATGW_HA_SYNC_INTERFACE: 'sync0' });
    expect(replicaRulesOf(three)?.handOff).toEqual({ peers: ['10.99.0.2', '10.99.0.3'], rate: 10_000 });
    expect(replicaRulesOf(await loadConfig({ ...env, NATGW_HA_HAND_OFF_RATE: '200' }))?.handOff?.rate).toBe(200);
    await expect(loadConfig({ ...env, NATGW_HA_HAND_OFF_RATE: '20000' })).rejects.toThrow(/NATGW_HA_HAND_OFF_RATE/);
    await expect(loadConfig({ ...env, NATGW_SNAT_PORT_SLICE: '2/2' })).rejects.toThrow(ConfigError);
    await expect(loadConfig({ ...env, NATGW_SNAT_PORT_SLICE: '2/2' })).rejects.toThrow(/NATGW_SNAT_PORT_SLICE/);
    await expect(loadConfig({ ...env, NATGW_HA_MODE: 'both' })).rejects.toThrow(/NATGW_HA_MODE/);
    const plain = await loadConfig({ NATGW_ENV_FILE: '/nonexistent/natgw.env' });
    expect(plain.ha?.mode).toBe('takeover');
    expect(replicaRulesOf(plain)).toBeUndefined();
  });
});

describe('nftables under a port slice', () => {
  const spec = desiredFamily({ ...BASE, snatPorts: PORTS }, 'ip');
  const chain = (name: string) => spec?.chains.find((c) => c.name === name)?.rules.map((r) => r.text);

  it('puts a TCP/UDP twin into the slice before every SNAT statement', () => {
    expect(chain('shared_snat')).toEqual([
      'ip saddr & 255.255.255.0 vmap @snat_len_24',
      'meta l4proto { tcp, udp } snat ip to ip saddr & 255.255.255.0 map @snat_to_len_24 : 1024-33279',
      'snat ip to ip saddr & 255.255.255.0 map @snat_to_len_24',
      'meta l4proto { tcp, udp } snat ip to ip saddr & 255.255.255.0 map @snat_to_fr_len_24 : 1024-33279 fully-random',
      'snat ip to ip saddr & 255.255.255.0 map @snat_to_fr_len_24 fully-random',
    ]);
    expect(chain('snat_10_0_3_0_24')).toEqual([
      'ip saddr 10.0.3.0/24 meta l4proto { tcp, udp } snat ip to numgen inc mod 2 map { 0 : 172.20.0.11, 1 : 172.20.0.10 } :1024-33279 fully-random',
      'ip saddr 10.0.3.0/24 snat ip to numgen inc mod 2 map { 0 : 172.20.0.11, 1 : 172.20.0.10 } fully-random',
    ]);
    expect(chain('postrouting')?.slice(-2)).toEqual([
      'oifname "eth0" meta mark & 0x1 == 0x1 ct status dnat ct original ip daddr @hairpin_eips meta l4proto { tcp, udp } snat ip to ct original ip daddr :1024-33279 fully-random',
      'oifname "eth0" meta mark & 0x1 == 0x1 ct status dnat ct original ip daddr @hairpin_eips snat ip to ct original ip daddr fully-random',
    ]);
    expect(chain('forward')).toBeUndefined();
  });

  it('recognises every rule it renders (a steady gateway is quiet)', () => {
    for (const fam of ['ip', 'ip6'] as const) {
      const rules = [
        {
          kind: 'snat',
          cidr: fam === 'ip' ? '10.0.1.0/24' : 'fd00:1::/64',
          eip: fam === 'ip' ? '172.20.0.10' : 'fd00:20::10',
          randomFully: true,
          ports: PORTS,
        },
        { kind: 'snat-dispatch', len: 24, via: 'eip', ports: PORTS },
        { kind: 'snat-dispatch', len: 24, via: 'eip-fr', ports: PORTS },
        { kind: 'hairpin', vpcIf: 'eth0', ports: PORTS },
        { kind: 'drop-invalid' },
        { kind: 'invalid-own-socket' },
        { kind: 'hand-off', packets: 'invalid', ifs: ['eth0', 'net1'], peer: fam === 'ip' ? '10.99.0.2' : 'fd00:99::2', rate: 10_000 },
        { kind: 'hand-off', packets: 'new-udp', ifs: ['eth0', 'net1'], peer: fam === 'ip' ? '10.99.0.2' : 'fd00:99::2', rate: 200 },
        { kind: 'new-udp-own-socket' },
        { kind: 'drop-new-udp' },
      ] as const;
      for (const r of rules) expect(recogniseRule(ruleJson(r, fam), fam)).toEqual(r);
    }
  });

  it('drops invalid packets in forward and input when asked', () => {
    const s = desiredFamily({ ...BASE, dropInvalid: true }, 'ip');
    const base = (name: string) => s?.chains.find((c) => c.name === name);
    expect(base('forward')).toMatchObject({ base: { type: 'filter', hook: 'forward', priority: 0 } });
    expect(base('forward')?.rules.map((r) => r.text)).toEqual(['ct state invalid drop']);
    // The replica's own connections (BGP, the API) pass on input even when their entry is gone.
    expect(base('input')?.rules.map((r) => r.text)).toEqual([
      'ct state invalid socket wildcard 0 accept',
      'ct state invalid drop',
      'meta l4proto udp ct state new socket wildcard { 0, 1 } accept',
      'meta l4proto udp ct state new drop',
    ]);
  });

  it('hands a copy of what arrives on the VPC or an uplink to each peer of the family before the drop', () => {
    const want = { ...BASE, dropInvalid: true, handOff: { peers: ['10.99.0.2', '10.99.0.3', 'fd00:99::2'], rate: 500 }, uplinks: ['net2'] };
    const rules = (fam: 'ip' | 'ip6', name: string) =>
      desiredFamily(fam === 'ip' ? want : { ...want, eips: ['fd00:20::10'] }, fam)
        ?.chains.find((c) => c.name === name)
        ?.rules.map((r) => r.text);
    expect(rules('ip', 'forward')).toEqual([
      'iifname { "eth0", "net1", "net2" } ct state invalid limit rate 500/second burst 500 packets dup to 10.99.0.2',
      'iifname { "eth0", "net1", "net2" } ct state invalid limit rate 500/second burst 500 packets dup to 10.99.0.3',
      'ct state invalid drop',
    ]);
    expect(rules('ip', 'input')).toEqual([
      'ct state invalid socket wildcard 0 accept',
      'iifname { "eth0", "net1", "net2" } ct state invalid limit rate 500/second burst 500 packets dup to 10.99.0.2',
      'iifname { "eth0", "net1", "net2" } ct state invalid limit rate 500/second burst 500 packets dup to 10.99.0.3',
      'ct state invalid drop',
      'meta l4proto udp ct state new socket wildcard { 0, 1 } accept',
      'iifname { "eth0", "net1", "net2" } meta l4proto udp ct state new limit rate 500/second burst 500 packets dup to 10.99.0.2',
      'iifname { "eth0", "net1", "net2" } meta l4proto udp ct state new limit rate 500/second burst 500 packets dup to 10.99.0.3',
      'meta l4proto udp ct state new drop',
    ]);
    expect(rules('ip6', 'forward')).toEqual([
      'iifname { "eth0", "net1", "net2" } ct state invalid limit rate 500/second burst 500 packets dup to fd00:99::2',
      'ct state invalid drop',
    ]);
    // Other peers are a change of the replica's rules: a full sync plans it.
    const view = { tables: want, families: new Set(['ip'] as const) };
    expect(planPartial(view, { ...want, handOff: { ...want.handOff, peers: ['10.99.0.2'] } })).toBeNull();
    expect(planPartial(view, { ...want, handOff: { ...want.handOff, rate: 600 } })).toBeNull();
    expect(planPartial(view, { ...want, eips: [...want.eips, '172.20.0.12'] })).not.toBeNull();
  });

  it('plans SNAT and other changes under a slice partially, and a new slice as a full sync', () => {
    const view = { tables: { ...BASE, snatPorts: PORTS }, families: new Set(['ip'] as const) };
    // The element the sliced and the plain dispatch rule both look up.
    expect(planPartial(view, { ...BASE, snatPorts: PORTS, snats: BASE.snats.slice(1) })?.tx.text()).toBe(
      'delete element ip natgw snat_to_fr_len_24 { 10.0.1.0 }\n',
    );
    expect(planPartial(view, { ...BASE, snatPorts: PORTS, eips: [...BASE.eips, '172.20.0.12'] })).not.toBeNull();
    expect(planPartial(view, { ...BASE, snatPorts: { lo: 2000, hi: 3000 } })).toBeNull();
  });
});

describe('iptables under a port slice', () => {
  it('writes TCP and UDP lines into the slice before the plain ones, and adopts only the SNAT rules', () => {
    const want = desiredTables({ ...BASE, snatPorts: PORTS, dropInvalid: true });
    const shared = want.nat.owned.get('SHARED_SNAT');
    expect(shared?.slice(0, 3)).toEqual([
      '-s 10.0.1.0/24 -o net1 -p tcp -j SNAT --to-source 172.20.0.10:1024-33279 --random-fully',
      '-s 10.0.1.0/24 -o net1 -p udp -j SNAT --to-source 172.20.0.10:1024-33279 --random-fully',
      '-s 10.0.1.0/24 -o net1 -j SNAT --to-source 172.20.0.10 --random-fully',
    ]);
    expect(shared?.slice(-6)).toEqual([
      '-s 10.0.3.0/24 -o net1 -p tcp -m statistic --mode nth --every 2 --packet 0 -j SNAT --to-source 172.20.0.11:1024-33279 --random-fully',
      '-s 10.0.3.0/24 -o net1 -p tcp -j SNAT --to-source 172.20.0.10:1024-33279 --random-fully',
      '-s 10.0.3.0/24 -o net1 -p udp -m statistic --mode nth --every 2 --packet 0 -j SNAT --to-source 172.20.0.11:1024-33279 --random-fully',
      '-s 10.0.3.0/24 -o net1 -p udp -j SNAT --to-source 172.20.0.10:1024-33279 --random-fully',
      '-s 10.0.3.0/24 -o net1 -m statistic --mode nth --every 2 --packet 0 -j SNAT --to-source 172.20.0.11 --random-fully',
      '-s 10.0.3.0/24 -o net1 -j SNAT --to-source 172.20.0.10 --random-fully',
    ]);
    expect(want.nat.owned.get('HAIRPIN_SNAT')?.slice(0, 3)).toEqual([
      '-o eth0 -p tcp -m mark --mark 0x1/0x1 -m conntrack --ctstate DNAT --ctorigdst 172.20.0.10 -j SNAT --to-source 172.20.0.10:1024-33279 --random-fully',
      '-o eth0 -p udp -m mark --mark 0x1/0x1 -m conntrack --ctstate DNAT --ctorigdst 172.20.0.10 -j SNAT --to-source 172.20.0.10:1024-33279 --random-fully',
      '-o eth0 -m mark --mark 0x1/0x1 -m conntrack --ctstate DNAT --ctorigdst 172.20.0.10 -j SNAT --to-source 172.20.0.10 --random-fully',
    ]);
    expect(want.mangle.owned.get('NATGW_DROP_INVALID')).toEqual(['-m conntrack --ctstate INVALID -j DROP']);
    expect(want.mangle.owned.get('NATGW_INPUT_INVALID')).toEqual([
      '-m conntrack --ctstate INVALID -m socket -j RETURN',
      '-m conntrack --ctstate INVALID -j DROP',
      '-p udp -m conntrack --ctstate NEW -m socket --nowildcard -j RETURN',
      '-p udp -m conntrack --ctstate NEW -j DROP',
    ]);
    const handing = desiredTables({ ...BASE, dropInvalid: true, handOff: { peers: ['10.99.0.2'], rate: 300 } });
    const limit = '-m limit --limit 300/sec --limit-burst 300';
    const tee = [
      `-i eth0 -m conntrack --ctstate INVALID ${limit} -j TEE --gateway 10.99.0.2`,
      `-i net1 -m conntrack --ctstate INVALID ${limit} -j TEE --gateway 10.99.0.2`,
    ];
    expect(handing.mangle.owned.get('NATGW_DROP_INVALID')).toEqual([...tee, '-m conntrack --ctstate INVALID -j DROP']);
    expect(handing.mangle.owned.get('NATGW_INPUT_INVALID')).toEqual([
      '-m conntrack --ctstate INVALID -m socket -j RETURN',
      ...tee,
      '-m conntrack --ctstate INVALID -j DROP',
      '-p udp -m conntrack --ctstate NEW -m socket --nowildcard -j RETURN',
      `-i eth0 -p udp -m conntrack --ctstate NEW ${limit} -j TEE --gateway 10.99.0.2`,
      `-i net1 -p udp -m conntrack --ctstate NEW ${limit} -j TEE --gateway 10.99.0.2`,
      '-p udp -m conntrack --ctstate NEW -j DROP',
    ]);
    expect([...want.mangle.jumps.keys()]).toEqual(['PREROUTING', 'FORWARD', 'INPUT']);

    const save = (table: string, chains: ReadonlyMap<string, readonly string[]>) =>
      parseSave(
        `*${table}\n${[...chains.keys()].map((c) => `:${c} - [0:0]`).join('\n')}\n${[...chains].flatMap(([c, rs]) => rs.map((r) => `-A ${c} ${r}`)).join('\n')}\nCOMMIT\n`,
      );
    const adopted = adoptFromSave(save('nat', want.nat.owned), save('mangle', want.mangle.owned));
    expect(adopted?.snats).toEqual(BASE.snats);
    expect(adopted?.eips).toEqual(BASE.eips);
  });
});

describe('iptables back from active-active', () => {
  it('removes the drop-invalid chain and its jumps once the mode no longer wants them, and only those', () => {
    const before = desiredTables({ ...BASE, dropInvalid: true });
    const mangle = parseSave(
      [
        '*mangle',
        ':PREROUTING ACCEPT [0:0]',
        ':INPUT ACCEPT [0:0]',
        ':FORWARD ACCEPT [0:0]',
        ...[...before.mangle.owned.keys()].map((c) => `:${c} - [0:0]`),
        '-A INPUT -j OTHER_OWNER',
        ...[...before.mangle.jumps].map(([b, j]) => `-A ${b} ${j}`),
        ...[...before.mangle.owned].flatMap(([c, rs]) => rs.map((r) => `-A ${c} ${r}`)),
        'COMMIT',
        '',
      ].join('\n'),
    );
    const after = desiredTables(BASE);
    const plan = planTable(mangle, after.mangle);
    expect(plan.lines).toEqual([
      '-D FORWARD -j NATGW_DROP_INVALID',
      '-D INPUT -j NATGW_INPUT_INVALID',
      '-F NATGW_DROP_INVALID',
      '-X NATGW_DROP_INVALID',
      '-F NATGW_INPUT_INVALID',
      '-X NATGW_INPUT_INVALID',
    ]);
    const left = savedAfter(after.mangle);
    expect(left.chains.has('NATGW_DROP_INVALID')).toBe(false);
    expect(left.chains.has('NATGW_INPUT_INVALID')).toBe(false);
    expect(left.rules.get('INPUT') ?? []).not.toContain('-j NATGW_INPUT_INVALID');
    // Nothing more to do once it is gone.
    expect(planTable(left, after.mangle).lines).toEqual([]);
  });
});

describe('conntrackd in the active-active mode', () => {
  it('commits into the kernel (no external cache), keeps the internal cache, filters no TCP state', () => {
    const text = renderConntrackdConf({
      localAddress: '10.99.0.1',
      peerAddress: '10.99.0.2',
      port: 3780,
      paths: conntrackdPaths('/var/lib/natgw'),
      mode: 'active-active',
    });
    expect(text).toContain('DisableExternalCache On');
    expect(text).not.toContain('DisableInternalCache');
    expect(text).not.toContain('State Accept');
    expect(text).not.toContain('CommitTimeout');
    const takeover = renderConntrackdConf({ localAddress: '10.99.0.1', peerAddress: '10.99.0.2', port: 3780, paths: conntrackdPaths('/x') });
    expect(takeover).toContain('DisableExternalCache Off');
    expect(takeover).toContain('ESTABLISHED CLOSED TIME_WAIT CLOSE_WAIT for TCP');
  });

  it("reads conntrackd 1.4.7's statistics without an external cache", () => {
    const out = [
      'cache internal:',
      'current active connections:\t           2',
      'connections created:\t\t           3\tfailed:\t           0',
      'connections updated:\t\t           1\tfailed:\t           0',
      'connections destroyed:\t\t           1\tfailed:\t           0',
      '',
      'external inject:',
      'connections created:\t\t           2\tfailed:\t           1',
      'connections updated:\t\t           1\tfailed:\t           0',
      'connections destroyed:\t\t           0\tfailed:\t           0',
      '',
      'traffic processed:',
      '                   0 Bytes                         0 Pckts',
      '',
      'UDP traffic (active device=s0):',
      '                  24 Bytes sent                  100 Bytes recv',
      '                   2 Pckts sent                    2 Pckts recv',
      '                   0 Error send                    0 Error recv',
      '',
      'message tracking:',
      '                   0 Malformed msgs                    0 Lost msgs',
    ].join('\n');
    const s = parseConntrackdStats(out);
    expect(s.internal.active).toBe(2);
    expect(s.external).toEqual({ active: 0, created: 2, createFailed: 1, updated: 1, updateFailed: 0, destroyed: 0, destroyFailed: 0 });
    expect(s.channel.packetsReceived).toBe(2);
  });
});

describe('ReplicaRole in the active-active mode', () => {
  it('is active and announces nothing (the EIPs are routed)', () => {
    const role = new ReplicaRole({
      ha: { peers: ['10.99.0.2'], peerApis: [], port: 3780, syncTimeoutMs: 3000, conntrackd: 'conntrackd', initialRole: 'standby', mode: 'active-active' },
    });
    expect(role.status()).toMatchObject({ mode: 'active-active', role: 'active' });
    expect(role.mayAnnounce('eip-add', ['172.20.0.10'])).toBe(false);
  });
});
