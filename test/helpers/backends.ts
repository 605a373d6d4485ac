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

/**
 * The backends NATGW_TEST_BACKENDS names (e.g. `iptables-legacy,nftables`), to narrow a local
 * run; unset or empty, all of them (CI). A name that is not a backend is refused: a typo must not
 * quietly run fewer backends, or none.
 */
export function backendsFrom(given: string | undefined): readonly BackendCase[] {
  const names = (given ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  if (names.length === 0) return ALL;
  const unknown = names.filter((n) => !ALL.some((b) => b.name === n));
  if (unknown.length) {
    throw new Error(
      `NATGW_TEST_BACKENDS: unknown backend ${unknown.map((n) => JSON.stringify(n)).join(', ')}; the backends are ${ALL.map((b) => b.name).join(', ')}`,
    );
  }
  return ALL.filter((b) => names.includes(b.name));
}

export const BACKENDS: readonly BackendCase[] = backendsFrom(process.env.NATGW_TEST_BACKENDS);

/**
 * The one backend for suites whose subject does not depend on the backend (the API, the CLI, the
 * daemon's lifecycle): nftables, the quickest, unless NATGW_TEST_BACKENDS leaves it out.
 */
export const ONE_BACKEND: readonly BackendCase[] = [BACKENDS.find((b) => b.name === 'nftables') ?? BACKENDS[0]!];

/** For one test of a suite that runs on every backend, whose subject is not the backend (validation). */
export const isOneBackend = (b: BackendCase): boolean => b.name === ONE_BACKEND[0]!.name;

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
