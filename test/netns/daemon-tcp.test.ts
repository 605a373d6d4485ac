/**
 * The API over TCP, reached from a tenant's side of the VPC (vpc1 → the gateway's eth0):
 * probes are open; everything else needs the bearer token (or, with TLS client
 * verification, a client certificate). Without either, the daemon refuses to start.
 */
import { randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { api, ok, socketOf, startDaemon, stopDaemon, type Daemon } from './daemon-util.js';
import { hasOpenssl } from '../helpers/openssl.js';

const PORT = 8443;

/** One HTTP(S) request from a namespace; argv-only parameters. */
const CLIENT = `
const [url, method, token, ca, cert, key] = process.argv.slice(1);
const fs = require('fs');
const u = new URL(url);
const mod = u.protocol === 'https:' ? require('https') : require('http');
const headers = method === 'POST' ? { 'content-type': 'application/json' } : {};
if (token) headers.authorization = 'Bearer ' + token;
const opts = { method, headers, timeout: 5000 };
if (ca) opts.ca = fs.readFileSync(ca);
if (cert) { opts.cert = fs.readFileSync(cert); opts.key = fs.readFileSync(key); }
const req = mod.request(url, opts, (res) => {
  let body = '';
  res.setEncoding('utf8');
  res.on('data', (d) => (body += d));
  res.on('end', () => console.log(JSON.stringify({ status: res.statusCode, body })));
});
req.on('timeout', () => req.destroy(new Error('timeout')));
req.on('error', (e) => console.log(JSON.stringify({ status: 0, body: e.message })));
req.end(method === 'POST' ? JSON.stringify({ command: 'help' }) : undefined);
`;

async function call(
  topo: Topology,
  url: string,
  opts: { method?: string; token?: string; ca?: string; cert?: string; key?: string } = {},
): Promise<{ status: number; body: string }> {
  const args = [url, opts.method ?? 'GET', opts.token ?? '', opts.ca ?? '', opts.cert ?? '', opts.key ?? ''];
  const r = await topo.exec('vpc1', [process.execPath, '-e', CLIENT, ...args.map(String)]);
  return JSON.parse(r.stdout) as { status: number; body: string };
}

/** A throwaway CA, a server certificate for the gateway's address and a client certificate. */
function makeCerts(dir: string): Record<'ca' | 'caKey' | 'serverCert' | 'serverKey' | 'clientCert' | 'clientKey', string> {
  const f = (n: string) => join(dir, n);
  const ssl = (...args: string[]) => execFileSync('openssl', args, { stdio: 'ignore' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  ssl('req', '-x509', ...ec, '-keyout', f('ca.key'), '-out', f('ca.crt'), '-days', '1', '-subj', '/CN=natgw-test-ca');
  writeFileSync(f('server.ext'), `subjectAltName=IP:${ADDR.gw}\n`);
  ssl('req', ...ec, '-keyout', f('server.key'), '-out', f('server.csr'), '-subj', '/CN=natgw');
  ssl(
    'x509',
    '-req',
    '-in',
    f('server.csr'),
    '-CA',
    f('ca.crt'),
    '-CAkey',
    f('ca.key'),
    '-CAcreateserial',
    '-out',
    f('server.crt'),
    '-days',
    '1',
    '-extfile',
    f('server.ext'),
  );
  ssl('req', ...ec, '-keyout', f('client.key'), '-out', f('client.csr'), '-subj', '/CN=kube-ovn-controller');
  ssl('x509', '-req', '-in', f('client.csr'), '-CA', f('ca.crt'), '-CAkey', f('ca.key'), '-CAcreateserial', '-out', f('client.crt'), '-days', '1');
  return {
    ca: f('ca.crt'),
    caKey: f('ca.key'),
    serverCert: f('server.crt'),
    serverKey: f('server.key'),
    clientCert: f('client.crt'),
    clientKey: f('client.key'),
  };
}

describe('the API over TCP', () => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  const token = `tok-${randomBytes(24).toString('hex')}`;
  const base = `http://${ADDR.gw}:${PORT}`;

  beforeAll(async () => {
    topo = await createTopology();
    writeFileSync(join(topo.stateDir, 'token'), `${token}\n`, { mode: 0o600 });
  });
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
  });

  it('refuses to listen on TCP with neither a token file nor TLS client verification', async () => {
    Object.assign(topo.env, { NATGW_LISTEN: `${ADDR.gw}:${PORT}` });
    const r = await topo.natgw('serve');
    delete topo.env.NATGW_LISTEN;
    expect(r.exitCode).not.toBe(0);
    expect(r.stderr).toContain('NATGW_TOKEN_FILE');
    expect(r.stderr).toContain('NATGW_TLS_CLIENT_CA');
    expect(existsSync(socketOf(topo))).toBe(false);
  });

  it('answers 401 without the token and 200 with it; the probes are open', async () => {
    daemon = await startDaemon(topo, { NATGW_LISTEN: `${ADDR.gw}:${PORT}`, NATGW_TOKEN_FILE: join(topo.stateDir, 'token') });
    ok(await api(socketOf(topo), 'POST', '/v1/legacy', { command: 'init', rules: [] }), 'init');

    expect((await call(topo, `${base}/healthz`)).status).toBe(200);
    expect([200, 503]).toContain((await call(topo, `${base}/readyz`)).status);
    for (const path of ['/v1/state', '/v1/dnats', '/metrics']) {
      expect((await call(topo, `${base}${path}`)).status, path).toBe(401);
      expect((await call(topo, `${base}${path}`, { token: 'wrong' })).status, path).toBe(401);
      expect((await call(topo, `${base}${path}`, { token })).status, path).toBe(200);
    }
    expect((await call(topo, `${base}/v1/legacy`, { method: 'POST' })).status).toBe(401);
    const help = await call(topo, `${base}/v1/legacy`, { method: 'POST', token });
    expect(help.status).toBe(200);
    expect(JSON.parse(help.body)).toMatchObject({ status: 0, stderr: '' });
    // The Unix socket needs no token.
    expect((await api(socketOf(topo), 'GET', '/v1/state')).status).toBe(200);
    expect(await stopDaemon(daemon)).toBe(0);
    daemon = undefined;
  });

  it.skipIf(!hasOpenssl())('with TLS client verification: a verified client certificate is enough, none is 401', async () => {
    const c = makeCerts(topo.stateDir);
    daemon = await startDaemon(topo, {
      NATGW_LISTEN: `${ADDR.gw}:${PORT}`,
      NATGW_TLS_CERT: c.serverCert,
      NATGW_TLS_KEY: c.serverKey,
      NATGW_TLS_CLIENT_CA: c.ca,
    });
    const tls = `https://${ADDR.gw}:${PORT}`;
    expect((await call(topo, `${tls}/healthz`, { ca: c.ca })).status).toBe(200);
    expect((await call(topo, `${tls}/v1/state`, { ca: c.ca })).status).toBe(401);
    expect((await call(topo, `${tls}/v1/state`, { ca: c.ca, cert: c.clientCert, key: c.clientKey })).status).toBe(200);
    // A certificate from another CA does not count.
    const otherDir = join(topo.stateDir, 'other-ca');
    mkdirSync(otherDir);
    const other = makeCerts(otherDir);
    expect((await call(topo, `${tls}/v1/state`, { ca: c.ca, cert: other.clientCert, key: other.clientKey })).status).toBe(401);
  });
});
