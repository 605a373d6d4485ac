/**
 * The shim's bash reading of NATGW_SOCKET agrees with natgw's own (socketPathFromEnv): env file
 * over environment over default, the env file's quoting, comments and `export`, last
 * assignment winning, and nothing in the file ever executed. A disagreement would send the
 * nc client to another socket than the one Node.js would use.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { socketPathFromEnv } from '../../src/config/socketPath.js';
import { REPO_ROOT } from '../helpers/netns.js';

const SHIM = join(REPO_ROOT, 'image', 'nat-gateway.sh');
const dir = mkdtempSync(join(tmpdir(), 'natgw-shim-socket-'));
const pwned = join(dir, 'pwned');

/** natgw_socket() alone, lifted out of the shim (running the whole shim would exec node). */
function bashSocket(env: Record<string, string>): string {
  const shim = readFileSync(SHIM, 'utf8');
  const fn = /^natgw_socket\(\) \{\n[\s\S]*?\n\}\n/m.exec(shim)?.[0];
  if (!fn) throw new Error('natgw_socket() not found in the shim');
  // stdin not a socket: bash would take that for rshd and source ~/.bashrc.
  return execFileSync('bash', ['-c', `${fn}\nnatgw_socket\nprintf %s "$REPLY"`], {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env },
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}

const FILES: readonly (string | undefined)[] = [
  undefined,
  '',
  'NATGW_SOCKET=/run/a.sock\n',
  'NATGW_SOCKET=/run/a.sock',
  'VPC_INTERFACE=eth0\nNATGW_SOCKET=/run/a.sock\nNATGW_SOCKET=/run/b.sock\n',
  'NATGW_SOCKET=/run/a.sock\nNATGW_SOCKET=\n',
  '# NATGW_SOCKET=/run/commented.sock\n',
  '  export   NATGW_SOCKET  =   /run/spaced.sock   \n',
  'NATGW_SOCKET="/run/dq sock.sock"\n',
  "NATGW_SOCKET='/run/sq sock.sock'\n",
  'NATGW_SOCKET="/run/\\"esc\\" \\\\ \\$x \\`y\\` \\n.sock"\n',
  'NATGW_SOCKET=\'/run/$(x) \\"raw\\".sock\'\n',
  'NATGW_SOCKET=/run/a.sock # a comment\n',
  'NATGW_SOCKET=/run/a#b.sock\t#\tcomment # more\n',
  'NATGW_SOCKET="/run/quoted # not a comment"\n',
  'NATGW_SOCKET="/run/unterminated.sock\n',
  'NATGW_SOCKET="/run/dq.sock" # a comment\n',
  "NATGW_SOCKET='/run/sq.sock'\t# a comment\n",
  'NATGW_SOCKET="/run/\\"esc\\".sock"  # a comment with "quotes"\n',
  'NATGW_SOCKET="/run/a.sock"trailing # not a whole quoted value\n',
  'NATGW_SOCKET="\n',
  'NATGW_SOCKET=""\n',
  'NATGW_SOCKET=/run/crlf.sock\r\n',
  'NATGW_SOCKET_EXTRA=/run/other.sock\nXNATGW_SOCKET=/run/x.sock\nexportNATGW_SOCKET=/run/y.sock\n',
  `NATGW_SOCKET=$(touch ${pwned})\n`,
  `NATGW_SOCKET="$(touch ${pwned})"\n`,
  `NATGW_SOCKET=\`touch ${pwned}\`; touch ${pwned}\n`,
  '\u00e9t\u00e9=1\nNATGW_SOCKET=/run/\u00e9t\u00e9.sock\n',
];
const ENVS: readonly Record<string, string>[] = [{}, { NATGW_SOCKET: '/env/natgw.sock' }, { NATGW_SOCKET: '' }];

afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("the shim's socket path", () => {
  it('is the one natgw resolves, for every env file and environment', async () => {
    let n = 0;
    for (const content of FILES) {
      for (const base of ENVS) {
        const file = join(dir, `env-${n++}`);
        if (content !== undefined) writeFileSync(file, content);
        for (const env of [
          { ...base, NATGW_ENV_FILE: file },
          { ...base, NATGW_ENV_FILE: `  ${file}\t` },
        ]) {
          const want = await socketPathFromEnv(env);
          expect(bashSocket(env), JSON.stringify({ content, env })).toBe(want);
        }
      }
    }
    expect(existsSync(pwned)).toBe(false);
  });

  it('falls back to the default env file, and to the default socket', async () => {
    // The default file (/etc/kube-ovn/nat-gateway.env) may exist on this machine: compare, not assume.
    const envs: Record<string, string>[] = [{}, { NATGW_ENV_FILE: '' }, { NATGW_ENV_FILE: '   ' }, { NATGW_SOCKET: '/env/natgw.sock' }];
    for (const env of envs) {
      expect(bashSocket(env), JSON.stringify(env)).toBe(await socketPathFromEnv(env));
    }
    expect(bashSocket({ NATGW_ENV_FILE: join(dir, 'absent') })).toBe('/run/natgw/natgw.sock');
  });
});
