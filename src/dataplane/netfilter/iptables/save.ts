/** One table of `iptables-save` output: the chains that exist and each chain's rules in order. */
export interface SavedTable {
  readonly chains: ReadonlySet<string>;
  /** Rule specs without the `-A CHAIN ` prefix, in kernel order. */
  readonly rules: ReadonlyMap<string, readonly string[]>;
}

export function parseSave(text: string): SavedTable {
  const chains = new Set<string>();
  const rules = new Map<string, string[]>();
  for (const line of text.split('\n')) {
    if (line.startsWith(':')) {
      const name = line.slice(1).split(' ')[0];
      if (name) chains.add(name);
    } else if (line.startsWith('-A ')) {
      const rest = line.slice(3);
      const sp = rest.indexOf(' ');
      const chain = sp === -1 ? rest : rest.slice(0, sp);
      const spec = sp === -1 ? '' : rest.slice(sp + 1);
      const list = rules.get(chain) ?? [];
      list.push(spec);
      rules.set(chain, list);
    }
  }
  return { chains, rules };
}

export const emptyTable: SavedTable = { chains: new Set(), rules: new Map() };
