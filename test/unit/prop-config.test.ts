/**
 * Property tests (fast-check) of every configuration key (the keys documented in
 * nat-gateway.env.example, so a new key is covered as soon as it is documented) and of the env
 * file parser: an arbitrary value, from the environment or from the env file, either loads or
 * stops with a ConfigError that names the key on one line; the env file is parsed, never
 * executed; valid durations round-trip.
 */
import fc from 'fast-check';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config/config.js';
import { parseEnvFile } from '../../src/config/envFile.js';
import { REPO_ROOT } from '../helpers/netns.js';

const RUNS = Number(process.env.NATGW_PROP_RUNS ?? 100);
const dir = mkdtempSync(path.join(tmpdir(), 'natgw-propcfg-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const KEYS = [
  ...new Set(
    readFileSync(path.join(REPO_ROOT, 'nat-gateway.env.example'), 'utf8')
      .split('\n')
      .map((l) => /^#?\s*([A-Z][A-Z0-9_]+)=/.exec(l)?.[1])
      .filter((k): k is string => k !== undefined && k !== 'NATGW_ENV_FILE'),
  ),
];

const value = fc.oneof(
  fc.string({ maxLength: 30 }),
  fc.string({ unit: 'binary', maxLength: 20 }),
  fc.constantFrom('0', '-1', '1e9', '0x10', '30s', '500ms', '2m', '1h', '99999d', '1b', '1kb', '64mb', '2gb', 'NaN', 'true', 'maybe', ''),
  fc.constantFrom('$(touch /tmp/natgw-pwned)', '`id`', 'eth0;reboot', 'a'.repeat(16), '::ffff:1.2.3.4', 'FD00::1', '010.0.0.1', 'nftables\n', ' auto '),
);

async function outcome(env: Record<string, string>): Promise<'ok' | string> {
  try {
    await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'absent.env'), ...env });
    return 'ok';
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as Error).message;
  }
}

describe('configuration keys with arbitrary values', () => {
  it('the example documents the keys natgw reads', () => {
    expect(KEYS.length).toBeGreaterThanOrEqual(20);
    for (const k of ['GATEWAY_NETFILTER_MODE', 'NATGW_RESYNC_PERIOD', 'NATGW_BODY_LIMIT', 'VPC_INTERFACE']) expect(KEYS).toContain(k);
  });

  it.each(KEYS)('%s from the environment: loads, or a ConfigError naming the key on one line', async (key) => {
    await fc.assert(
      fc.asyncProperty(value, async (v) => {
        // The environment cannot hold a NUL; the env file can (below).
        fc.pre(!v.includes('\0'));
        const r = await outcome({ [key]: v });
        if (r !== 'ok') {
          expect(r).toContain(key);
          expect(r).not.toMatch(/\n/);
        }
      }),
      { numRuns: RUNS },
    );
  });

  it.each(KEYS)('%s from the env file: loads, or a ConfigError naming the key; the file is never executed', async (key) => {
    const file = path.join(dir, `${key}.env`);
    await fc.assert(
      fc.asyncProperty(value, fc.constantFrom('', '"', "'"), async (v, q) => {
        writeFileSync(file, `# generated\n${key}=${q}${v}${q}\n`);
        let r: string;
        try {
          await loadConfig({ NATGW_ENV_FILE: file });
          r = 'ok';
        } catch (e) {
          expect(e).toBeInstanceOf(ConfigError);
          r = (e as Error).message;
        }
        if (r !== 'ok') {
          expect(r).toContain(key);
          expect(r).not.toMatch(/\n/);
        }
      }),
      { numRuns: RUNS },
    );
  });

  it('parseEnvFile takes arbitrary text without throwing and returns only KEY=value pairs', () => {
    fc.assert(
      fc.property(
        fc.oneof(
          fc.string({ maxLength: 200 }),
          fc.array(fc.tuple(fc.constantFrom(...KEYS, 'X', 'export X', ''), value), { maxLength: 5 }).map((ls) => ls.map(([k, v]) => `${k}=${v}`).join('\n')),
        ),
        (text) => {
          const out = parseEnvFile(text);
          for (const k of Object.keys(out)) expect(k).toMatch(/^[A-Za-z_][A-Za-z0-9_]*$/);
          for (const v of Object.values(out)) expect(typeof v).toBe('string');
        },
      ),
      { numRuns: RUNS * 5 },
    );
  });

  it('durations round-trip within their bounds and are refused outside them', async () => {
    await fc.assert(
      fc.asyncProperty(fc.integer({ min: 0, max: 100_000_000 }), fc.constantFrom('ms', 's', 'm'), async (n, unit) => {
        const ms = n * { ms: 1, s: 1000, m: 60_000 }[unit];
        const r = await outcome({ NATGW_RESYNC_PERIOD: `${n}${unit}` });
        const inBounds = ms >= 100 && ms <= 86_400_000;
        if (inBounds) {
          expect(r).toBe('ok');
          const c = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'absent.env'), NATGW_RESYNC_PERIOD: `${n}${unit}` });
          expect(c.resyncMs).toBe(ms);
        } else expect(r).toContain('NATGW_RESYNC_PERIOD');
      }),
      { numRuns: RUNS },
    );
  });
});
