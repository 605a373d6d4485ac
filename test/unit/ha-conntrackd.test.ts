/**
 * Replica sync (src/ha): conntrackd.conf rendering, the `conntrackd -s` parser on output
 * captured from Debian's conntrackd 1.4.7 (two replicas in two namespaces, one TCP flow synced
 * from the active to the backup and committed there), the HA configuration keys, and the
 * supervisor's restart with backoff.
 */
import { EventEmitter } from 'node:events';
import { readFileSync } from 'node:fs';
import { PassThrough } from 'node:stream';
import type { ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { loadConfig, ConfigError } from '../../src/config/config.js';
import { conntrackdPaths, renderConntrackdConf, HaConfigError } from '../../src/ha/render.js';
import { parseConntrackdStats, StatsParseError } from '../../src/ha/stats.js';
import { Supervisor, type SupervisorState } from '../../src/ha/supervisor.js';
import { waitFor } from '../helpers/poll.js';

const FIXTURES = join(import.meta.dirname, 'fixtures', 'conntrackd');
const fixture = (name: string): string => readFileSync(join(FIXTURES, name), 'utf8');
const silent = pino({ level: 'silent' });

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

  it('IPv6 sync addresses, no interface line when none is given', () => {
    const text = renderConntrackdConf({ localAddress: 'fd00:99::1', peerAddress: 'fd00:99::2', port: 4000, paths });
    expect(text).toContain('\t\tIPv6_address fd00:99::1\n\t\tIPv6_Destination_Address fd00:99::2\n\t\tPort 4000\n\t\tSndSocketBuffer');
    expect(text).not.toContain('Interface ');
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
      peer: undefined,
      syncInterface: undefined,
      syncAddress: undefined,
      port: 3780,
      syncTimeoutMs: 10_000,
      conntrackd: 'conntrackd',
      peerApi: undefined,
      peerTokenFile: undefined,
      initialRole: 'standby',
      mode: 'takeover',
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
      peer: '10.99.0.2',
      syncInterface: 'sync0',
      port: 3781,
      syncTimeoutMs: 3000,
      peerApi: 'http://10.99.0.2:8080',
      peerTokenFile: '/etc/natgw/token',
    });
  });

  it.each([
    ['NATGW_HA_PEERS', '10.99.0.2,10.99.0.3', /one IP address/],
    ['NATGW_HA_PEERS', 'peer-b', /one IP address/],
    ['NATGW_HA_SYNC_PORT', '70000', /NATGW_HA_SYNC_PORT/],
    ['NATGW_HA_SYNC_TIMEOUT', '0s', /NATGW_HA_SYNC_TIMEOUT must be between/],
    ['NATGW_HA_PEER_API', 'ftp://x', /http:\/\/host:port/],
    ['NATGW_HA_SYNC_INTERFACE', 'a b', /interface name/],
  ])('%s=%s is refused', async (key, value, message) => {
    const err = await loadConfig({ ...base, [key]: value }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConfigError);
    expect(String(err)).toMatch(message);
    expect(String(err)).toContain(key);
  });
});

/** A child that exits when told to. */
class FakeChild extends EventEmitter {
  static next = 1000;
  readonly pid = FakeChild.next++;
  readonly stdout = new PassThrough();
  readonly stderr = new PassThrough();
  exitCode: number | null = null;
  signalCode: string | null = null;
  kill(signal: string): boolean {
    this.die(null, signal);
    return true;
  }
  die(code: number | null, signal: string | null = null): void {
    if (this.exitCode !== null || this.signalCode !== null) return;
    this.exitCode = code;
    this.signalCode = signal;
    this.emit('exit', code, signal);
  }
}

describe('Supervisor', () => {
  it('restarts a child that dies, with a growing backoff, and stops for good', async () => {
    const children: FakeChild[] = [];
    const states: SupervisorState[] = [];
    const sup = new Supervisor({
      file: 'conntrackd',
      args: ['-C', 'x'],
      log: silent,
      spawn: () => {
        const c = new FakeChild();
        children.push(c);
        return c as unknown as ChildProcess;
      },
      onState: (s) => states.push(s),
      minBackoffMs: 5,
      maxBackoffMs: 40,
      stableMs: 60_000,
    });
    sup.start();
    await waitFor(async () => sup.state === 'running', { what: 'first start' });
    for (let i = 0; i < 4; i++) {
      const c = children[children.length - 1]!;
      c.die(null, 'SIGKILL');
      expect(sup.state).toBe('backoff');
      await waitFor(async () => sup.state === 'running' && children.length === i + 2, { what: `restart ${i + 1}` });
    }
    expect(sup.restarts).toBe(4);
    expect(sup.lastExit?.signal).toBe('SIGKILL');
    await sup.stop();
    expect(sup.state).toBe('stopped');
    expect(children[children.length - 1]!.signalCode).toBe('SIGTERM');
    expect(states.filter((s) => s === 'backoff')).toHaveLength(4);
  });

  it("logs the child's lines (node:readline, loaded on first use): its errors as warnings", async () => {
    const lines: { level: number; line?: string }[] = [];
    const log = pino({ level: 'debug' }, { write: (s: string) => lines.push(JSON.parse(s)) });
    const sup = new Supervisor({
      file: process.execPath,
      args: ['-e', "console.log('[ERROR] cannot bind'); console.error('[NOTICE] chatter'); setInterval(() => {}, 1000)"],
      log,
      stableMs: 60_000,
    });
    sup.start();
    try {
      await waitFor(async () => lines.some((l) => l.line === '[NOTICE] chatter') && lines.some((l) => l.line === '[ERROR] cannot bind'), {
        what: "the child's two lines",
      });
      expect(lines.find((l) => l.line === '[ERROR] cannot bind')?.level).toBe(40);
      expect(lines.find((l) => l.line === '[NOTICE] chatter')?.level).toBe(20);
    } finally {
      await sup.stop();
    }
  });

  it('a failed start (binary gone, config refused) is retried too, never thrown', async () => {
    let attempts = 0;
    const sup = new Supervisor({
      file: 'conntrackd',
      args: [],
      log: silent,
      beforeStart: async () => {
        attempts++;
        if (attempts < 3) throw new Error('sync interface sync0 not found (yet)');
      },
      spawn: () => new FakeChild() as unknown as ChildProcess,
      minBackoffMs: 1,
      maxBackoffMs: 2,
    });
    sup.start();
    await waitFor(async () => sup.state === 'running', { what: 'start after two failures' });
    expect(attempts).toBe(3);
    expect(sup.restarts).toBe(2);
    expect(sup.lastExit?.error).toMatch(/not found/);
    await sup.stop();
  });
});
