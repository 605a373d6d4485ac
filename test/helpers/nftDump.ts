/**
 * A table dump (real `nft -j` parsed, or the fake's) as a plain value to compare: chains in
 * order with handles, hooks and each rule as natgw recognises it; sets with declarations and
 * elements sorted (the kernel lists a hash set in its own order). Counter values are left out:
 * they count packets, which the fake never sees.
 */
import { recogniseRule, sameExpr } from '../../src/dataplane/netfilter/nft/readback.js';
import type { NftFamily } from '../../src/dataplane/netfilter/nft/types.js';
import type { NftTableDump } from '../../src/dataplane/netfilter/nft/types.js';
import { recogniseShareRule, vmapRuleJson } from '../../src/dataplane/netfilter/shareDnatRender.js';
import { ACCT_TABLE } from '../../src/dataplane/eipCounters.js';

const ACCT_RULE = /^(ip6?) (daddr|saddr)$/;

/** What natgw sees in a rule: one of its own (by kind and parameters), or foreign (any rule of another table). */
export function ruleMeaning(table: NftTableDump, expr: readonly unknown[]): string {
  if (table.name === 'natgw') {
    const r = recogniseRule(expr, table.family as NftFamily);
    return r ? JSON.stringify(r) : 'foreign';
  }
  if (table.name === 'kube-ovn') {
    if (sameExpr(vmapRuleJson(), expr)) return 'vmap';
    const r = recogniseShareRule(expr);
    return r ? JSON.stringify(r) : 'foreign';
  }
  if (table.name !== ACCT_TABLE) return 'foreign';
  const m = expr.length === 1 ? (expr[0] as { match?: { left?: { payload?: { protocol: string; field: string } }; right?: unknown } }).match : undefined;
  const p = m?.left?.payload;
  return p && ACCT_RULE.test(`${p.protocol} ${p.field}`) && typeof m?.right === 'string' ? `${p.protocol} ${p.field} ${m.right}` : 'foreign';
}

export interface TableView {
  readonly chains: ReadonlyArray<{ name: string; handle: number; base?: string; rules: ReadonlyArray<{ handle: number; rule: string }> }>;
  readonly sets: ReadonlyArray<{ name: string; handle: number; decl: string; elements: readonly string[] }>;
}

export function tableView(t: NftTableDump | null): TableView | null {
  if (!t) return null;
  return {
    chains: [...t.chains.values()].map((c) => ({
      name: c.name,
      handle: c.handle,
      ...(c.base ? { base: `${c.base.type} ${c.base.hook} ${c.base.priority} ${c.base.policy}` } : {}),
      rules: c.rules.map((r) => ({ handle: r.handle, rule: ruleMeaning(t, r.expr) })),
    })),
    sets: [...t.sets.values()].map((s) => ({
      name: s.name,
      handle: s.handle,
      decl: `${s.kind} ${s.type}${s.map ? ` : ${s.map}` : ''}${s.flags.length ? ` flags ${s.flags.join(',')}` : ''}${s.counter ? ' counter' : ''}`,
      elements: s.elements.map((e) => (e.value === undefined ? e.key : `${e.key} : ${e.value}`)).sort(),
    })),
  };
}
