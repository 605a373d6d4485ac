/**
 * PURE renderer and reader of share DNAT (SPEC §2 nft-dnat-map-add/del), which always lives in
 * `table ip kube-ovn` whatever netfilter backend runs, because Kube-OVN's own tests read it there:
 *
 *   map service-ips { type ipv4_addr . inet_proto . inet_service : verdict }
 *       <eip> . <proto> . <port> : goto dnat-<md5(eip:port:protocolText)[0:12]>
 *   chain prerouting { type nat hook prerouting priority -150; policy accept; }
 *       ip daddr . meta l4proto . th dport vmap @service-ips
 *   chain dnat-<hash> { meta l4proto <proto> dnat ip addr . port to numgen random mod N map { 0 : <ip> . <port>, … } }
 *
 * The table is shared with whoever else uses it: natgw touches the base chain `prerouting`
 * (only to keep its one vmap rule), the map `service-ips` and chains named `dnat-<12 hex>`,
 * nothing else.
 *
 * A sync is two transactions (knftables' lesson): the first adds, replaces (flush chain + add
 * rule: established connections keep their conntrack entries) and removes map elements, and
 * flushes every chain no element should reach any more; the second deletes those now-empty
 * chains. Kernels before 6.2 can refuse that delete (EBUSY) right after the element that jumped
 * to the chain went away; such a chain stays flushed and harmless, and any later sync deletes it,
 * because every `dnat-*` chain that no wanted identity names is stale.
 */
import { NatgwError } from '../../model/errors.js';
import type { Protocol, ShareDnat } from '../../model/rules.js';
import { dnatKey } from '../../model/rules.js';
import { isIpv4 } from '../../model/net.js';
import { shareDnatChainName } from '../../model/shareDnatName.js';
import { dig, sameExpr } from './nft/readback.js';
import { sameHook } from './tables/diff.js';
import type { NftRuleDump, NftSetDump, NftTableDump } from './nft/types.js';
import { isPlainElement, NftTransaction, type NftTableRef } from './nft/transaction.js';
import { renderEdit, Script, setOf, wantedModel, type Handles, type TableSpec } from './nft/render.js';
import type { ChainModel, TableModel } from './tables/model.js';

/** The table holds something natgw cannot reconcile without touching what is not its own. */
class ShareDnatError extends NatgwError {
  override readonly name = 'ShareDnatError';
  constructor(message: string) {
    super('system', message, 'stderr');
  }
}

export const KUBE_OVN_TABLE = 'kube-ovn';
const SERVICE_MAP = 'service-ips';
const SHARE_PREROUTING = 'prerouting';
const SHARE_CHAIN_PATTERN = /^dnat-[0-9a-f]{12}$/;

const T: NftTableRef = { family: 'ip', name: KUBE_OVN_TABLE };
const MAP_TYPE = 'ipv4_addr . inet_proto . inet_service';
const PREROUTING_BASE = { type: 'nat', hook: 'prerouting', prioName: -150, priority: -150, policy: 'accept' } as const;

export function vmapRuleJson(): unknown[] {
  return [
    {
      vmap: {
        key: {
          concat: [{ payload: { protocol: 'ip', field: 'daddr' } }, { meta: { key: 'l4proto' } }, { payload: { protocol: 'th', field: 'dport' } }],
        },
        data: `@${SERVICE_MAP}`,
      },
    },
  ];
}

const VMAP_RULE = { text: `ip daddr . meta l4proto . th dport vmap @${SERVICE_MAP}`, expr: vmapRuleJson() } as const;

const shareElementKey = (d: Pick<ShareDnat, 'eip' | 'protocol' | 'port'>): string => `${d.eip} . ${d.protocol} . ${d.port}`;

/** The one rule of an identity's chain, backends in the given order. */
export function shareRuleText(d: Pick<ShareDnat, 'protocol' | 'backends'>): string {
  const map = d.backends.map((b, i) => `${i} : ${b.ip} . ${b.port}`).join(', ');
  return `meta l4proto ${d.protocol} dnat ip addr . port to numgen random mod ${d.backends.length} map { ${map} }`;
}

function shareRuleJson(d: Pick<ShareDnat, 'protocol' | 'backends'>): unknown[] {
  return [
    { match: { op: '==', left: { meta: { key: 'l4proto' } }, right: d.protocol } },
    {
      dnat: {
        family: 'ip',
        addr: {
          map: {
            key: { numgen: { mode: 'random', mod: d.backends.length, offset: 0 } },
            data: { set: d.backends.map((b, i) => [i, { concat: [b.ip, b.port] }]) },
          },
        },
      },
    },
  ];
}

/** Backends and protocol of a chain's rule, when it is exactly the rule natgw renders. */
export function recogniseShareRule(expr: readonly unknown[]): Pick<ShareDnat, 'protocol' | 'backends'> | null {
  const p = dig(expr, 0, 'match', 'right');
  const set = dig(expr, 1, 'dnat', 'addr', 'map', 'data', 'set');
  const protocol: Protocol | undefined = p === 'tcp' || p === 'udp' ? p : undefined;
  if (protocol === undefined || !Array.isArray(set) || set.length === 0) return null;
  const backends: ShareDnat['backends'] = [];
  for (const [i, entry] of set.entries()) {
    const ip = dig(entry, 1, 'concat', 0);
    const port = dig(entry, 1, 'concat', 1);
    if (dig(entry, 0) !== i || typeof ip !== 'string' || !isIpv4(ip) || typeof port !== 'number') return null;
    if (!Number.isInteger(port) || port < 1 || port > 65535) return null;
    backends.push({ ip, port });
  }
  const candidate: Pick<ShareDnat, 'protocol' | 'backends'> = { protocol, backends };
  return sameExpr(shareRuleJson(candidate), expr) ? candidate : null;
}

function mapDeclOk(m: NftSetDump): boolean {
  return m.kind === 'map' && m.type === MAP_TYPE && m.map === 'verdict' && m.flags.length === 0;
}

// ---------------------------------------------------------------------------------
// Sync
// ---------------------------------------------------------------------------------

export interface SharePlan {
  /** Adds, replacements, element removals and flushes of stale chains: one transaction. */
  readonly tx: NftTransaction;
  /** `delete chain` of each stale chain, tried after `tx` (may be refused before kernel 6.2). */
  readonly staleChains: readonly string[];
  readonly changes: number;
}

/** What a partial sync trusts: the items last applied, and stale chains the kernel kept (flushed). */
export interface ShareView {
  readonly items: readonly ShareDnat[];
  readonly leftover: readonly string[];
}

/** The second transaction: delete chains that the first one flushed and unreferenced. */
export function deleteChainsTx(chains: readonly string[]): NftTransaction {
  const tx = new NftTransaction();
  for (const c of chains) tx.deleteChain(T, c);
  return tx;
}

/** The last identity given wins (re-adding replaces), in first-seen order. */
export function dedupe(items: readonly ShareDnat[]): ShareDnat[] {
  const byKey = new Map<string, ShareDnat>();
  for (const d of items) byKey.set(dnatKey(d), d);
  return [...byKey.values()];
}

/** natgw's part of the table for `items` (deduplicated): the map, the base chain's rule, a chain per identity. */
function shareSpec(items: readonly ShareDnat[]): TableSpec {
  const elements = items.map((d) => ({ key: shareElementKey(d), value: `goto ${shareDnatChainName(d)}` }));
  return {
    table: T,
    sets: [setOf({ name: SERVICE_MAP, kind: 'map', type: MAP_TYPE, map: 'verdict' }, elements)],
    chains: [
      { name: SHARE_PREROUTING, base: PREROUTING_BASE, rules: [VMAP_RULE] },
      ...items.map((d) => ({ name: shareDnatChainName(d), rules: [{ text: shareRuleText(d), expr: shareRuleJson(d) }] })),
    ],
  };
}

/**
 * What natgw owns of the table as the kernel holds it; everything else stays out of sight, so no
 * edit can touch it: other rules in `prerouting`, other chains and sets, base chains named like
 * ours, elements that are not plain data. A map declared otherwise, or a `prerouting` hooked
 * otherwise, is removed first (in `sc`) and left out, to be created again.
 */
function kernelShare(sc: Script, have: NftTableDump, wanted: ReadonlySet<string>): { held: TableModel; handles: Handles } {
  const chains = new Map<string, ChainModel>();
  const handles = new Map<string, readonly NftRuleDump[]>();
  const pre = have.chains.get(SHARE_PREROUTING);
  const vmapRules = (pre?.rules ?? []).filter((r) => sameExpr(VMAP_RULE.expr, r.expr));
  let map = have.sets.get(SERVICE_MAP);
  if (map && !mapDeclOk(map)) {
    for (const r of vmapRules.splice(0)) sc.create.deleteRule(T, SHARE_PREROUTING, r.handle);
    sc.create.deleteSet(T, 'map', SERVICE_MAP);
    sc.changes += 1;
    map = undefined;
  }
  if (pre && !(pre.base && sameHook(pre.base, PREROUTING_BASE))) sc.create.flushChain(T, SHARE_PREROUTING).deleteChain(T, SHARE_PREROUTING);
  else if (pre) {
    chains.set(SHARE_PREROUTING, { base: PREROUTING_BASE, rules: vmapRules.map(() => VMAP_RULE.text) });
    handles.set(SHARE_PREROUTING, vmapRules);
  }
  for (const c of [...have.chains.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) {
    if (!SHARE_CHAIN_PATTERN.test(c.name)) continue;
    if (c.base !== undefined && wanted.has(c.name))
      throw new ShareDnatError(`chain ${c.name} in table ip ${KUBE_OVN_TABLE} is a base chain; natgw cannot use it`);
    if (c.base !== undefined) continue;
    chains.set(c.name, {
      rules: c.rules.map((r) => {
        const rule = recogniseShareRule(r.expr);
        return rule ? shareRuleText(rule) : null;
      }),
    });
  }
  const plain = (map?.elements ?? []).filter((e) => isPlainElement(e.key)).sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  const sets = map ? new Map([[SERVICE_MAP, { elements: new Map(plain.map((e) => [e.key, e.value] as const)) }]]) : new Map();
  return { held: { chains, sets }, handles };
}

/**
 * PURE: the plan that makes the table hold `items`, against what the kernel holds (`have`), or
 * against what natgw applied last (a ShareView: a partial sync, nothing read); null: the table is
 * absent. Identity chains are replaced whole (flush + add: established connections keep their
 * conntrack entries), so only `prerouting` needs the kernel's handles.
 */
export function planShareDnat(itemsIn: readonly ShareDnat[], have: NftTableDump | ShareView | null): SharePlan {
  const items = dedupe(itemsIn);
  const sc = new Script();
  if (have === null && items.length === 0) return { tx: sc.tx(), staleChains: [], changes: 0 };
  const spec = shareSpec(items);
  let held: TableModel = { chains: new Map(), sets: new Map() };
  let handles: Handles | undefined;
  if (have === null) {
    sc.create.addTable(T);
    sc.changes += 1;
  } else if ('items' in have) {
    const last = wantedModel(shareSpec(dedupe(have.items)));
    held = { ...last, chains: new Map([...last.chains, ...have.leftover.map((name) => [name, { rules: [] }] as const)]) };
  } else ({ held, handles } = kernelShare(sc, have, new Set(spec.chains.map((c) => c.name))));
  const staleChains = renderEdit(sc, spec, wantedModel(spec), held, handles, 'flush');
  return { tx: sc.tx(), staleChains, changes: sc.changes };
}

// ---------------------------------------------------------------------------------
// Read-back and removal
// ---------------------------------------------------------------------------------

/**
 * The share DNATs the table holds: one per map element whose chain holds exactly natgw's rule.
 * protocolText is whichever spelling (as found, or upper case) names the chain the element jumps
 * to, so that adopting changes nothing; with neither, the protocol as found.
 */
export function shareDnatsFromKernel(have: NftTableDump | null): ShareDnat[] {
  const map = have?.sets.get(SERVICE_MAP);
  if (!have || !map || !mapDeclOk(map)) return [];
  const out: ShareDnat[] = [];
  for (const e of map.elements) {
    const [eip = '', proto = '', portText = ''] = e.key.split(' . ');
    const chain = /^goto (\S+)$/.exec(e.value ?? '')?.[1];
    const port = Number(portText);
    if (!isIpv4(eip) || (proto !== 'tcp' && proto !== 'udp') || !Number.isInteger(port) || port < 1 || port > 65535) continue;
    if (chain === undefined || !SHARE_CHAIN_PATTERN.test(chain)) continue;
    const c = have.chains.get(chain);
    const only = c?.rules.length === 1 ? c.rules[0] : undefined;
    const rule = only ? recogniseShareRule(only.expr) : null;
    if (!rule || rule.protocol !== proto) continue;
    const protocolText = [proto, proto.toUpperCase()].find((t) => shareDnatChainName({ eip, port, protocolText: t }) === chain) ?? proto;
    out.push({ eip, port, protocol: proto, protocolText, backends: rule.backends });
  }
  return out;
}
