/**
 * Text → NftTransaction for the fake nft, for scripts handed as text (a test's foreign
 * change, a tool's script). Only the grammar NftTransaction itself writes is understood, one
 * command a line; a rule body stays text (the fake keeps it opaque). Anything else throws:
 * the fake must never guess what nft would have made of it.
 */
import {
  NftTransaction,
  type NftBaseChainSpec,
  type NftElement,
  type NftPriority,
  type NftTableFamily,
  type NftTableRef,
} from '../../src/dataplane/netfilter/nft/transaction.js';

const FAMILIES: readonly string[] = ['ip', 'ip6', 'inet'];
const PRIORITY_NAMES: readonly string[] = ['raw', 'mangle', 'dstnat', 'filter', 'security', 'srcnat'];

export class NftScriptError extends Error {
  override readonly name = 'NftScriptError';
  constructor(why: string) {
    super(`not natgw's nft grammar: ${why}`);
  }
}

function tableRef(family: string | undefined, name: string | undefined, line: string): NftTableRef {
  if (!family || !FAMILIES.includes(family) || !name) throw new NftScriptError(`no table in: ${line}`);
  return { family: family as NftTableFamily, name };
}

/** `{ a : b, c : d }` → elements. */
function elements(body: string, line: string): NftElement[] {
  const m = /^\{ (.+) \}$/.exec(body);
  if (!m?.[1]) throw new NftScriptError(`no element list in: ${line}`);
  return m[1].split(', ').map((e) => {
    const [key, value, extra] = e.split(' : ');
    if (!key || extra !== undefined) throw new NftScriptError(`bad element ${JSON.stringify(e)} in: ${line}`);
    return value === undefined ? { key } : { key, value };
  });
}

/** `{ type nat hook prerouting priority dstnat; policy accept; }` */
function baseChain(body: string, line: string): NftBaseChainSpec {
  const m = /^\{ type (filter|nat|route) hook (prerouting|input|forward|output|postrouting) priority (-?\d+|[a-z]+);(?: policy (accept|drop);)? \}$/.exec(body);
  if (!m) throw new NftScriptError(`bad chain declaration in: ${line}`);
  const prio = m[3] as string;
  const priority: NftPriority = /^-?\d+$/.test(prio) ? Number(prio) : (prio as NftPriority);
  if (typeof priority === 'string' && !PRIORITY_NAMES.includes(priority)) throw new NftScriptError(`unknown priority in: ${line}`);
  return {
    type: m[1] as NftBaseChainSpec['type'],
    hook: m[2] as NftBaseChainSpec['hook'],
    priority,
    ...(m[4] ? { policy: m[4] as 'accept' | 'drop' } : {}),
  };
}

function parseLine(tx: NftTransaction, line: string): void {
  const words = line.split(' ');
  const [verb, object, family, tableName, name] = words;
  const t = tableRef(family, tableName, line);
  const rest = words.slice(5).join(' ');
  const what = `${verb} ${object}`;
  switch (what) {
    case 'add table':
    case 'create table':
    case 'delete table':
      if (words.length !== 4) throw new NftScriptError(`trailing words in: ${line}`);
      if (verb === 'add') tx.addTable(t);
      else if (verb === 'create') tx.createTable(t);
      else tx.deleteTable(t);
      return;
    case 'add chain':
      if (!name) break;
      tx.addChain(t, rest === '' ? { name } : { name, base: baseChain(rest, line) });
      return;
    case 'flush chain':
    case 'delete chain':
      if (!name || rest !== '') break;
      if (verb === 'flush') tx.flushChain(t, name);
      else tx.deleteChain(t, name);
      return;
    case 'add set': {
      const m = /^\{ type ([a-z0-9_ .]+);(?: size (\d+);)?( flags dynamic;)?( counter;)? \}$/.exec(rest);
      if (!name || !m?.[1]) break;
      tx.addSet(t, { name, type: m[1], ...(m[2] ? { size: Number(m[2]) } : {}), ...(m[3] ? { dynamic: true } : {}), ...(m[4] ? { counter: true } : {}) });
      return;
    }
    case 'add map': {
      const m = /^\{ type ([a-z0-9_ .]+) : ([a-z0-9_ .]+); \}$/.exec(rest);
      if (!name || !m?.[1] || !m[2]) break;
      tx.addMap(t, { name, type: m[1], map: m[2] });
      return;
    }
    case 'delete set':
    case 'delete map':
      if (!name || rest !== '') break;
      tx.deleteSet(t, object as 'set' | 'map', name);
      return;
    case 'add element':
    case 'delete element': {
      if (!name) break;
      const els = elements(rest, line);
      if (verb === 'add') tx.addElements(t, name, els);
      else
        tx.deleteElements(
          t,
          name,
          els.map((e) => e.key),
        );
      return;
    }
    case 'add rule':
      if (!name || rest === '') break;
      tx.addRule(t, name, { text: rest });
      return;
    case 'insert rule': {
      if (!name) break;
      const pos = /^position (\d+) (.+)$/.exec(rest);
      const idx = /^index (\d+) (.+)$/.exec(rest);
      if (pos?.[2]) tx.insertRule(t, name, { text: pos[2] }, Number(pos[1]));
      else if (idx?.[2]) tx.insertRuleAt(t, name, { text: idx[2] }, Number(idx[1]));
      else if (rest !== '') tx.insertRule(t, name, { text: rest });
      else break;
      return;
    }
    case 'delete rule': {
      const h = /^handle (\d+)$/.exec(rest);
      if (!name || !h) break;
      tx.deleteRule(t, name, Number(h[1]));
      return;
    }
  }
  throw new NftScriptError(line);
}

export function parseNftScript(script: string): NftTransaction {
  const tx = new NftTransaction();
  for (const raw of script.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    parseLine(tx, line);
  }
  return tx;
}
