import { type PlanOptions, planTable, type TablePlan } from '../../src/dataplane/netfilter/iptables/plan.js';

/** planTable's lines for one existing chain natgw owns, with no jumps: the per-chain edit on its own. */
export function planChain(chain: string, have: readonly string[], want: readonly string[], opts: PlanOptions = {}): TablePlan {
  return planTable({ chains: new Set([chain]), rules: new Map([[chain, have]]) }, { owned: new Map([[chain, want]]), jumps: new Map() }, opts);
}
