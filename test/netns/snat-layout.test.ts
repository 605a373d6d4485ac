/**
 * Shared SNAT on nftables, laid out per prefix length and per CIDR (snatLayout.ts), against real
 * packets through the daemon: SPEC's first-match semantics hold across overlapping prefixes, for
 * several EIPs on one CIDR (the first counts; deleting it hands over to the next), with
 * fully-random and with a pool; and a gateway upgraded in place from the flat layout (SNAT rules
 * directly in shared_snat) is rebuilt to the new layout by the daemon's first full sync.
 * nftables only: the iptables backend keeps its ordered SHARED_SNAT chain.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { parsePeer, request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const E1 = '172.20.0.10';
const E2 = '172.20.0.11';
const E3 = '172.20.0.12';
const WIDE = '10.0.0.0/16';
const enc = encodeURIComponent;

describe('shared SNAT per-CIDR layout on nftables, with real traffic', () => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let server: ServerHandle | undefined;
  let sock: string;

  const list = async (): Promise<string> => (await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'natgw'])).stdout;
  /** The address the external server sees a new connection from vpc1 come from. */
  const seenAs = async (): Promise<string> => parsePeer(await request(topo, 'vpc1', 'tcp', ADDR.extHost, 9000)).ip;
  const putSnat = async (eip: string, cidr: string, body: Record<string, unknown> = {}) =>
    ok(await api(sock, 'PUT', `/v1/snats/${eip},${enc(cidr)}`, body), `snat ${eip} ${cidr}`);
  const delSnat = async (eip: string, cidr: string) => expect((await api(sock, 'DELETE', `/v1/snats/${eip},${enc(cidr)}`)).status).toBe(204);
  const sharedSnatChain = async (): Promise<string> => /chain shared_snat \{([\s\S]*?)\n\t\}/.exec(await list())?.[1] ?? '';

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, { GATEWAY_NETFILTER_MODE: 'nftables', NATGW_RESYNC_PERIOD: '1h' });
    sock = socketOf(topo);
    server = startServer(topo, 'ext', 'tcp', 9000, ADDR.extHost);
    await server.ready;
    daemon = await startDaemon(topo);
    expect((await topo.natgw('init')).exitCode).toBe(0);
    await waitReady(topo, daemon);
    for (const eip of [E1, E2, E3]) ok(await api(sock, 'PUT', `/v1/eips/${eip}`, { prefixLength: 24 }), `eip ${eip}`);
  }, 60_000);

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await server?.stop().catch(() => undefined);
    await topo?.cleanup();
  }, 60_000);

  it('the longer prefix wins over an overlapping shorter one, whatever the order they came in', async () => {
    await putSnat(E1, WIDE);
    expect(await seenAs()).toBe(E1);
    await putSnat(E2, ADDR.vpcCidr, { randomFully: true });
    expect(await seenAs()).toBe(E2);
    const chain = await sharedSnatChain();
    // Dispatch by length, longest first; no SNAT rule of its own in shared_snat.
    expect(chain.indexOf('ip saddr & 255.255.255.0 vmap @snat_len_24')).toBeGreaterThanOrEqual(0);
    expect(chain.indexOf('ip saddr & 255.255.255.0 vmap @snat_len_24')).toBeLessThan(chain.indexOf('ip saddr & 255.255.0.0 vmap @snat_len_16'));
    expect(chain).not.toContain('snat to');
    const text = await list();
    expect(text).toContain('10.0.1.0 : goto snat_10_0_1_0_24');
    expect(text).toMatch(/chain snat_10_0_1_0_24 \{\n\t\tip saddr 10\.0\.1\.0\/24 snat to 172\.20\.0\.11 fully-random\n\t\}/);
  });

  it('several EIPs on one CIDR: the first counts; deleting it hands over to the next, then to the shorter prefix', async () => {
    await putSnat(E3, ADDR.vpcCidr);
    expect(await seenAs()).toBe(E2);
    await delSnat(E2, ADDR.vpcCidr);
    expect(await seenAs()).toBe(E3);
    await delSnat(E3, ADDR.vpcCidr);
    expect(await seenAs()).toBe(E1);
    // The CIDR's chain and its length's map went with its last rule.
    const text = await list();
    expect(text).not.toContain('snat_10_0_1_0_24');
    expect(text).not.toContain('snat_len_24');
  });

  it('a pool on a host prefix takes its EIPs in turn, ahead of the /16', async () => {
    await putSnat(E2, `${ADDR.vpc1}/32`, { eips: [E2, E3] });
    const seen = new Set<string>();
    for (let i = 0; i < 4; i++) seen.add(await seenAs());
    expect([...seen].sort()).toEqual([E2, E3]);
    await delSnat(E2, `${ADDR.vpc1}/32`);
    expect(await seenAs()).toBe(E1);
  });

  it('a table in the flat layout of older versions is rebuilt to the per-CIDR layout at daemon start', async () => {
    await putSnat(E2, ADDR.vpcCidr);
    expect(await seenAs()).toBe(E2);
    await stopDaemon(daemon!, 'SIGTERM');
    daemon = undefined;
    // What an older natgw left: the skeleton, and SNAT rules in shared_snat, longest prefix first.
    const old = [
      'delete table ip natgw',
      'table ip natgw {',
      '  map fip_dnat { type ipv4_addr : ipv4_addr; }',
      '  map fip_snat { type ipv4_addr : ipv4_addr; }',
      '  map port_dnat { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; }',
      `  set hairpin_eips { type ipv4_addr; elements = { ${E1}, ${E2}, ${E3} }; }`,
      '  chain vpc_mark { type filter hook prerouting priority mangle; policy accept; iifname "eth0" meta mark set meta mark | 0x1; }',
      '  chain prerouting { type nat hook prerouting priority dstnat; policy accept;',
      '    dnat ip to ip daddr map @fip_dnat',
      '    meta l4proto { tcp, udp } dnat ip addr . port to ip daddr . meta l4proto . th dport map @port_dnat',
      '  }',
      '  chain shared_snat {',
      `    ip saddr 10.0.1.0/24 snat ip to ${E2}`,
      `    ip saddr 10.0.0.0/16 snat ip to ${E1}`,
      '  }',
      '  chain postrouting { type nat hook postrouting priority srcnat; policy accept;',
      '    snat ip to ip saddr map @fip_snat',
      '    oifname "net1" jump shared_snat',
      `    oifname "eth0" meta mark & 0x1 == 0x1 ct status dnat ct original ip daddr @hairpin_eips snat ip to ct original ip daddr fully-random`,
      '  }',
      '}',
      '',
    ].join('\n');
    await topo.exec('gw', ['nft', '-f', '-'], { input: old });
    expect(await sharedSnatChain()).toContain(`ip saddr 10.0.1.0/24 snat to ${E2}`);
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    const chain = await sharedSnatChain();
    expect(chain).not.toContain('snat to');
    expect(chain).toContain('vmap @snat_len_24');
    expect(chain).toContain('vmap @snat_len_16');
    expect(await list()).toContain('10.0.0.0 : goto snat_10_0_0_0_16');
    expect(await seenAs()).toBe(E2);
    await delSnat(E2, ADDR.vpcCidr);
    expect(await seenAs()).toBe(E1);
  });
});
