import { stringify } from 'yaml';
import { RESOURCES, type ResourceDef } from '../../api/resources.js';
import { apiError, CliError, messageOf, request, requestJson, type Target } from '../client.js';
import { kindName, renderDescribe, renderItems, sameObject } from '../render.js';
import { CONNECTION_OPTIONS, OUTPUT_OPTIONS, outputOf, parseOptions, targetOf, type Io } from './common.js';
import { commandHelp } from './help.js';

const norm = (s: string): string => s.toLowerCase().replace(/[-_]/g, '');

/** A kind by its API path, its state key or either in the singular: dnat, dnats, share-dnat, shareDnats, eip-qos. */
export function kindOf(name: string): ResourceDef | undefined {
  const n = norm(name);
  return RESOURCES.find((d) => [d.path, d.stateKey].some((k) => norm(k) === n || norm(k).replace(/s$/, '') === n));
}

const KINDS = RESOURCES.map((d) => d.path).join(', ');

/** The kind named on the command line, or a usage error listing the kinds. */
function requireKind(command: string, name: string | undefined): ResourceDef {
  if (name === undefined) throw new CliError(`natgw ${command}: which kind? One of: ${KINDS}`, 2);
  const def = kindOf(name);
  if (!def) throw new CliError(`natgw ${command}: unknown kind '${name}'; one of: ${KINDS}`, 2);
  return def;
}

type Item = Record<string, unknown>;

/** GET /v1/<kind>/<id>: the object, or undefined when there is none. */
async function getOne(target: Target, def: ResourceDef, id: string): Promise<Item | undefined> {
  const a = await request(target, 'GET', `/v1/${def.path}/${encodeURIComponent(id)}`);
  if (a.status === 404) return undefined;
  if (a.status === 400) throw new CliError(`${kindName(def)} ${id}: ${messageOf(a.text)}`);
  if (a.status !== 200) throw apiError(`GET ${kindName(def)} ${id}`, a);
  return JSON.parse(a.text) as Item;
}

const notFound = (def: ResourceDef, id: string): CliError => new CliError(`${kindName(def)} "${id}" not found`);

/** `natgw get <kind> [id] [-o table|wide|json|yaml]`, `natgw get state [-o json|yaml]`: what the daemon holds as desired. */
export async function get(args: readonly string[], io: Io): Promise<number> {
  const { values, positionals } = parseOptions('get', args, { ...CONNECTION_OPTIONS, ...OUTPUT_OPTIONS }, true);
  if (values.help) {
    io.out(commandHelp('get'));
    return 0;
  }
  const [name, id, ...extra] = positionals;
  if (name === undefined) throw new CliError(`natgw get: which kind? One of: ${KINDS}, state (see 'natgw get --help')`, 2);
  if (norm(name) === 'state') {
    if (id !== undefined) throw new CliError(`natgw get state: takes no ID (got ${id})`, 2);
    const format = outputOf('get', values, ['json', 'yaml'], 'json');
    const target = await targetOf(values, io.env);
    // The document apply -f takes back: only `desired` counts there.
    const doc = await requestJson<{ desired: unknown }>(target, 'GET', '/v1/state');
    io.out(format === 'yaml' ? stringify({ desired: doc.desired }) : `${JSON.stringify({ desired: doc.desired }, null, 2)}\n`);
    return 0;
  }
  const def = requireKind('get', name);
  if (extra.length) throw new CliError(`natgw get: one kind and at most one ID (got ${positionals.join(' ')})`, 2);
  const format = outputOf('get', values, ['table', 'wide', 'json', 'yaml', 'name'], 'table');
  const target = await targetOf(values, io.env);
  // One object is printed as itself (json, yaml), a list as a list.
  let shown: Item | Item[];
  if (id !== undefined) {
    const item = await getOne(target, def, id);
    if (!item) throw notFound(def, id);
    shown = item;
  } else {
    shown = (await requestJson<{ items: Item[] }>(target, 'GET', `/v1/${def.path}`)).items;
  }
  const items = Array.isArray(shown) ? shown : [shown];
  if (format === 'json') io.out(`${JSON.stringify(shown, null, 2)}\n`);
  else if (format === 'yaml') io.out(stringify(shown));
  else if (format === 'name') io.out(items.map((it) => `${kindName(def)}/${String(it.id)}\n`).join(''));
  else io.out(renderItems(def, items, format === 'wide'));
  return 0;
}

/** `natgw describe <kind> <id>`: every field, and whether the daemon applied it as it stands. */
export async function describe(args: readonly string[], io: Io): Promise<number> {
  const { values, positionals } = parseOptions('describe', args, CONNECTION_OPTIONS, true);
  if (values.help) {
    io.out(commandHelp('describe'));
    return 0;
  }
  const [name, id, ...extra] = positionals;
  const def = requireKind('describe', name);
  if (id === undefined) throw new CliError(`natgw describe ${name}: which one? Give its ID (see 'natgw get ${def.path}')`, 2);
  if (extra.length) throw new CliError(`natgw describe: one object at a time (got ${positionals.join(' ')})`, 2);
  const target = await targetOf(values, io.env);
  const item = await getOne(target, def, id);
  if (!item) throw notFound(def, id);
  const doc = await requestJson<{ lastApplied: Record<string, unknown[]> | null }>(target, 'GET', '/v1/state');
  const key = def.key(item);
  const { id: _id, ...fields } = item;
  const applied = doc.lastApplied === null ? null : (doc.lastApplied[def.stateKey] ?? []).some((x) => def.key(x) === key && sameObject(def, x, fields));
  io.out(renderDescribe(def, item, applied));
  return 0;
}

/** `natgw delete <kind> <id> [<id> ...]`: each by identity, absent ones an error unless --ignore-not-found. */
export async function del(args: readonly string[], io: Io): Promise<number> {
  const { values, positionals } = parseOptions('delete', args, { ...CONNECTION_OPTIONS, 'ignore-not-found': { type: 'boolean' } }, true);
  if (values.help) {
    io.out(commandHelp('delete'));
    return 0;
  }
  const [name, ...ids] = positionals;
  const def = requireKind('delete', name);
  if (ids.length === 0) throw new CliError(`natgw delete ${name}: which one? Give its ID (see 'natgw get ${def.path}')`, 2);
  const target = await targetOf(values, io.env);
  let status = 0;
  for (const id of ids) {
    const item = await getOne(target, def, id);
    if (!item) {
      if (values['ignore-not-found']) continue;
      io.err(`Error: ${notFound(def, id).message}\n`);
      status = 1;
      continue;
    }
    const canonical = String(item.id ?? id);
    const a = await request(target, 'DELETE', `/v1/${def.path}/${encodeURIComponent(canonical)}`);
    if (a.status !== 204 && a.status !== 200) throw apiError(`deleting ${kindName(def)} ${canonical}`, a);
    io.out(`${kindName(def)}/${canonical} deleted\n`);
  }
  return status;
}
