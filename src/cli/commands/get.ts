import { stringify } from 'yaml';
import { RESOURCES, type ResourceDef } from '../../api/resources.js';
import { CliError, requestJson } from '../client.js';
import { renderItems } from '../render.js';
import { CONNECTION_OPTIONS, parseOptions, targetOf, type Io } from './common.js';
import { commandHelp } from './help.js';

const norm = (s: string): string => s.toLowerCase().replace(/[-_]/g, '');

/** A kind by its API path, its state key or either in the singular: dnat, dnats, share-dnat, shareDnats, eip-qos. */
export function kindOf(name: string): ResourceDef | undefined {
  const n = norm(name);
  return RESOURCES.find((d) => [d.path, d.stateKey].some((k) => norm(k) === n || norm(k).replace(/s$/, '') === n));
}

export const KIND_NAMES = [...RESOURCES.map((d) => d.path), 'state'];

/** `natgw get <kind> [--json]`, `natgw get state [--yaml]`: what the daemon holds as desired. */
export async function get(args: readonly string[], io: Io): Promise<number> {
  const { values, positionals } = parseOptions('get', args, { ...CONNECTION_OPTIONS, json: { type: 'boolean' }, yaml: { type: 'boolean' } }, true);
  if (values.help) {
    io.out(commandHelp('get'));
    return 0;
  }
  const [name, ...extra] = positionals;
  if (name === undefined) throw new CliError(`natgw get: which kind? One of: ${KIND_NAMES.join(', ')}\nSee 'natgw get --help'.`, 2);
  if (extra.length) throw new CliError(`natgw get: one kind at a time (got ${positionals.join(' ')})`, 2);
  if (values.json && values.yaml) throw new CliError('--json and --yaml exclude each other', 2);
  const target = await targetOf(values, io.env);
  if (norm(name) === 'state') {
    // The document apply -f takes back: only `desired` counts there.
    const doc = await requestJson<{ desired: unknown }>(target, 'GET', '/v1/state');
    io.out(values.yaml ? stringify({ desired: doc.desired }) : `${JSON.stringify({ desired: doc.desired }, null, 2)}\n`);
    return 0;
  }
  const def = kindOf(name);
  if (!def) throw new CliError(`natgw get: unknown kind '${name}'; one of: ${KIND_NAMES.join(', ')}`, 2);
  const { items } = await requestJson<{ items: Record<string, unknown>[] }>(target, 'GET', `/v1/${def.path}`);
  if (values.json) io.out(`${JSON.stringify(items, null, 2)}\n`);
  else if (values.yaml) io.out(stringify(items));
  else io.out(renderItems(def, items));
  return 0;
}
