/**
 * NftBackend against a real kernel, in the netns topology (test/helpers/netns.ts): the tables it
 * writes, idempotence, element-level changes, repair of drift, the init guard, removeAll's
 * boundaries, and real traffic: DNAT, SNAT seen as the EIP, FIP both ways, hairpin.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { NftBackend } from '../../src/dataplane/netfilter/nft/backend.js';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { parsePeer, request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { NetnsExecutor } from '../helpers/netnsExecutor.js';

const HOOK_TIMEOUT = 60_000;

const EIP = '172.20.0.10';
const FIP_EIP = '172.20.0.11';

const WANT: NatTables = {
  vpcIf: 'eth0',
  extIf: 'net1',
  eips: [EIP, FIP_EIP],
  snats: [
    { eip: EIP, cidr: ADDR.vpcCidr, randomFully: true },
    { eip: EIP, cidr: '0.0.0.0/0', randomFully: false },
  ],
  dnats: [
    { eip: EIP, port: 80, protocol: 'tcp', internalIp: ADDR.vpc1, internalPort: 8080 },
    { eip: EIP, port: 53, protocol: 'udp', internalIp: ADDR.vpc1, internalPort: 5353 },
  ],
  fips: [{ eip: FIP_EIP, internalIp: ADDR.vpc2 }],
};

describe('NftBackend in a network namespace', () => {
  let topo: Topology;
  let nft: NftBackend;
  const servers: ServerHandle[] = [];

  const list = async (family = 'ip'): Promise<string> => (await topo.exec('gw', ['nft', 'list', 'table', family, 'natgw'])).stdout;

  beforeAll(async () => {
    topo = await createTopology();
    nft = new NftBackend(new NetnsExecutor(topo.ns.gw));
    for (const eip of [EIP, FIP_EIP]) await topo.exec('gw', ['ip', 'addr', 'add', `${eip}/24`, 'dev', 'net1']);
    servers.push(
      startServer(topo, 'vpc1', 'tcp', 8080),
      startServer(topo, 'vpc1', 'udp', 5353),
      startServer(topo, 'vpc2', 'tcp', 8080),
      startServer(topo, 'ext', 'tcp', 9000, ADDR.extHost),
    );
    await Promise.all(servers.map((s) => s.ready));
  }, HOOK_TIMEOUT);

  afterAll(async () => {
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  }, HOOK_TIMEOUT);

  it('is not initialized before the first sync', async () => {
    expect(await nft.isInitialized()).toBe(false);
    expect(await nft.readBack()).toBeNull();
  });

  it('a dry run renders the script and changes nothing', async () => {
    const r = await nft.sync(WANT, { dryRun: true });
    expect(r.changes).toBeGreaterThan(0);
    expect(r.script).toContain('add table ip natgw');
    expect(await nft.isInitialized()).toBe(false);
  });

  it('applies the tables in one sync; then the init guard holds', async () => {
    const r = await nft.sync(WANT);
    expect(r.changes).toBeGreaterThan(0);
    expect(await nft.isInitialized()).toBe(true);
    const text = await list();
    for (const line of [
      'map port_dnat {',
      'type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service',
      '172.20.0.10 . tcp . 80 : 10.0.1.6 . 8080',
      'elements = { 172.20.0.11 : 10.0.1.7 }',
      'elements = { 10.0.1.7 : 172.20.0.11 }',
      'elements = { 172.20.0.10, 172.20.0.11 }',
      'type filter hook prerouting priority mangle; policy accept;',
      'iifname "eth0" meta mark set meta mark | 0x00000001',
      'type nat hook prerouting priority dstnat; policy accept;',
      'dnat to ip daddr map @fip_dnat',
      'meta l4proto { tcp, udp } dnat ip to ip daddr . meta l4proto . th dport map @port_dnat',
      'type nat hook postrouting priority srcnat; policy accept;',
      'snat to ip saddr map @fip_snat',
      'oifname "net1" jump shared_snat',
      'oifname "eth0" meta mark & 0x00000001 == 0x00000001 ct status dnat ct original ip daddr @hairpin_eips snat to ct original ip daddr fully-random',
      // SNAT CIDRs of one EIP: elements of their length's data map, plain or fully-random.
      'map snat_to_fr_len_24 {\n\t\ttype ipv4_addr : ipv4_addr\n\t\telements = { 10.0.1.0 : 172.20.0.10 }',
      'map snat_to_len_0 {\n\t\ttype ipv4_addr : ipv4_addr\n\t\telements = { 0.0.0.0 : 172.20.0.10 }',
      'snat to ip saddr & 255.255.255.0 map @snat_to_fr_len_24 fully-random',
      'snat to ip saddr & 0.0.0.0 map @snat_to_len_0',
    ]) {
      expect(text).toContain(line);
    }
    // Longest prefix first, FIP before DNAT, FIP SNAT before shared SNAT before hairpin.
    expect(text.indexOf('map @snat_to_fr_len_24')).toBeLessThan(text.indexOf('vmap @snat_len_0'));
    expect(text.indexOf('map @fip_dnat')).toBeLessThan(text.indexOf('map @port_dnat'));
    expect(text.indexOf('map @fip_snat')).toBeLessThan(text.indexOf('jump shared_snat'));
    expect(text.indexOf('jump shared_snat')).toBeLessThan(text.indexOf('@hairpin_eips snat'));
    // No IPv6 object, no ip6 table.
    expect((await topo.exec('gw', ['nft', 'list', 'table', 'ip6', 'natgw'], { reject: false })).exitCode).not.toBe(0);
  });

  it('a second sync changes nothing', async () => {
    expect(await nft.sync(WANT)).toEqual({ changes: 0, script: '' });
  });

  it('reads back what it wrote', async () => {
    const t = await nft.readBack();
    expect(t?.vpcIf).toBe('eth0');
    expect(t?.extIf).toBe('net1');
    expect(t?.eips).toEqual(WANT.eips);
    expect(t?.snats).toEqual(WANT.snats);
    expect(t?.fips).toEqual(WANT.fips);
    expect([...(t?.dnats ?? [])].sort((a, b) => a.port - b.port)).toEqual([...WANT.dnats].sort((a, b) => a.port - b.port));
  });

  describe('traffic', () => {
    it('DNAT: an external client reaches the VPC server through EIP:port, seen with its own address', async () => {
      const answer = await request(topo, 'ext', 'tcp', EIP, 80, { localAddress: ADDR.extHost });
      expect(parsePeer(answer).ip).toBe(ADDR.extHost);
      const udp = await request(topo, 'ext', 'udp', EIP, 53, { localAddress: ADDR.extHost });
      expect(parsePeer(udp).ip).toBe(ADDR.extHost);
    });

    it('SNAT: a VPC host reaches the outside as the EIP', async () => {
      expect(parsePeer(await request(topo, 'vpc1', 'tcp', ADDR.extHost, 9000)).ip).toBe(EIP);
    });

    it('FIP: inbound to the FIP reaches its host; its outbound leaves as the FIP, not the shared EIP', async () => {
      expect(parsePeer(await request(topo, 'ext', 'tcp', FIP_EIP, 8080, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
      expect(parsePeer(await request(topo, 'vpc2', 'tcp', ADDR.extHost, 9000)).ip).toBe(FIP_EIP);
    });

    it('hairpin: a VPC client reaching a VPC server through the EIP is seen as the EIP', async () => {
      // rtr has no FIP, so its source is rewritten by the hairpin rule alone.
      expect(parsePeer(await request(topo, 'rtr', 'tcp', EIP, 80)).ip).toBe(EIP);
    });
  });

  it('removing one DNAT removes only that element', async () => {
    const want = { ...WANT, dnats: WANT.dnats.filter((d) => d.protocol !== 'udp') };
    const r = await nft.sync(want);
    expect(r).toEqual({ changes: 1, script: 'delete element ip natgw port_dnat { 172.20.0.10 . udp . 53 }\n' });
    const text = await list();
    expect(text).not.toContain('udp . 53');
    expect(text).toContain('172.20.0.10 . tcp . 80 : 10.0.1.6 . 8080');
    expect(await nft.sync(want)).toEqual({ changes: 0, script: '' });
    await nft.sync(WANT);
  });

  it('a SNAT of a new prefix length adds its three maps, its element and its dispatch rules at their place by handle', async () => {
    const want = { ...WANT, snats: [{ eip: FIP_EIP, cidr: '10.0.1.6/32', randomFully: false }, ...WANT.snats] };
    const r = await nft.sync(want);
    expect(r.script.split('\n').filter(Boolean)).toEqual([
      'add map ip natgw snat_len_32 { type ipv4_addr : verdict; }',
      'add map ip natgw snat_to_len_32 { type ipv4_addr : ipv4_addr; }',
      'add map ip natgw snat_to_fr_len_32 { type ipv4_addr : ipv4_addr; }',
      'add element ip natgw snat_to_len_32 { 10.0.1.6 : 172.20.0.11 }',
      expect.stringMatching(/^insert rule ip natgw shared_snat position \d+ ip saddr vmap @snat_len_32$/),
      expect.stringMatching(/^insert rule ip natgw shared_snat position \d+ snat ip to ip saddr map @snat_to_len_32$/),
      expect.stringMatching(/^insert rule ip natgw shared_snat position \d+ snat ip to ip saddr map @snat_to_fr_len_32 fully-random$/),
    ]);
    expect(r.changes).toBe(7);
    const text = await list();
    expect(text.indexOf('snat to ip saddr map @snat_to_fr_len_32 fully-random')).toBeLessThan(text.indexOf('ip saddr & 255.255.255.0 vmap @snat_len_24'));
    expect(parsePeer(await request(topo, 'vpc1', 'tcp', ADDR.extHost, 9000)).ip).toBe(FIP_EIP);
    await nft.sync(WANT);
    expect(await nft.sync(WANT)).toEqual({ changes: 0, script: '' });
  });

  it('repairs a table flushed behind its back', async () => {
    await topo.exec('gw', ['nft', 'flush', 'table', 'ip', 'natgw']);
    expect(await nft.isInitialized()).toBe(true); // the chains survive a flush, their rules do not
    const r = await nft.sync(WANT);
    expect(r.changes).toBeGreaterThan(0);
    expect(await nft.sync(WANT)).toEqual({ changes: 0, script: '' });
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP, 80, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
  });

  it('repairs a deleted table and a foreign rule added to its chain', async () => {
    await topo.exec('gw', ['nft', 'delete', 'table', 'ip', 'natgw']);
    expect(await nft.isInitialized()).toBe(false);
    await nft.sync(WANT);
    expect(await nft.isInitialized()).toBe(true);
    await topo.exec('gw', ['nft', 'add', 'rule', 'ip', 'natgw', 'prerouting', 'tcp', 'dport', '1', 'accept']);
    const r = await nft.sync(WANT);
    expect(r.changes).toBe(1);
    expect(r.script).toMatch(/^delete rule ip natgw prerouting handle \d+\n$/);
    expect(await nft.sync(WANT)).toEqual({ changes: 0, script: '' });
  });

  it('follows renamed interfaces, touching only the rules that name them', async () => {
    const renamed = { ...WANT, vpcIf: 'vpc0', extIf: 'ext0' };
    const r = await nft.sync(renamed);
    expect(r.changes).toBe(6); // mark, jump, hairpin: each deleted and added
    const text = await list();
    expect(text).toContain('iifname "vpc0"');
    expect(text).toContain('oifname "ext0" jump shared_snat');
    expect(text).not.toMatch(/"eth0"|"net1"/);
    const t = await nft.readBack();
    expect([t?.vpcIf, t?.extIf]).toEqual(['vpc0', 'ext0']);
    await nft.sync(WANT);
    expect(await nft.sync(WANT)).toEqual({ changes: 0, script: '' });
  });

  it('holds IPv6 objects in table ip6 natgw and drops that table when they go', async () => {
    const v6: NatTables = {
      ...WANT,
      eips: [...WANT.eips, 'fd00:20::10'],
      snats: [...WANT.snats, { eip: 'fd00:20::10', cidr: 'fd00:1::/64', randomFully: true }],
    };
    await nft.sync(v6);
    const text = await list('ip6');
    expect(text).toContain('map snat_to_fr_len_64 {\n\t\ttype ipv6_addr : ipv6_addr\n\t\telements = { fd00:1:: : fd00:20::10 }');
    expect(text).toContain('snat to ip6 saddr & ffff:ffff:ffff:ffff:: map @snat_to_fr_len_64 fully-random');
    expect(text).toContain('elements = { fd00:20::10 }');
    expect(await nft.sync(v6)).toEqual({ changes: 0, script: '' });
    expect(await nft.sync(WANT)).toEqual({ changes: 1, script: 'delete table ip6 natgw\n' });
  });

  it('prints the installed iptables version line (the controller needs > 1.6.2)', async () => {
    expect(await nft.versionLine()).toMatch(/^iptables v\d+(\.\d+)+/);
  });

  it('removeAll deletes natgw tables only: a foreign table stays', async () => {
    await topo.exec('gw', ['nft', 'add', 'table', 'ip', 'foreign']);
    await topo.exec('gw', ['nft', 'add', 'chain', 'ip', 'foreign', 'c']);
    await nft.removeAll();
    expect(await nft.isInitialized()).toBe(false);
    expect(await nft.readBack()).toBeNull();
    const tables = (await topo.exec('gw', ['nft', 'list', 'tables'])).stdout;
    expect(tables).toContain('table ip foreign');
    expect(tables).not.toContain('natgw');
    await nft.removeAll(); // nothing left: still fine
  });
});
