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
import type { NftChainDump, NftSetDump, NftTableDump } from './nft/types.js';
import { isPlainElement, NftTransaction, type NftChainSpec, type NftRule, type NftTableRef } from './nft/transaction.js';

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
const PRIO = -150;
const PREROUTING: NftChainSpec = { name: SHARE_PREROUTING, base: { type: 'nat', hook: 'prerouting', priority: PRIO, policy: 'accept' } };
const PREROUTING_BASE = { type: 'nat', hook: 'prerouting', priority: PRIO, policy: 'accept' } as const;

const VMAP_RULE = `ip daddr . meta l4proto . th dport vmap @${SERVICE_MAP}`;

const vmapRule = (): NftRule => ({ text: VMAP_RULE, expr: vmapRuleJson() });

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

const shareElementKey = (d: Pick<ShareDnat, 'eip' | 'protocol' | 'port'>): string => `${d.eip} . ${d.protocol} . ${d.port}`;

/** The one rule of an identity's chain, backends in the given order. */
export function shareRuleText(d: ShareDnat): string {
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

const shareRule = (d: ShareDnat): NftRule & { readonly expr: unknown[] } => ({ text: shareRuleText(d), expr: shareRuleJson(d) });

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

const isVmapRule = (expr: readonly unknown[]): boolean => sameExpr(vmapRuleJson(), expr);

function mapDeclOk(m: NftSetDump): boolean {
  return m.kind === 'map' && m.type === MAP_TYPE && m.map === 'verdict' && m.flags.length === 0;
}

function preroutingDeclOk(c: NftChainDump): boolean {
  return c.base !== undefined && sameHook(c.base, PREROUTING_BASE);
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

/** The second transaction: delete chains that the first one flushed and unreferenced. */
export function deleteChainsTx(chains: readonly string[]): NftTransaction {
  const tx = new NftTransaction();
  for (const c of chains) tx.deleteChain(T, c);
  return tx;
}

/** The last identity given wins (re-adding replaces), in first-seen order. */
function dedupe(items: readonly ShareDnat[]): ShareDnat[] {
  const byKey = new Map<string, ShareDnat>();
  for (const d of items) byKey.set(dnatKey(d), d);
  return [...byKey.values()];
}

/**
 * PURE: the table as applying `items` leaves it, `flushed` chains still there (a delete the
 * kernel refused), as `nft -j list` would show it: what a partial sync plans against. Handles
 * are unknown (0): a plan against it deletes nothing by handle, as it holds no foreign rule.
 */
export function renderedTable(itemsIn: readonly ShareDnat[], flushed: readonly string[]): NftTableDump {
  const items = dedupe(itemsIn);
  const chain = (name: string, rules: unknown[][]): [string, NftChainDump] => [name, { name, handle: 0, rules: rules.map((expr) => ({ handle: 0, expr })) }];
  const chains = new Map<string, NftChainDump>([
    [SHARE_PREROUTING, { ...chain(SHARE_PREROUTING, [vmapRuleJson()])[1], base: PREROUTING_BASE }],
    ...items.map((d) => chain(shareDnatChainName(d), [shareRuleJson(d)])),
    ...flushed.map((name) => chain(name, [])),
  ]);
  const elements = items.map((d) => ({ key: shareElementKey(d), value: `goto ${shareDnatChainName(d)}` }));
  const map: NftSetDump = { name: SERVICE_MAP, handle: 0, kind: 'map', type: MAP_TYPE, map: 'verdict', flags: [], elements };
  return { family: 'ip', name: KUBE_OVN_TABLE, chains, sets: new Map([[SERVICE_MAP, map]]) };
}

/** PURE: the plan that makes `have` hold `items`. */
export function planShareDnat(itemsIn: readonly ShareDnat[], have: NftTableDump | null): SharePlan {
  const items = dedupe(itemsIn);
  const create = new NftTransaction();
  const chainOps = new NftTransaction();
  const delElems = new NftTransaction();
  const addElems = new NftTransaction();
  const flushStale = new NftTransaction();
  let changes = 0;

  if (have === null && items.length === 0) return { tx: create, staleChains: [], changes: 0 };

  const chains = have?.chains ?? new Map<string, NftChainDump>();
  let map = have?.sets.get(SERVICE_MAP);
  const pre = chains.get(SHARE_PREROUTING);

  if (have === null) {
    create.addTable(T);
    changes += 1;
  }
  // The map: created when missing, re-created when declared otherwise (its vmap rules go first).
  let vmapRules = (pre?.rules ?? []).filter((r) => isVmapRule(r.expr));
  if (map && !mapDeclOk(map)) {
    for (const r of vmapRules) create.deleteRule(T, SHARE_PREROUTING, r.handle);
    create.deleteSet(T, 'map', SERVICE_MAP);
    vmapRules = [];
    map = undefined;
    changes += 1;
  }
  if (!map) {
    create.addMap(T, { name: SERVICE_MAP, type: MAP_TYPE, map: 'verdict' });
    changes += 1;
  }
  // The base chain: created when missing, rebuilt when hooked otherwise; exactly one vmap rule.
  if (pre && !preroutingDeclOk(pre)) {
    create.flushChain(T, SHARE_PREROUTING).deleteChain(T, SHARE_PREROUTING);
    vmapRules = [];
  }
  if (!pre || !preroutingDeclOk(pre)) {
    create.addChain(T, PREROUTING);
    changes += 1;
  }
  if (vmapRules.length === 0) {
    chainOps.addRule(T, SHARE_PREROUTING, vmapRule());
    changes += 1;
  }
  for (const extra of vmapRules.slice(1)) {
    chainOps.deleteRule(T, SHARE_PREROUTING, extra.handle);
    changes += 1;
  }

  // Identity chains: created, or replaced atomically (flush + add) when their rule differs.
  const wantedChains = new Set<string>();
  const wantElems = new Map<string, string>();
  for (const d of items) {
    const name = shareDnatChainName(d);
    wantedChains.add(name);
    wantElems.set(shareElementKey(d), `goto ${name}`);
    const c = chains.get(name);
    const rule = shareRule(d);
    if (!c) {
      chainOps.addChain(T, { name }).addRule(T, name, rule);
      changes += 1;
    } else if (c.base !== undefined || c.rules.length !== 1 || !sameExpr(rule.expr, c.rules[0]?.expr)) {
      if (c.base !== undefined) throw new ShareDnatError(`chain ${name} in table ip ${KUBE_OVN_TABLE} is a base chain; natgw cannot use it`);
      chainOps.flushChain(T, name).addRule(T, name, rule);
      changes += 1;
    }
  }

  // Map elements, one by one; a changed target is delete + add in this same transaction.
  // Sorted, so the script does not depend on the order nft lists a hash set in.
  const haveElems = new Map((map?.elements ?? []).map((e) => [e.key, e.value ?? ''] as const));
  const stale = [...haveElems.keys()].filter((k) => wantElems.get(k) !== haveElems.get(k) && isPlainElement(k)).sort();
  delElems.deleteElements(T, SERVICE_MAP, stale);
  changes += stale.length;
  const missing = [...wantElems.entries()].filter(([k, v]) => haveElems.get(k) !== v);
  addElems.addElements(
    T,
    SERVICE_MAP,
    missing.map(([key, value]) => ({ key, value })),
  );
  changes += missing.length;

  // Stale identity chains: flushed now, deleted in the second transaction.
  const staleChains = [...chains.values()]
    .filter((c) => SHARE_CHAIN_PATTERN.test(c.name) && !wantedChains.has(c.name) && c.base === undefined)
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const c of staleChains) {
    if (c.rules.length > 0) flushStale.flushChain(T, c.name);
    changes += 1;
  }
  return {
    tx: NftTransaction.concat(create, chainOps, delElems, addElems, flushStale),
    staleChains: staleChains.map((c) => c.name),
    changes,
  };
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
