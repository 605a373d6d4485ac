/**
 * Replica sync (src/ha): conntrackd.conf rendering, the `conntrackd -s` parser on output
 * captured from Debian's conntrackd 1.4.7 (two replicas in two namespaces, one TCP flow synced
 * from the active to the backup and committed there; one multicast replica), and the HA configuration keys.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfig, ConfigError } from '../../src/config/config.js';
import { conntrackdPaths, renderConntrackdConf, HaConfigError } from '../../src/ha/render.js';
import { parseConntrackdStats, StatsParseError } from '../../src/ha/stats.js';

const FIXTURES = join(import.meta.dirname, 'fixtures', 'conntrackd');
const fixture = (name: string): string => readFileSync(join(FIXTURES, name), 'utf8');

describe('renderConntrackdConf', () => {
  const paths = conntrackdPaths('/var/lib/natgw/');

  it('keeps every file of conntrackd in the state directory', () => {
    expect(paths).toEqual({
      dir: '/var/lib/natgw/conntrackd',
      config: '/var/lib/natgw/conntrackd/conntrackd.conf',
      socket: '/var/lib/natgw/conntrackd/conntrackd.ctl',
      lock: '/var/lib/natgw/conntrackd/conntrackd.lock',
      pid: '/var/lib/natgw/conntrackd/conntrackd.pid',
    });
  });

  it('IPv4: FTFW over UDP unicast with an external cache, the sync channel ignored', () => {
    const text = renderConntrackdConf({ localAddress: '10.99.0.1', peerAddress: '10.99.0.2', syncInterface: 'sync0', port: 3780, paths });
    expect(text).toContain('\tMode FTFW {\n\t\tDisableExternalCache Off\n');
    expect(text).toContain('\tUDP {\n\t\tIPv4_address 10.99.0.1\n\t\tIPv4_Destination_Address 10.99.0.2\n\t\tPort 3780\n\t\tInterface sync0\n');
    expect(text).toContain('\t\tTCPWindowTracking Off\n');
    expect(text).toContain('\tLockFile /var/lib/natgw/conntrackd/conntrackd.lock\n');
    expect(text).toContain('\tUNIX {\n\t\tPath /var/lib/natgw/conntrackd/conntrackd.ctl\n\t}\n');
    expect(text).toContain('\t\t\tIPv4_address 10.99.0.1\n\t\t\tIPv4_address 10.99.0.2\n');
    expect(text).toContain('\tLogFile off\n\tSyslog off\n');
    expect(text).not.toContain('IPv6_Destination_Address');
  });

  it("ignores the replica's own addresses, both families, each once and the sync address not twice", () => {
    const text = renderConntrackdConf({
      localAddress: '10.99.0.1',
      peerAddress: '10.99.0.2',
      port: 3780,
      paths,
      mode: 'active-active',
      ownAddresses: ['172.20.0.2', '10.0.1.1', '172.20.0.2', '10.99.0.1', 'fd00:20::2'],
    });
    const ignore = text.slice(text.indexOf('Address Ignore {'), text.indexOf('}', text.indexOf('Address Ignore {')));
    expect(ignore.match(/_address \S+/g)).toEqual([
      '_address 127.0.0.1',
      '_address ::1',
      '_address 10.99.0.1',
      '_address 10.99.0.2',
      '_address 172.20.0.2',
      '_address 10.0.1.1',
      '_address fd00:20::2',
    ]);
    expect(ignore).toContain('IPv6_address fd00:20::2');
    expect(() => renderConntrackdConf({ localAddress: '10.99.0.1', peerAddress: '10.99.0.2', port: 3780, paths, ownAddresses: ['1.2.3.4; x'] })).toThrow(
      HaConfigError,
    );
  });

  it('IPv6 sync addresses, no interface line when none is given', () => {
    const text = renderConntrackdConf({ localAddress: 'fd00:99::1', peerAddress: 'fd00:99::2', port: 4000, paths });
    expect(text).toContain('\t\tIPv6_address fd00:99::1\n\t\tIPv6_Destination_Address fd00:99::2\n\t\tPort 4000\n\t\tSndSocketBuffer');
    expect(text).not.toContain('Interface ');
  });

  it('more than two replicas: NOTRACK over multicast on the sync interface, every peer ignored', () => {
    const text = renderConntrackdConf({
      localAddress: '10.99.0.1',
      peerAddress: '10.99.0.2',
      peerAddresses: ['10.99.0.2', '10.99.0.3'],
      multicastGroup: '225.0.0.50',
      syncInterface: 'sync0',
      port: 3780,
      paths,
      mode: 'active-active',
    });
    expect(text).toContain('\tMode NOTRACK {\n\t\tDisableExternalCache On\n\t\tDisableInternalCache Off\n');
    expect(text).toContain('\tMulticast {\n\t\tIPv4_address 225.0.0.50\n\t\tGroup 3780\n\t\tIPv4_interface 10.99.0.1\n\t\tInterface sync0\n');
    expect(text).toContain('\t\t\tIPv4_address 10.99.0.1\n\t\t\tIPv4_address 10.99.0.2\n\t\t\tIPv4_address 10.99.0.3\n');
    expect(text).not.toMatch(/FTFW|UDP \{|ResendQueueSize/);
    const pair = { localAddress: '10.99.0.1', peerAddress: '10.99.0.2', syncInterface: 'sync0', port: 3780, paths, mode: 'active-active' as const };
    // A pair keeps its unicast channel, whether its one peer is also listed or not.
    expect(renderConntrackdConf({ ...pair, peerAddresses: ['10.99.0.2'] })).toBe(renderConntrackdConf(pair));
    expect(() => renderConntrackdConf({ ...pair, multicastGroup: 'ff02::1' })).toThrow(/one family/);
    expect(() => renderConntrackdConf({ ...pair, multicastGroup: '225.0.0.50', syncInterface: undefined })).toThrow(/sync interface/);
    expect(() => renderConntrackdConf({ ...pair, multicastGroup: '225.0.0.50', mode: 'takeover' })).toThrow(/active-active/);
  });

  it('refuses mixed families, bad ports and text that would break the syntax', () => {
    expect(() => renderConntrackdConf({ localAddress: '10.99.0.1', peerAddress: 'fd00::2', port: 3780, paths })).toThrow(HaConfigError);
    expect(() => renderConntrackdConf({ localAddress: '10.99.0.1', peerAddress: '10.99.0.2', port: 0, paths })).toThrow(/port/);
    expect(() => renderConntrackdConf({ localAddress: '10.99.0.1', peerAddress: '10.99.0.2', port: 3780, paths: conntrackdPaths('/tmp/a b }') })).toThrow(
      /cannot be written/,
    );
  });
});

describe('parseConntrackdStats (conntrackd 1.4.7 output)', () => {
  it('the active replica: one own flow, nothing from the peer', () => {
    const s = parseConntrackdStats(fixture('stats-active.txt'));
    expect(s.internal).toEqual({ active: 1, created: 1, createFailed: 0, updated: 0, updateFailed: 0, destroyed: 0, destroyFailed: 0 });
    expect(s.external.active).toBe(0);
    expect(s.channel).toEqual({ device: 'sync0', bytesSent: 196, bytesReceived: 128, packetsSent: 9, packetsReceived: 8, sendErrors: 0, receiveErrors: 0 });
    expect(s.malformed).toBe(0);
    expect(s.lost).toBe(0);
  });

  it('a multicast channel (NOTRACK, external inject): conntrackd names its section in lower case', () => {
    const s = parseConntrackdStats(fixture('stats-multicast.txt'));
    expect(s.channel).toEqual({ device: 'sync0', bytesSent: 8, bytesReceived: 0, packetsSent: 1, packetsReceived: 0, sendErrors: 0, receiveErrors: 0 });
    expect(s.external.created).toBe(0);
  });

  it("the backup replica: the peer's flow in its external cache", () => {
    const s = parseConntrackdStats(fixture('stats-backup.txt'));
    expect(s.external).toEqual({ active: 1, created: 1, createFailed: 0, updated: 0, updateFailed: 0, destroyed: 0, destroyFailed: 0 });
    expect(s.channel.packetsReceived).toBeGreaterThan(0);
  });

  it('refuses output without the sync sections (another mode, an error text)', () => {
    expect(() => parseConntrackdStats("can't connect: is conntrackd running? appropriate permissions?\n")).toThrow(StatsParseError);
    const noExternal = fixture('stats-active.txt').replace('cache external:', 'cache elsewhere:');
    expect(() => parseConntrackdStats(noExternal)).toThrow(/cache external/);
  });
});

describe('HA configuration keys', () => {
  const base = { NATGW_ENV_FILE: '/nonexistent/natgw-ha.env' };

  it('off by default, with defaults for the rest', async () => {
    const c = await loadConfig(base);
    expect(c.ha).toEqual({
      peers: [],
      syncInterface: undefined,
      syncAddress: undefined,
      port: 3780,
      syncTimeoutMs: 10_000,
      conntrackd: 'conntrackd',
      peerApis: [],
      peerTokenFile: undefined,
      initialRole: 'standby',
      mode: 'takeover',
      handOff: true,
      handOffRate: 10_000,
    });
  });

  it('reads the peer, the sync channel, the peer API and falls back to NATGW_TOKEN_FILE', async () => {
    const c = await loadConfig({
      ...base,
      NATGW_HA_PEERS: '10.99.0.2',
      NATGW_HA_SYNC_INTERFACE: 'sync0',
      NATGW_HA_SYNC_PORT: '3781',
      NATGW_HA_SYNC_TIMEOUT: '3s',
      NATGW_HA_PEER_API: 'http://10.99.0.2:8080/',
      NATGW_TOKEN_FILE: '/etc/natgw/token',
    });
    expect(c.ha).toMatchObject({
      peers: ['10.99.0.2'],
      syncInterface: 'sync0',
      port: 3781,
      syncTimeoutMs: 3000,
      peerApis: ['http://10.99.0.2:8080'],
      peerTokenFile: '/etc/natgw/token',
    });
  });

  it('several peers: a multicast group (225.0.0.50 by default), every peer API; only in active-active mode', async () => {
    const several = {
      ...base,
      NATGW_HA_PEERS: '10.99.0.2, 10.99.0.3',
      NATGW_HA_MODE: 'active-active',
      NATGW_HA_SYNC_INTERFACE: 'sync0',
      NATGW_HA_PEER_API: 'http://10.99.0.2:8080/,http://10.99.0.3:8080',
    };
    expect((await loadConfig(several)).ha).toMatchObject({
      peers: ['10.99.0.2', '10.99.0.3'],
      syncGroup: '225.0.0.50',
      peerApis: ['http://10.99.0.2:8080', 'http://10.99.0.3:8080'],
    });
    expect((await loadConfig({ ...several, NATGW_HA_SYNC_GROUP: '239.1.2.3' })).ha?.syncGroup).toBe('239.1.2.3');
    const refused = async (env: Record<string, string | undefined>, message: RegExp) => {
      const err = await loadConfig({ ...several, ...env }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ConfigError);
      expect(String(err)).toMatch(message);
    };
    await refused({ NATGW_HA_MODE: 'takeover' }, /only NATGW_HA_MODE=active-active/);
    await refused({ NATGW_HA_SYNC_INTERFACE: undefined }, /NATGW_HA_SYNC_INTERFACE must name/);
    await refused({ NATGW_HA_PEERS: '10.99.0.2,fd00::3' }, /mixes IPv4 and IPv6/);
    await refused({ NATGW_HA_PEERS: 'fd00::2,fd00::3' }, /NATGW_HA_SYNC_GROUP must be set/);
    await refused({ NATGW_HA_PEERS: 'fd00::2,fd00::3', NATGW_HA_SYNC_GROUP: '225.0.0.50' }, /not of the peers' family/);
    expect((await loadConfig({ ...several, NATGW_HA_PEERS: 'fd00::2,fd00::3', NATGW_HA_SYNC_GROUP: 'ff02::3780' })).ha?.syncGroup).toBe('ff02::3780');
  });

  it.each([
    ['NATGW_HA_PEERS', '10.99.0.2,peer-c', /IP addresses of the other replicas/],
    ['NATGW_HA_PEERS', 'peer-b', /IP addresses of the other replicas/],
    ['NATGW_HA_SYNC_GROUP', '10.0.0.1', /multicast address/],
    ['NATGW_HA_PEER_API', 'http://a:1,ftp://b', /http:\/\/host:port/],
    ['NATGW_HA_SYNC_PORT', '70000', /NATGW_HA_SYNC_PORT/],
    ['NATGW_HA_SYNC_TIMEOUT', '0s', /NATGW_HA_SYNC_TIMEOUT: must be between/],
    ['NATGW_HA_PEER_API', 'ftp://x', /http:\/\/host:port/],
    ['NATGW_HA_SYNC_INTERFACE', 'a b', /interface name/],
  ])('%s=%s is refused', async (key, value, message) => {
    const err = await loadConfig({ ...base, [key]: value }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConfigError);
    expect(String(err)).toMatch(message);
    expect(String(err)).toContain(key);
  });
});
