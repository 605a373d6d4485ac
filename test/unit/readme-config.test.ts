/**
 * The README's configuration table is generated from the config schema: a key added, removed or
 * re-described in src/config/config.ts without `npm run docs:config` fails here, and so does a
 * key without a description or missing from nat-gateway.env.example.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { CONFIG_TABLE_BEGIN, CONFIG_TABLE_END, configKeyDocs, renderConfigTable, withConfigTable } from '../../scripts/configDoc.js';
import { configSchema } from '../../src/config/config.js';

const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
const example = readFileSync(new URL('../../nat-gateway.env.example', import.meta.url), 'utf8');

describe('README configuration table', () => {
  it('is exactly the table the schema renders (run `npm run docs:config` after changing a key)', () => {
    expect(readme).toContain(CONFIG_TABLE_BEGIN);
    expect(readme).toContain(CONFIG_TABLE_END);
    expect(withConfigTable(readme)).toBe(readme);
  });

  it('documents every key the schema reads, each with a description and its values', () => {
    const docs = configKeyDocs();
    for (const key of Object.keys(configSchema.shape)) {
      const doc = docs.find((d) => d.key === key);
      expect(doc, key).toBeDefined();
      expect(doc?.description.length, `${key} has no describe() text`).toBeGreaterThan(10);
      expect(doc?.values, `${key} has no meta({ values })`).not.toBe('text');
      expect(renderConfigTable(), key).toContain(`| \`${key}\` |`);
    }
  });

  it('shows defaults as a user writes them (a duration as 30s, not milliseconds)', () => {
    const byKey = new Map(configKeyDocs().map((d) => [d.key, d]));
    expect(byKey.get('NATGW_RESYNC_PERIOD')?.default).toBe('`30s`');
    expect(byKey.get('NATGW_BODY_LIMIT')?.default).toBe('`64mb`');
    expect(byKey.get('GATEWAY_NETFILTER_MODE')?.values).toContain('`iptables`');
  });

  it('every key the env file may hold is in nat-gateway.env.example', () => {
    for (const key of Object.keys(configSchema.shape)) expect(example, key).toMatch(new RegExp(`^#?${key}=`, 'm'));
  });
});
