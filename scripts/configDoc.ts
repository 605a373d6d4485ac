import { z } from 'zod';
import { configSchema, DEFAULT_ENV_FILE } from '../src/config/config.js';

/** One documented configuration key, as the README's table shows it. */
export interface KeyDoc {
  readonly key: string;
  readonly default: string;
  readonly values: string;
  readonly description: string;
}

/**
 * Every key natgw reads, documented from the schema itself (scripts/config-table.ts renders it):
 * the JSON Schema of what a key accepts carries its default, its `meta({ values })` (else its
 * enum) and its `describe()` text.
 */
export function configKeyDocs(): KeyDoc[] {
  const docs = Object.entries(configSchema.shape).map(([key, schema]): KeyDoc => {
    const j = z.toJSONSchema(schema, { io: 'input', unrepresentable: 'any' });
    const values = typeof j.values === 'string' ? j.values : j.enum ? j.enum.map((v) => `\`${String(v)}\``).join(' \\| ') : 'text';
    return { key, default: j.default === undefined ? 'unset' : `\`${String(j.default)}\``, values, description: j.description ?? '' };
  });
  // Read from the environment only, before the env file is found: not a key of the schema.
  docs.push({ key: 'NATGW_ENV_FILE', default: `\`${DEFAULT_ENV_FILE}\``, values: 'a path', description: 'Where the env file is. Environment only.' });
  return docs;
}

/** The README's configuration table, as Markdown. */
export function renderConfigTable(docs: readonly KeyDoc[] = configKeyDocs()): string {
  const cell = (s: string) => s.replace(/\n/g, ' ');
  return [
    '| key | default | values | what it does |',
    '|---|---|---|---|',
    ...docs.map((d) => `| \`${d.key}\` | ${cell(d.default)} | ${cell(d.values)} | ${cell(d.description)} |`),
  ].join('\n');
}

export const CONFIG_TABLE_BEGIN = '<!-- config-table: generated from src/config/config.ts by `npm run docs:config`; do not edit -->';
export const CONFIG_TABLE_END = '<!-- config-table: end -->';

/** The README with its table replaced by the one the schema gives (throws when the markers are missing). */
export function withConfigTable(readme: string): string {
  const begin = readme.indexOf(CONFIG_TABLE_BEGIN);
  const end = readme.indexOf(CONFIG_TABLE_END);
  if (begin < 0 || end < begin) throw new Error('README has no configuration table markers');
  return `${readme.slice(0, begin + CONFIG_TABLE_BEGIN.length)}\n${renderConfigTable()}\n${readme.slice(end)}`;
}
