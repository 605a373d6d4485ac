/**
 * Where the daemon listens: the Unix socket (parent dir created, mode 0600, a stale socket
 * replaced, a live one or a non-socket refused), one daemon per socket, and the TCP settings
 * that refuse an unauthenticated listener.
 */
import type os from 'node:os';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import express from 'express';
import { loadConfig } from '../../src/config/config.js';
import { StartupError, claimSingleton, closeServer, listenUnix, parseListen, socketAnswers, tcpSettings } from '../../src/daemon/listeners.js';

const dir = mkdtempSync(join(tmpdir(), 'natgw-listen-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const app = () => {
  const a = express();
  a.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });
  return a;
};

const get = (socketPath: string) =>
  new Promise<number>((resolve, reject) => {
    http
      .get({ socketPath, path: '/healthz' }, (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      })
      .on('error', reject);
  });

describe('the Unix socket', () => {
  it('creates the parent directory and serves with mode 0600', async () => {
    const sock = join(dir, 'a', 'b', 'natgw.sock');
    const server = await listenUnix(app(), sock);
    try {
      expect(statSync(sock).mode & 0o777).toBe(0o600);
      expect(await get(sock)).toBe(200);
    } finally {
      await closeServer(server);
    }
  });

  it('replaces a stale socket left by a killed process, and refuses one that answers', async () => {
    const sock = join(dir, 'stale.sock');
    // A process that binds the socket and dies by SIGKILL leaves the file behind.
    spawnSync(process.execPath, ['-e', `require('net').createServer().listen(${JSON.stringify(sock)}, () => process.kill(process.pid, 'SIGKILL'))`]);
    expect(statSync(sock).isSocket()).toBe(true);
    expect(await socketAnswers(sock)).toBe(false);
    const server = await listenUnix(app(), sock);
    try {
      expect(await get(sock)).toBe(200);
      await expect(listenUnix(app(), sock)).rejects.toThrow(/another natgw daemon is serving/);
    } finally {
      await closeServer(server);
    }
  });

  it('refuses a path that is not a socket', async () => {
    const file = join(dir, 'plain');
    writeFileSync(file, 'x');
    await expect(listenUnix(app(), file)).rejects.toBeInstanceOf(StartupError);
  });

  it('lets one daemon claim a socket at a time, and frees the claim when it goes', async () => {
    const sock = join(dir, 'single.sock');
    const first = await claimSingleton(sock);
    expect(first).toBeDefined();
    expect(await claimSingleton(sock)).toBeUndefined();
    expect(await claimSingleton(join(dir, 'other.sock'))).toBeDefined();
    first!.close();
    await new Promise((r) => setImmediate(r));
    expect(await claimSingleton(sock)).toBeDefined();
  });
});

describe('TCP settings', () => {
  const config = (env: Record<string, string>) => loadConfig({ NATGW_ENV_FILE: join(dir, 'none.env'), ...env });

  it('parses host:port forms', () => {
    expect(parseListen('0.0.0.0:8443')).toEqual({ host: '0.0.0.0', port: 8443 });
    expect(parseListen('[::1]:80')).toEqual({ host: '::1', port: 80 });
    // No host: the VPC interface's address (tcpSettings).
    expect(parseListen(':9000')).toEqual({ host: undefined, port: 9000 });
    expect(parseListen('8443')).toEqual({ host: undefined, port: 8443 });
    for (const bad of ['host', '1.2.3.4:99999', '1.2.3.4:', '0', ':x']) expect(parseListen(bad), bad).toBeNull();
  });

  it('is off without NATGW_LISTEN', async () => {
    expect(await tcpSettings(await config({}))).toBeUndefined();
  });

  it('refuses TCP with neither a token file nor TLS client verification, naming the keys', async () => {
    for (const env of [{}, { NATGW_TLS_CERT: '/c', NATGW_TLS_KEY: '/k' }] as Record<string, string>[]) {
      const err = await tcpSettings(await config({ NATGW_LISTEN: '127.0.0.1:8443', ...env })).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(StartupError);
      expect((err as Error).message).toMatch(/NATGW_TOKEN_FILE.*NATGW_TLS_CLIENT_CA/);
    }
    await expect(tcpSettings(await config({ NATGW_LISTEN: '127.0.0.1:8443', NATGW_TLS_CERT: '/c' }))).rejects.toThrow(/NATGW_TLS_CERT and NATGW_TLS_KEY/);
    await expect(tcpSettings(await config({ NATGW_LISTEN: 'nonsense' }))).rejects.toThrow(/NATGW_LISTEN/);
    await expect(tcpSettings(await config({ NATGW_LISTEN: ':1', NATGW_TOKEN_FILE: join(dir, 'missing') }))).rejects.toThrow(/NATGW_TOKEN_FILE: cannot read/);
    writeFileSync(join(dir, 'empty-token'), '\n');
    await expect(tcpSettings(await config({ NATGW_LISTEN: ':1', NATGW_TOKEN_FILE: join(dir, 'empty-token') }))).rejects.toThrow(/one token/);
  });

  const TOKEN = 'c2b1f0a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3';

  it('reads the token (trimmed)', async () => {
    writeFileSync(join(dir, 'token'), `${TOKEN}\n`);
    const s = await tcpSettings(await config({ NATGW_LISTEN: '10.0.1.1:8443', NATGW_TOKEN_FILE: join(dir, 'token') }));
    expect(s).toMatchObject({ host: '10.0.1.1', port: 8443, auth: { token: TOKEN, clientCerts: false } });
  });

  it('refuses a token shorter than 32 bytes, or an example placeholder, naming the key', async () => {
    const refused = async (token: string): Promise<string> => {
      writeFileSync(join(dir, 'weak'), `${token}\n`);
      const err = await tcpSettings(await config({ NATGW_LISTEN: '10.0.1.1:8443', NATGW_TOKEN_FILE: join(dir, 'weak') })).catch((e: unknown) => e);
      expect(err, token).toBeInstanceOf(StartupError);
      return (err as Error).message;
    };
    expect(await refused('s3cret')).toBe(
      `NATGW_TOKEN_FILE: the token in ${join(dir, 'weak')} is 6 bytes, shorter than 32: put a random one there (e.g. openssl rand -hex 32)`,
    );
    expect(await refused('x'.repeat(31))).toMatch(/is 31 bytes, shorter than 32/);
    expect(await refused('change-me-to-a-long-random-string')).toMatch(/^NATGW_TOKEN_FILE: .* holds the example's placeholder token/);
    expect(await refused(`CHANGEME${'0'.repeat(40)}`)).toMatch(/placeholder/);
    writeFileSync(join(dir, 'ok'), `${'x'.repeat(32)}\n`);
    await expect(tcpSettings(await config({ NATGW_LISTEN: '10.0.1.1:8443', NATGW_TOKEN_FILE: join(dir, 'ok') }))).resolves.toBeDefined();
  });

  it("binds a port alone to the VPC interface's address (IPv4 first, no link-local IPv6), else refuses naming the keys", async () => {
    writeFileSync(join(dir, 'token'), `${TOKEN}\n`);
    const nic = (address: string, family: 'IPv4' | 'IPv6') =>
      ({ address, family, netmask: '', mac: '', internal: false, cidr: null }) as os.NetworkInterfaceInfo;
    const interfaces = () => ({
      eth0: [nic('fe80::1', 'IPv6'), nic('fd00:1::5', 'IPv6'), nic('10.0.1.254', 'IPv4')],
      net1: [nic('172.20.0.10', 'IPv4')],
      v6only: [nic('fe80::2', 'IPv6'), nic('fd00:2::5', 'IPv6')],
    });
    const settings = (env: Record<string, string>) => config({ NATGW_TOKEN_FILE: join(dir, 'token'), ...env }).then((c) => tcpSettings(c, interfaces));
    expect(await settings({ NATGW_LISTEN: '8443' })).toMatchObject({ host: '10.0.1.254', port: 8443 });
    expect(await settings({ NATGW_LISTEN: ':8443', VPC_INTERFACE: 'v6only' })).toMatchObject({ host: 'fd00:2::5', port: 8443 });
    expect(await settings({ NATGW_LISTEN: '0.0.0.0:8443' })).toMatchObject({ host: '0.0.0.0' });
    await expect(settings({ NATGW_LISTEN: '8443', VPC_INTERFACE: 'eth9' })).rejects.toThrow(
      "NATGW_LISTEN=8443 binds to the VPC interface's address, but eth9 (VPC_INTERFACE) has none: give the host (e.g. NATGW_LISTEN=10.0.1.254:8443)",
    );
  });
});
