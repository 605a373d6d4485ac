/**
 * Shared SNAT on nftables, laid out per prefix length (snatLayout.ts): a CIDR of one single-EIP
 * rule is an element of its length's data map, any other CIDR an element of the verdict map and
 * a chain of its own. Against real packets through the daemon: SPEC's first-match semantics hold
 * across overlapping prefixes and across the two forms (a miss in a data map falls through to the
 * next rule), for several EIPs on one CIDR (the first counts), with fully-random and with a pool;
 * a CIDR moving between the forms by commands keeps translating; a hand-deleted element is put
 * back by the next full sync; and tables of older versions (a chain per CIDR; the flat
 * shared_snat before that) are converted by the daemon's start full sync, established
 * connections flowing on, and adopted from when the state is lost.
 * nftables only: the iptables backend keeps its ordered SHARED_SNAT chain.
 */
import { rmSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { parsePeer, request, startEchoServer, startServer, type ServerHandle } from '../helpers/traffic.js';
import { startLongFlow } from '../helpers/traffic.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitForLog, waitReady, type Daemon } from './daemon-util.js';

const E1 = '172.20.0.10';
const E2 = '172.20.0.11';
const E3 = '172.20.0.12';
const WIDE = '10.0.0.0/16';
const VPC2_HOST = `${ADDR.vpc2}/32`;
const enc = encodeURIComponent;

/** What every version of natgw's table holds besides shared SNAT (render.ts), as an nft script's lines. */
const SKELETON = [
  '  map fip_dnat { type ipv4_addr : ipv4_addr; }',
  '  map fip_snat { type ipv4_addr : ipv4_addr; }',
  '  map port_dnat { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; }',
  `  set hairpin_eips { type ipv4_addr; elements = { ${E1}, ${E2}, ${E3} }; }`,
  '  chain vpc_mark { type filter hook prerouting priority mangle; policy accept; iifname "eth0" meta mark set meta mark | 0x1; }',
  '  chain prerouting { type nat hook prerouting priority dstnat; policy accept;',
  '    dnat ip to ip daddr map @fip_dnat',
  '    meta l4proto { tcp, udp } dnat ip addr . port to ip daddr . meta l4proto . th dport map @port_dnat',
  '  }',
  '  chain postrouting { type nat hook postrouting priority srcnat; policy accept;',
  '    snat ip to ip saddr map @fip_snat',
  '    oifname "net1" jump shared_snat',
  '    oifname "eth0" meta mark & 0x1 == 0x1 ct status dnat ct original ip daddr @hairpin_eips snat ip to ct original ip daddr fully-random',
  '  }',
];

describe('shared SNAT per-length layout on nftables, with real traffic', () => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let server: ServerHandle | undefined;
  let echo: ServerHandle | undefined;
  let sock: string;

  const list = async (): Promise<string> => (await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'natgw'])).stdout;
  const tableHandle = async (): Promise<number> =>
    JSON.parse((await topo.exec('gw', ['nft', '-j', 'list', 'table', 'ip', 'natgw'])).stdout).nftables.find((i: any) => i.table)?.table.handle;
  /** The address the external server sees a new connection from `from` come from. */
  const seenAs = async (from: 'vpc1' | 'vpc2' = 'vpc1'): Promise<string> => parsePeer(await request(topo, from, 'tcp', ADDR.extHost, 9000)).ip;
  let nextPort = 41000;
  /**
   * Whether SNAT kept vpc1's source port, over two connections from fixed ports: it does unless
   * the ports clash, except with fully-random, which picks one at random (1 in 64k to keep it).
   */
  const portsKept = async (): Promise<boolean> => {
    const kept: boolean[] = [];
    for (let i = 0; i < 2; i++) {
      const localPort = nextPort++;
      kept.push(parsePeer(await request(topo, 'vpc1', 'tcp', ADDR.extHost, 9000, { localPort })).port === localPort);
    }
    return kept.every(Boolean);
  };
  const putSnat = async (eip: string, cidr: string, body: Record<string, unknown> = {}, replace = false) =>
    ok(await api(sock, 'PUT', `/v1/snats/${eip},${enc(cidr)}${replace ? '?replace=true' : ''}`, body), `snat ${eip} ${cidr}`);
  const delSnat = async (eip: string, cidr: string) => expect((await api(sock, 'DELETE', `/v1/snats/${eip},${enc(cidr)}`)).status).toBe(204);
  const block = async (kind: 'chain' | 'map', name: string): Promise<string | undefined> =>
    new RegExp(`\\t${kind} ${name} \\{\\n([\\s\\S]*?)\\n\\t\\}`).exec(await list())?.[1];
  const sharedSnatChain = async (): Promise<string> => (await block('chain', 'shared_snat')) ?? '';
  const elementsOf = async (map: string): Promise<string> => /elements = \{ ([^}]*) \}/.exec((await block('map', map)) ?? '')?.[1]?.replace(/\s+/g, ' ') ?? '';
  const chains = async (): Promise<string[]> => [...(await list()).matchAll(/\tchain (\S+) \{/g)].map((m) => m[1]!);
  /** What a resync would change now: nothing, when the command path left what a full render makes. */
  const drifted = async (): Promise<boolean> => ok(await api(sock, 'GET', '/v1/status?check=true'), 'status check').body.drift.check.drifted;
  /** Stopped, then started as after an upgrade: the start is a full sync. */
  const restart = async (between: () => Promise<void> = async () => undefined): Promise<void> => {
    if (daemon) await stopDaemon(daemon, 'SIGTERM');
    daemon = undefined;
    await between();
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    await waitForLog(daemon, 'full sync: read back and reconciled everything natgw owns');
  };

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, { GATEWAY_NETFILTER_MODE: 'nftables', NATGW_RESYNC_PERIOD: '1h' });
    sock = socketOf(topo);
    server = startServer(topo, 'ext', 'tcp', 9000, ADDR.extHost);
    echo = startEchoServer(topo, 'ext', 9001, ADDR.extHost);
    await Promise.all([server.ready, echo.ready]);
    daemon = await startDaemon(topo);
    expect((await topo.natgw('init')).exitCode).toBe(0);
    await waitReady(topo, daemon);
    for (const eip of [E1, E2, E3]) ok(await api(sock, 'PUT', `/v1/eips/${eip}`, { prefixLength: 24 }), `eip ${eip}`);
  }, 60_000);

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await server?.stop().catch(() => undefined);
    await echo?.stop().catch(() => undefined);
    await topo?.cleanup();
  }, 60_000);

  it('a CIDR of one EIP is an element of its data map, no chain; a miss in a data map falls through to the next rule', async () => {
    await putSnat(E1, WIDE);
    expect(await seenAs()).toBe(E1);
    expect(await portsKept()).toBe(true);
    expect(await elementsOf('snat_to_len_16')).toBe(`10.0.0.0 : ${E1}`);
    expect((await chains()).filter((c) => c.startsWith('snat_'))).toEqual([]);
    // Another /24 in the plain /24 map: vpc1's lookup there misses and goes on to the /16.
    await putSnat(E2, '10.0.9.0/24');
    expect(await seenAs()).toBe(E1);
    // vpc1's /24, fully-random: the plain map's rule (before it) misses, the fully-random one translates.
    await putSnat(E2, ADDR.vpcCidr, { randomFully: true });
    expect(await seenAs()).toBe(E2);
    expect(await elementsOf('snat_to_fr_len_24')).toBe(`10.0.1.0 : ${E2}`);
    // Translated by the fully-random rule: the source ports are random.
    expect(await portsKept()).toBe(false);
    expect(await elementsOf('snat_to_len_24')).toBe(`10.0.9.0 : ${E2}`);
    const chain = (await sharedSnatChain()).split('\n').map((l) => l.trim());
    expect(chain).toEqual([
      'ip saddr & 255.255.255.0 vmap @snat_len_24',
      'snat to ip saddr & 255.255.255.0 map @snat_to_len_24',
      'snat to ip saddr & 255.255.255.0 map @snat_to_fr_len_24 fully-random',
      'ip saddr & 255.255.0.0 vmap @snat_len_16',
      'snat to ip saddr & 255.255.0.0 map @snat_to_len_16',
      'snat to ip saddr & 255.255.0.0 map @snat_to_fr_len_16 fully-random',
    ]);
    await delSnat(E2, '10.0.9.0/24');
    expect(await seenAs()).toBe(E2);
    expect(await drifted()).toBe(false);
  });

  it('the longer prefix wins across the two forms: a /24 chain over a /16 element, a /24 element over a /16 chain, a /32 element over both', async () => {
    // /24 of two EIPs (a chain, the first counts) over the /16 element.
    await putSnat(E3, ADDR.vpcCidr);
    expect(await seenAs()).toBe(E2);
    expect(await block('chain', 'snat_10_0_1_0_24')).toBe(`\t\tip saddr 10.0.1.0/24 snat to ${E2} fully-random\n\t\tip saddr 10.0.1.0/24 snat to ${E3}`);
    expect(await elementsOf('snat_len_24')).toBe('10.0.1.0 : goto snat_10_0_1_0_24');
    expect(await elementsOf('snat_to_fr_len_24')).toBe('');
    // One EIP left on the /24 (an element again), two on the /16 (a chain).
    await delSnat(E2, ADDR.vpcCidr);
    await putSnat(E2, WIDE);
    expect(await elementsOf('snat_to_len_24')).toBe(`10.0.1.0 : ${E3}`);
    expect(await elementsOf('snat_len_16')).toBe('10.0.0.0 : goto snat_10_0_0_0_16');
    expect(await seenAs()).toBe(E3);
    // A host prefix of vpc2, an element, ahead of both.
    await putSnat(E2, VPC2_HOST);
    expect(await seenAs('vpc2')).toBe(E2);
    expect(await seenAs('vpc1')).toBe(E3);
    // The /24's length goes: vpc1 falls to the /16 chain, whose first EIP counts.
    await delSnat(E3, ADDR.vpcCidr);
    expect(await seenAs('vpc1')).toBe(E1);
    expect(await seenAs('vpc2')).toBe(E2);
    expect(await list()).not.toContain('_len_24');
    expect(await drifted()).toBe(false);
    await delSnat(E2, VPC2_HOST);
    await delSnat(E2, WIDE);
    expect(await seenAs('vpc2')).toBe(E1);
    expect((await chains()).filter((c) => c.startsWith('snat_'))).toEqual([]);
  });

  it('a CIDR moving element → chain → element → chain by commands keeps translating, and leaves what a full render makes', async () => {
    /** Where 10.0.1.0/24 is: its own chain, an element of one of the data maps, or nowhere. */
    const form = async (): Promise<string> => {
      if ((await chains()).includes('snat_10_0_1_0_24')) return 'chain';
      for (const map of ['snat_to_len_24', 'snat_to_fr_len_24']) if ((await elementsOf(map)).includes('10.0.1.0 : ')) return map;
      return 'none';
    };
    const steps: Array<[string, () => Promise<unknown>, string | string[], string]> = [
      ['one EIP', () => putSnat(E2, ADDR.vpcCidr), E2, 'snat_to_len_24'],
      ['a second EIP', () => putSnat(E3, ADDR.vpcCidr), E2, 'chain'],
      ['the first gone', () => delSnat(E2, ADDR.vpcCidr), E3, 'snat_to_len_24'],
      ['fully-random now', () => putSnat(E3, ADDR.vpcCidr, { randomFully: true }, true), E3, 'snat_to_fr_len_24'],
      ['another EIP after it', () => putSnat(E1, ADDR.vpcCidr), E3, 'chain'],
      // A replace moves the SNAT behind the other of its CIDR: E1 is first now.
      ['a pool', () => putSnat(E3, ADDR.vpcCidr, { eips: [E3, E2] }, true), E1, 'chain'],
      ['only the pool', () => delSnat(E1, ADDR.vpcCidr), [E2, E3], 'chain'],
      ['one EIP again', () => putSnat(E3, ADDR.vpcCidr, {}, true), E3, 'snat_to_len_24'],
      ['none', () => delSnat(E3, ADDR.vpcCidr), E1, 'none'],
    ];
    for (const [what, change, want, where] of steps) {
      await change();
      if (Array.isArray(want)) {
        const seen = new Set<string>();
        for (let i = 0; i < 4; i++) seen.add(await seenAs());
        expect([...seen].sort(), what).toEqual(want);
      } else expect(await seenAs(), what).toBe(want);
      expect(await form(), what).toBe(where);
      expect(await drifted(), what).toBe(false);
    }
  });

  it('a pool on a host prefix takes its EIPs in turn, ahead of the /16', async () => {
    await putSnat(E2, `${ADDR.vpc1}/32`, { eips: [E2, E3] });
    const seen = new Set<string>();
    for (let i = 0; i < 4; i++) seen.add(await seenAs());
    expect([...seen].sort()).toEqual([E2, E3]);
    await delSnat(E2, `${ADDR.vpc1}/32`);
    expect(await seenAs()).toBe(E1);
  });

  it('an element deleted by hand is put back by the next full sync', async () => {
    await putSnat(E2, ADDR.vpcCidr);
    expect(await seenAs()).toBe(E2);
    expect((await topo.exec('gw', ['nft', 'delete', 'element', 'ip', 'natgw', 'snat_to_len_24', '{ 10.0.1.0 }'])).exitCode).toBe(0);
    expect(await seenAs()).toBe(E1);
    expect(await drifted()).toBe(true);
    // `init` (safe to repeat) is a full sync: read back, repair.
    expect((await topo.natgw('init')).exitCode).toBe(0);
    expect(await elementsOf('snat_to_len_24')).toBe(`10.0.1.0 : ${E2}`);
    expect(await seenAs()).toBe(E2);
    expect(await drifted()).toBe(false);
  });

  it('a table in the flat layout of older versions is rebuilt to this layout at daemon start', async () => {
    await restart(async () => {
      // What an older natgw left: the skeleton, and SNAT rules in shared_snat, longest prefix first.
      const old = [
        'delete table ip natgw',
        'table ip natgw {',
        ...SKELETON,
        '  chain shared_snat {',
        `    ip saddr 10.0.1.0/24 snat ip to ${E2}`,
        `    ip saddr 10.0.0.0/16 snat ip to ${E1}`,
        '  }',
        '}',
        '',
      ].join('\n');
      expect((await topo.exec('gw', ['nft', '-f', '-'], { input: old })).exitCode).toBe(0);
      expect(await sharedSnatChain()).toContain(`ip saddr 10.0.1.0/24 snat to ${E2}`);
    });
    const chain = await sharedSnatChain();
    expect(chain).not.toContain('snat to 172');
    expect(chain).toContain('vmap @snat_len_24');
    expect(chain).toContain('map @snat_to_len_16');
    expect(await elementsOf('snat_to_len_16')).toBe(`10.0.0.0 : ${E1}`);
    expect(await seenAs()).toBe(E2);
    expect(await drifted()).toBe(false);
  });

  it('a table with a chain per CIDR (the layout before data maps) is converted at daemon start in place; connections flow on', async () => {
    await putSnat(E3, VPC2_HOST);
    await putSnat(E1, VPC2_HOST);
    expect(await seenAs('vpc2')).toBe(E3);
    let handle = 0;
    let flow: Awaited<ReturnType<typeof startLongFlow>> | undefined;
    try {
      await restart(async () => {
        // The same SNATs as that version laid them out: every CIDR an element of the verdict map and its own chain.
        const old = [
          'delete table ip natgw',
          'table ip natgw {',
          ...SKELETON,
          `  chain snat_10_0_1_7_32 { ip saddr 10.0.1.7 snat ip to ${E3}; ip saddr 10.0.1.7 snat ip to ${E1}; }`,
          `  chain snat_10_0_1_0_24 { ip saddr 10.0.1.0/24 snat ip to ${E2}; }`,
          `  chain snat_10_0_0_0_16 { ip saddr 10.0.0.0/16 snat ip to ${E1}; }`,
          '  map snat_len_32 { type ipv4_addr : verdict; elements = { 10.0.1.7 : goto snat_10_0_1_7_32 }; }',
          '  map snat_len_24 { type ipv4_addr : verdict; elements = { 10.0.1.0 : goto snat_10_0_1_0_24 }; }',
          '  map snat_len_16 { type ipv4_addr : verdict; elements = { 10.0.0.0 : goto snat_10_0_0_0_16 }; }',
          '  chain shared_snat {',
          '    ip saddr vmap @snat_len_32',
          '    ip saddr & 255.255.255.0 vmap @snat_len_24',
          '    ip saddr & 255.255.0.0 vmap @snat_len_16',
          '  }',
          '}',
          '',
        ].join('\n');
        expect((await topo.exec('gw', ['nft', '-f', '-'], { input: old })).exitCode).toBe(0);
        expect((await chains()).filter((c) => c.startsWith('snat_')).sort()).toEqual(['snat_10_0_0_0_16', 'snat_10_0_1_0_24', 'snat_10_0_1_7_32']);
        handle = await tableHandle();
        // A connection translated by the old table, open across the conversion.
        flow = await startLongFlow(topo, 'vpc1', ADDR.extHost, 9001);
        expect(parsePeer(flow.peer).ip).toBe(E2);
      });
      // Converted by a diff, not rebuilt: the same table, its stale chains gone, the new maps filled.
      expect(await tableHandle()).toBe(handle);
      expect((await chains()).filter((c) => c.startsWith('snat_'))).toEqual(['snat_10_0_1_7_32']);
      expect(await elementsOf('snat_len_32')).toBe('10.0.1.7 : goto snat_10_0_1_7_32');
      expect(await elementsOf('snat_len_24')).toBe('');
      expect(await elementsOf('snat_to_len_24')).toBe(`10.0.1.0 : ${E2}`);
      expect(await elementsOf('snat_to_len_16')).toBe(`10.0.0.0 : ${E1}`);
      expect(await flow!.check()).toBe(true);
      expect(await seenAs('vpc1')).toBe(E2);
      expect(await seenAs('vpc2')).toBe(E3);
      expect(await drifted()).toBe(false);
      expect(await flow!.check()).toBe(true);
    } finally {
      await flow?.close();
    }
  });

  it('adopts every SNAT back from the kernel, data-map elements and chains alike, when the state is lost', async () => {
    const before = (await api(sock, 'GET', '/v1/state')).body.desired.snats;
    expect(before).toHaveLength(4);
    await stopDaemon(daemon!, 'SIGKILL');
    daemon = undefined;
    for (const f of ['state.json', 'state.journal', 'owned.json', 'backend.json']) rmSync(`${topo.stateDir}/${f}`, { force: true });
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    expect((await api(sock, 'GET', '/v1/state')).body.desired.snats).toEqual(before);
    expect(await seenAs('vpc1')).toBe(E2);
    expect(await seenAs('vpc2')).toBe(E3);
    expect(await drifted()).toBe(false);
    await delSnat(E3, VPC2_HOST);
    expect(await seenAs('vpc2')).toBe(E1);
  });
});
