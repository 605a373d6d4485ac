/**
 * The CLI client loads node:https only for an https: --server (a dynamic import in src/cli/client.ts): such a
 * request still speaks TLS. The server's certificate is self-signed, so the client's refusal
 * names it: a TLS handshake happened (plain HTTP to this server would fail otherwise).
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { request } from '../../src/cli/client.js';
import { hasOpenssl } from '../helpers/openssl.js';

const dir = mkdtempSync(join(tmpdir(), 'natgw-https-client-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('the CLI client over https:', () => {
  it.skipIf(!hasOpenssl())('makes a TLS connection (and refuses a self-signed certificate)', async () => {
    const [key, cert] = [join(dir, 'k.pem'), join(dir, 'c.pem')];
    execFileSync(
      'openssl',
      [
        'req',
        '-x509',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:prime256v1',
        '-nodes',
        '-keyout',
        key,
        '-out',
        cert,
        '-days',
        '1',
        '-subj',
        '/CN=127.0.0.1',
      ],
      {
        stdio: 'ignore',
      },
    );
    const server = https.createServer({ key: readFileSync(key), cert: readFileSync(cert) }, (_req, res) => res.end('{}'));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      const url = new URL(`https://127.0.0.1:${(server.address() as AddressInfo).port}`);
      await expect(request({ kind: 'tcp', url }, 'GET', '/healthz')).rejects.toThrow(/self[- ]signed certificate/);
    } finally {
      server.close();
    }
  });
});
