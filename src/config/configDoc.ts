import { z } from 'zod';
import { configSchema, ENV_ONLY_KEYS } from './config.js';

/** One documented configuration key, as the README's table shows it. */
export interface KeyDoc {
  readonly key: string;
  readonly default: string;
  readonly values: string;
  readonly description: string;
}

interface Layer {
  readonly _zod: { readonly def: Record<string, unknown> };
}

/** The schema and what it wraps (default, prefault, optional, pipe ends), outermost first. */
function layers(schema: Layer): Layer[] {
  const out: Layer[] = [];
  const queue: Layer[] = [schema];
  for (let s = queue.shift(); s; s = queue.shift()) {
    out.push(s);
    const def = s._zod.def;
    for (const k of ['innerType', 'in', 'out']) if (def[k] && typeof def[k] === 'object') queue.push(def[k] as Layer);
  }
  return out;
}

function describeValues(all: Layer[]): string {
  for (const l of all) {
    const values = z.globalRegistry.get(l as unknown as z.ZodType)?.values;
    if (typeof values === 'string') return values;
  }
  for (const l of all)
    if (l._zod.def.type === 'enum')
      return Object.values(l._zod.def.entries as Record<string, string>)
        .map((v) => `\`${v}\``)
        .join(' \\| ');
  return 'text';
}

function describeDefault(all: Layer[]): string {
  for (const l of all) {
    const def = l._zod.def;
    if (def.type === 'default' || def.type === 'prefault') return `\`${String(def.defaultValue)}\``;
  }
  return 'unset';
}

/** Every key natgw reads, documented from the schema itself (scripts/config-table.ts renders it). */
export function configKeyDocs(): KeyDoc[] {
  const docs = Object.entries(configSchema.shape).map(([key, schema]): KeyDoc => {
    const all = layers(schema as unknown as Layer);
    return { key, default: describeDefault(all), values: describeValues(all), description: (schema as unknown as z.ZodType).description ?? '' };
  });
  for (const [key, d] of Object.entries(ENV_ONLY_KEYS))
    docs.push({ key, default: `\`${d.default}\``, values: d.values, description: `${d.description} Environment only.` });
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
