/**
 * One table model for both netfilter backends (after Calico's generictables): a table is chains
 * and sets. A rule is known by its key, the text its backend renders for it (an iptables save
 * line without `-A CHAIN`, an nft rule as written in a script): two rules are the same rule
 * exactly when their keys are equal. A kernel rule its backend does not recognise as its own
 * is null: it never stays. Each backend builds this model of what it wants and of what it read,
 * diffs the two with diff.ts, and renders the operations in its own syntax.
 */

/** The hook a base chain is attached to (nft); an iptables chain of natgw's own has none. */
export interface BaseHook {
  readonly type: string;
  readonly hook: string;
  readonly priority: number;
  readonly policy: string;
}

/** A rule's key as its backend renders it; null for a kernel rule not recognised as natgw's. */
export type RuleKey = string;

export interface ChainModel {
  readonly base?: BaseHook;
  /** In order. Desired chains hold keys only. */
  readonly rules: readonly (RuleKey | null)[];
}

/** A set or map: element key → value (undefined for a plain set's element). */
export interface SetModel {
  readonly elements: ReadonlyMap<string, string | undefined>;
}

export interface TableModel {
  readonly chains: ReadonlyMap<string, ChainModel>;
  readonly sets: ReadonlyMap<string, SetModel>;
}
