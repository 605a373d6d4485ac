import type { Topology } from './netns.js';

/** Every backend the real-traffic suites run against (parametrised, never copied). */
export interface BackendCase {
  readonly name: string;
  readonly env: Readonly<Record<string, string>>;
  readonly iptablesVariant?: 'legacy' | 'nft';
}

const ALL: readonly BackendCase[] = [
  { name: 'iptables-legacy', env: { GATEWAY_NETFILTER_MODE: 'iptables', NATGW_IPTABLES_VARIANT: 'legacy' }, iptablesVariant: 'legacy' },
  { name: 'iptables-nft', env: { GATEWAY_NETFILTER_MODE: 'iptables', NATGW_IPTABLES_VARIANT: 'nft' }, iptablesVariant: 'nft' },
  { name: 'nftables', env: { GATEWAY_NETFILTER_MODE: 'nftables' } },
];

/** NATGW_TEST_BACKENDS=iptables-legacy,nftables narrows a local run; CI runs all. */
export const BACKENDS: readonly BackendCase[] = (() => {
  const only = process.env.NATGW_TEST_BACKENDS?.split(',').filter(Boolean);
  return only?.length ? ALL.filter((b) => only.includes(b.name)) : ALL;
})();

/** Everything natgw owns in netfilter, as comparable text. */
export async function ownedNetfilter(topo: Topology, b: BackendCase): Promise<string> {
  if (b.iptablesVariant) {
    return (await topo.iptablesSave('nat', b.iptablesVariant)) + (await topo.iptablesSave('mangle', b.iptablesVariant));
  }
  const r = await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'natgw'], { reject: false });
  return sortNftBlocks(r.stdout);
}

/**
 * nft lists a table's maps and chains in the order they were created: with SNAT's maps per
 * prefix length and a chain per CIDR of several EIPs (snatLayout.ts) that is the order of the
 * commands, not the state. Rules keep their order inside each block; only the blocks are sorted.
 */
export function sortNftBlocks(text: string): string {
  const m = /^(table [^\n]*\{\n)([\s\S]*?)(\n\}\n?)$/.exec(text);
  if (!m) return text;
  return `${m[1]}${(m[2] ?? '').split('\n\n').sort().join('\n\n')}${m[3]}`;
}

/** natgw's addresses and routes, as comparable text. */
export async function ownedLinks(topo: Topology): Promise<string> {
  const addr = await topo.exec('gw', ['ip', '-4', '-o', 'addr', 'show', 'dev', 'net1']);
  const routes = await topo.exec('gw', ['ip', 'route', 'show']);
  const strip = (s: string) =>
    s
      .split('\n')
      .map((l) => l.replace(/\s+valid_lft.*$/, '').replace(/^\d+:\s+/, ''))
      .sort()
      .join('\n');
  return `${strip(addr.stdout)}\n--\n${strip(routes.stdout)}`;
}
