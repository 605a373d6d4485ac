/**
 * Configuration (SPEC §4.3): the env file is parsed, never executed; defaults < environment
 * < env file; an invalid value stops start-up with a message naming the key.
 */
import { mkdir, mkdtemp, readFile, readdir, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, DEFAULT_ENV_FILE, loadConfig } from '../../src/config/config.js';
import { parseDuration } from '../../src/config/config.js';
import { parseEnvFile, readEnvFile, updateEnvFile } from '../../src/config/envFile.js';

let dir = '';
let n = 0;
beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'natgw-core-config-'));
});
afterAll(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** A fresh file path in the temp dir, optionally with content. */
async function envFile(content?: string): Promise<string> {
  const f = path.join(dir, `env-${++n}`, 'nat-gateway.env');
  if (content !== undefined) {
    await mkdir(path.dirname(f), { recursive: true });
    await writeFile(f, content);
  }
  return f;
}

describe('parseDuration', () => {
  it('units and bare seconds', () => {
    expect(parseDuration('500ms')).toBe(500);
    expect(parseDuration('30s')).toBe(30_000);
    expect(parseDuration('2m')).toBe(120_000);
    expect(parseDuration('1h')).toBe(3_600_000);
    expect(parseDuration('45')).toBe(45_000);
    expect(parseDuration('0')).toBe(0);
    expect(parseDuration('0s')).toBe(0);
  });

  it('decimals and surrounding whitespace', () => {
    expect(parseDuration('1.5s')).toBe(1500);
    expect(parseDuration('0.25m')).toBe(15_000);
    expect(parseDuration(' 30s ')).toBe(30_000);
    expect(parseDuration('10 ms')).toBe(10);
  });

  it('malformed → null', () => {
    for (const bad of ['', 'abc', '-1s', '10x', 's', '1e3', '1,5s', '.5s', '5.s', '30S', '30sec', '1h30m', 'NaN', 'Infinity', '30s;id']) {
      expect(parseDuration(bad), bad).toBeNull();
    }
  });
});

describe('parseEnvFile', () => {
  it('reads a quoted value followed by an inline comment as bash does', () => {
    expect(parseEnvFile('GATEWAY_V4="10.0.0.1" # gw\nGATEWAY_V6=\'fd00::1\'\t# v6\nA="x # y"\nB="unterminated # c\n')).toEqual({
      GATEWAY_V4: '10.0.0.1',
      GATEWAY_V6: 'fd00::1',
      A: 'x # y',
      B: '"unterminated',
    });
  });

  it('KEY=VALUE, comments, blank lines, export, quotes', () => {
    const text = [
      '# a comment',
      '',
      '   # an indented comment',
      'VPC_INTERFACE=eth0',
      'export EXTERNAL_INTERFACE=net1',
      'GATEWAY_V4="172.18.0.1"',
      "GATEWAY_V6='fd00::1'",
      '  SPACED  =  value  ',
      'EMPTY=',
      'EMPTY_Q=""',
      'INLINE=abc # trailing comment',
      'HASH_IN_QUOTES="a # b"',
      'HASH_NO_SPACE=a#b',
      'ESCAPED="say \\"hi\\" \\$HOME \\\\"',
      'SINGLE=\'no \\"escapes\\" here\'',
      'EQ=a=b=c',
      'not a line at all',
      '1BAD=x',
      'CRLF=value\r',
    ].join('\n');
    expect(parseEnvFile(text)).toEqual({
      VPC_INTERFACE: 'eth0',
      EXTERNAL_INTERFACE: 'net1',
      GATEWAY_V4: '172.18.0.1',
      GATEWAY_V6: 'fd00::1',
      SPACED: 'value',
      EMPTY: '',
      EMPTY_Q: '',
      INLINE: 'abc',
      HASH_IN_QUOTES: 'a # b',
      HASH_NO_SPACE: 'a#b',
      ESCAPED: 'say "hi" $HOME \\',
      SINGLE: 'no \\"escapes\\" here',
      EQ: 'a=b=c',
      CRLF: 'value',
    });
  });

  it('never executes anything: command substitutions stay text', () => {
    expect(parseEnvFile('X=$(touch /tmp/pwned)\nY=`id`\n')).toEqual({ X: '$(touch /tmp/pwned)', Y: '`id`' });
  });

  it('the last assignment of a key wins (as when sourced)', () => {
    expect(parseEnvFile('A=1\nA=2\n')).toEqual({ A: '2' });
  });

  it('empty text → empty object', () => {
    expect(parseEnvFile('')).toEqual({});
  });

  it('readEnvFile of a missing file → empty object', async () => {
    expect(await readEnvFile(path.join(dir, 'does-not-exist', 'x.env'))).toEqual({});
  });
});

describe('updateEnvFile', () => {
  it('creates the file (and its directory) when missing', async () => {
    const f = await envFile();
    await updateEnvFile(f, { VPC_INTERFACE: 'net1', EXTERNAL_INTERFACE: 'net2' });
    expect(await readFile(f, 'utf8')).toBe('VPC_INTERFACE=net1\nEXTERNAL_INTERFACE=net2\n');
  });

  it('replaces keys in place, keeps other keys and comments, appends new keys', async () => {
    const f = await envFile(
      ['# natgw settings', 'GATEWAY_V4=172.18.0.1', 'VPC_INTERFACE=eth0', '', '# trailing comment', 'NATGW_LOG_LEVEL=debug', ''].join('\n'),
    );
    await updateEnvFile(f, { VPC_INTERFACE: 'net1', EXTERNAL_INTERFACE: 'net2' });
    expect(await readFile(f, 'utf8')).toBe(
      [
        '# natgw settings',
        'GATEWAY_V4=172.18.0.1',
        'VPC_INTERFACE=net1',
        '',
        '# trailing comment',
        'NATGW_LOG_LEVEL=debug',
        'EXTERNAL_INTERFACE=net2',
        '',
      ].join('\n'),
    );
    expect(await readEnvFile(f)).toEqual({ GATEWAY_V4: '172.18.0.1', VPC_INTERFACE: 'net1', EXTERNAL_INTERFACE: 'net2', NATGW_LOG_LEVEL: 'debug' });
  });

  it('a commented-out key is not replaced; the key is appended', async () => {
    const f = await envFile('# VPC_INTERFACE=eth9\n');
    await updateEnvFile(f, { VPC_INTERFACE: 'net1' });
    expect(await readFile(f, 'utf8')).toBe('# VPC_INTERFACE=eth9\nVPC_INTERFACE=net1\n');
  });

  it('handles export and quoted forms of an existing key', async () => {
    const f = await envFile('export VPC_INTERFACE="eth0"\nEXTERNAL_INTERFACE=\'net1\'\n');
    await updateEnvFile(f, { VPC_INTERFACE: 'net3', EXTERNAL_INTERFACE: 'net4' });
    expect(await readEnvFile(f)).toEqual({ VPC_INTERFACE: 'net3', EXTERNAL_INTERFACE: 'net4' });
    expect((await readFile(f, 'utf8')).split('\n')).toHaveLength(3);
  });

  it('a file without a final newline', async () => {
    const f = await envFile('A=1');
    await updateEnvFile(f, { B: '2' });
    expect(await readFile(f, 'utf8')).toBe('A=1\nB=2\n');
  });

  it('is idempotent and leaves no temp file behind', async () => {
    const f = await envFile('A=1\n');
    await updateEnvFile(f, { A: '2' });
    const once = await readFile(f, 'utf8');
    await updateEnvFile(f, { A: '2' });
    expect(await readFile(f, 'utf8')).toBe(once);
    expect(await readdir(path.dirname(f))).toEqual(['nat-gateway.env']);
    expect((await stat(f)).isFile()).toBe(true);
  });

  // BUG (src/config/envFile.ts, updateEnvFile): only the FIRST line of a key is rewritten,
  // while parseEnvFile (like the shell sourcing it) lets the LAST assignment win, so with a
  // duplicated key the update is silently ineffective. Fix: rewrite every assignment of the
  // key (or drop the later ones), e.g. keep `pending` until the loop ends and replace all
  // matching lines.
  it('with a key assigned twice, the updated value is the one read back', async () => {
    const f = await envFile('VPC_INTERFACE=eth0\nVPC_INTERFACE=eth1\n');
    await updateEnvFile(f, { VPC_INTERFACE: 'net1' });
    expect((await readEnvFile(f)).VPC_INTERFACE).toBe('net1');
  });
});

describe('loadConfig', () => {
  it('defaults (env file absent)', async () => {
    const f = await envFile();
    const c = await loadConfig({ NATGW_ENV_FILE: f });
    expect(c).toMatchObject({
      envFile: f,
      vpcInterface: 'eth0',
      extInterface: 'net1',
      qosDebug: false,
      mode: 'auto',
      iptablesVariant: 'auto',
      interfaceWaitMs: 30_000,
      stateDir: '/var/lib/natgw',
      socket: '/run/natgw/natgw.sock',
      resyncMs: 30_000,
      logLevel: 'info',
      autostart: true,
    });
    expect(c.gatewayV4).toBeUndefined();
    expect(c.gatewayV6).toBeUndefined();
    expect(c.listen).toBeUndefined();
    expect(c.tokenFile).toBeUndefined();
  });

  it('the default env file path is /etc/kube-ovn/nat-gateway.env', () => {
    expect(DEFAULT_ENV_FILE).toBe('/etc/kube-ovn/nat-gateway.env');
  });

  it('environment overrides defaults', async () => {
    const f = await envFile();
    const c = await loadConfig({
      NATGW_ENV_FILE: f,
      VPC_INTERFACE: 'net0',
      EXTERNAL_INTERFACE: 'net9',
      GATEWAY_V4: '172.18.0.1',
      GATEWAY_V6: 'fd00::1',
      QOS_DEBUG: 'true',
      GATEWAY_NETFILTER_MODE: 'iptables',
      NATGW_IPTABLES_VARIANT: 'legacy',
      NATGW_INTERFACE_WAIT_TIMEOUT: '5s',
      NATGW_STATE_DIR: '/tmp/s',
      NATGW_SOCKET: '/tmp/s/sock',
      NATGW_RESYNC_PERIOD: '500ms',
      NATGW_LOG_LEVEL: 'debug',
      NATGW_AUTOSTART: 'false',
      NATGW_LISTEN: '0.0.0.0:8443',
      NATGW_TOKEN_FILE: '/tmp/s/token',
    });
    expect(c).toMatchObject({
      vpcInterface: 'net0',
      extInterface: 'net9',
      gatewayV4: '172.18.0.1',
      gatewayV6: 'fd00::1',
      qosDebug: true,
      mode: 'iptables',
      iptablesVariant: 'legacy',
      interfaceWaitMs: 5000,
      stateDir: '/tmp/s',
      socket: '/tmp/s/sock',
      resyncMs: 500,
      logLevel: 'debug',
      autostart: false,
      listen: '0.0.0.0:8443',
      tokenFile: '/tmp/s/token',
    });
  });

  it('the env file overrides the environment (the script sourced it after the environment)', async () => {
    const f = await envFile('VPC_INTERFACE=fromfile0\nGATEWAY_NETFILTER_MODE=nftables\nNATGW_RESYNC_PERIOD=2m\n');
    const c = await loadConfig({ NATGW_ENV_FILE: f, VPC_INTERFACE: 'fromenv0', EXTERNAL_INTERFACE: 'fromenv1', GATEWAY_NETFILTER_MODE: 'iptables' });
    expect(c.vpcInterface).toBe('fromfile0');
    expect(c.extInterface).toBe('fromenv1');
    expect(c.mode).toBe('nftables');
    expect(c.resyncMs).toBe(120_000);
  });

  it('empty gateways (the controller sets both, either may be empty) mean none', async () => {
    const f = await envFile();
    const c = await loadConfig({ NATGW_ENV_FILE: f, GATEWAY_V4: '', GATEWAY_V6: '  ' });
    expect(c.gatewayV4).toBeUndefined();
    expect(c.gatewayV6).toBeUndefined();
  });

  it('boolean spellings for NATGW_AUTOSTART', async () => {
    const f = await envFile();
    for (const [v, want] of [
      ['true', true],
      ['1', true],
      ['yes', true],
      ['ON', true],
      ['false', false],
      ['0', false],
      ['no', false],
      ['off', false],
    ] as const) {
      expect((await loadConfig({ NATGW_ENV_FILE: f, NATGW_AUTOSTART: v })).autostart, v).toBe(want);
    }
  });

  it('NATGW_ENV_FILE is read from the environment only', async () => {
    const other = await envFile('VPC_INTERFACE=other0\n');
    const f = await envFile(`NATGW_ENV_FILE=${other}\n`);
    const c = await loadConfig({ NATGW_ENV_FILE: f });
    expect(c.envFile).toBe(f);
    expect(c.vpcInterface).toBe('eth0');
  });

  async function rejects(env: Record<string, string>, key: string, file?: string): Promise<void> {
    const f = await envFile(file);
    let err: unknown;
    try {
      await loadConfig({ NATGW_ENV_FILE: f, ...env });
    } catch (e) {
      err = e;
    }
    expect(err, `${key} should be rejected`).toBeInstanceOf(ConfigError);
    expect((err as Error).message).toContain(key);
    expect((err as Error).message).not.toMatch(/\n/);
  }

  it('invalid values throw a ConfigError naming the key', async () => {
    await rejects({ GATEWAY_NETFILTER_MODE: 'foo' }, 'GATEWAY_NETFILTER_MODE');
    await rejects({ NATGW_RESYNC_PERIOD: 'abc' }, 'NATGW_RESYNC_PERIOD');
    await rejects({ NATGW_INTERFACE_WAIT_TIMEOUT: '-5s' }, 'NATGW_INTERFACE_WAIT_TIMEOUT');
    await rejects({ VPC_INTERFACE: 'a b' }, 'VPC_INTERFACE');
    await rejects({ EXTERNAL_INTERFACE: 'net1;id' }, 'EXTERNAL_INTERFACE');
    await rejects({ EXTERNAL_INTERFACE: 'averyveryverylongname' }, 'EXTERNAL_INTERFACE');
    await rejects({ GATEWAY_V4: '1.2.3' }, 'GATEWAY_V4');
    await rejects({ GATEWAY_V4: 'fd00::1' }, 'GATEWAY_V4');
    await rejects({ GATEWAY_V6: '1.2.3.4' }, 'GATEWAY_V6');
    await rejects({ NATGW_IPTABLES_VARIANT: 'nf_tables' }, 'NATGW_IPTABLES_VARIANT');
    await rejects({ NATGW_LOG_LEVEL: 'loud' }, 'NATGW_LOG_LEVEL');
    await rejects({ NATGW_AUTOSTART: 'maybe' }, 'NATGW_AUTOSTART');
  });

  it('durations and sizes have bounds: no resync storm, no clamped timer, no body limit of one byte', async () => {
    await rejects({ NATGW_RESYNC_PERIOD: '0' }, 'NATGW_RESYNC_PERIOD');
    await rejects({ NATGW_RESYNC_PERIOD: '10ms' }, 'NATGW_RESYNC_PERIOD');
    await rejects({ NATGW_RESYNC_PERIOD: '25d' }, 'NATGW_RESYNC_PERIOD');
    await rejects({ NATGW_RESYNC_PERIOD: '600h' }, 'NATGW_RESYNC_PERIOD');
    await rejects({ NATGW_INTERFACE_WAIT_TIMEOUT: '2h' }, 'NATGW_INTERFACE_WAIT_TIMEOUT');
    await rejects({ NATGW_BODY_LIMIT: 'garbage' }, 'NATGW_BODY_LIMIT');
    await rejects({ NATGW_BODY_LIMIT: '1' }, 'NATGW_BODY_LIMIT');
    await rejects({ NATGW_BODY_LIMIT: '1m' }, 'NATGW_BODY_LIMIT');
    await rejects({ NATGW_BODY_LIMIT: '2gb' }, 'NATGW_BODY_LIMIT');
    const f = await envFile();
    const ok = await loadConfig({ NATGW_ENV_FILE: f, NATGW_RESYNC_PERIOD: '24h', NATGW_BODY_LIMIT: '512KB' });
    expect(ok.resyncMs).toBe(86_400_000);
    expect(ok.bodyLimit).toBe(512 * 1024);
    expect((await loadConfig({ NATGW_ENV_FILE: f })).bodyLimit).toBe(64 * 1024 * 1024);
  });

  it('SNAT port range and flow-log schema: bounded values, the kernel default range, the identity from the downward API', async () => {
    for (const v of ['20000', '0-10', '10-70000', '200-100', 'a-b', '']) await rejects({ NATGW_SNAT_PORT_RANGE: v }, 'NATGW_SNAT_PORT_RANGE');
    await rejects({ NATGW_FLOW_LOG_SCHEMA: 'aws' }, 'NATGW_FLOW_LOG_SCHEMA');
    const f = await envFile();
    const defaults = await loadConfig({ NATGW_ENV_FILE: f });
    expect(defaults.snatPortRange).toEqual({ min: 1024, max: 65535 });
    expect(defaults.flowLogSchema).toBe('natgw');
    expect(defaults.flowLogIdentity).toEqual({ namespace: '', name: '', pod: '', node: '' });
    const set = await loadConfig({
      NATGW_ENV_FILE: f,
      NATGW_SNAT_PORT_RANGE: ' 20000 - 20009 ',
      NATGW_FLOW_LOG_SCHEMA: 'kube-ovn',
      NATGW_GATEWAY_NAME: 'gw1',
      POD_NAMESPACE: 'kube-system',
      POD_NAME: 'vpc-nat-gw-gw1-0',
      NODE_NAME: 'node1',
    });
    expect(set.snatPortRange).toEqual({ min: 20000, max: 20009 });
    expect(set.flowLogSchema).toBe('kube-ovn');
    expect(set.flowLogIdentity).toEqual({ namespace: 'kube-system', name: 'gw1', pod: 'vpc-nat-gw-gw1-0', node: 'node1' });
    // A replica's slice is the range natgw's own SNAT translates into: it is the denominator.
    const sliced = await loadConfig({ NATGW_ENV_FILE: f, NATGW_SNAT_PORT_SLICE: '30000-39999', NATGW_SNAT_PORT_RANGE: '20000-20009' });
    expect(sliced.snatPortRange).toEqual({ min: 30000, max: 39999 });
  });

  it('gateways are kept as the kernel prints them, so a read-back default route compares equal', async () => {
    const f = await envFile();
    const c = await loadConfig({ NATGW_ENV_FILE: f, GATEWAY_V6: 'FD00:0::1', GATEWAY_V4: ' 172.20.0.1 ' });
    expect(c.gatewayV6).toBe('fd00::1');
    expect(c.gatewayV4).toBe('172.20.0.1');
  });

  it('an invalid value in the env file is rejected too, naming the key', async () => {
    await rejects({}, 'GATEWAY_NETFILTER_MODE', 'GATEWAY_NETFILTER_MODE=foo\n');
    await rejects({ VPC_INTERFACE: 'eth0' }, 'VPC_INTERFACE', "VPC_INTERFACE='a b'\n");
  });

  it('several invalid keys are all named', async () => {
    const f = await envFile();
    await expect(loadConfig({ NATGW_ENV_FILE: f, GATEWAY_NETFILTER_MODE: 'foo', NATGW_RESYNC_PERIOD: 'abc' })).rejects.toThrow(
      /GATEWAY_NETFILTER_MODE[\s\S]*NATGW_RESYNC_PERIOD|NATGW_RESYNC_PERIOD[\s\S]*GATEWAY_NETFILTER_MODE/,
    );
  });
});

describe('hardening keys (issue 12)', () => {
  it('bounds the tool deadline and the TCP limits, naming the key', async () => {
    const c = await loadConfig({ NATGW_ENV_FILE: '/nonexistent/natgw.env' });
    expect(c.toolTimeoutMs).toBe(30_000);
    expect(c.maxConnections).toBe(64);
    expect(c.headersTimeoutMs).toBe(10_000);
    expect(c.requestTimeoutMs).toBe(120_000);
    const bad = (env: Record<string, string>) => loadConfig({ NATGW_ENV_FILE: '/nonexistent/natgw.env', ...env });
    await expect(bad({ NATGW_TOOL_TIMEOUT: '0s' })).rejects.toThrow(/NATGW_TOOL_TIMEOUT: must be between 1s and 600s/);
    await expect(bad({ NATGW_MAX_CONNECTIONS: '0' })).rejects.toThrow(/NATGW_MAX_CONNECTIONS/);
    await expect(bad({ NATGW_MAX_CONNECTIONS: 'many' })).rejects.toThrow(/NATGW_MAX_CONNECTIONS/);
    await expect(bad({ NATGW_HEADERS_TIMEOUT: '2h' })).rejects.toThrow(/NATGW_HEADERS_TIMEOUT/);
    await expect(bad({ NATGW_SOCKET: `/run/${'x'.repeat(120)}.sock` })).rejects.toThrow(/NATGW_SOCKET: must be at most 107 bytes/);
  });
});
