/**
 * PURE: the scripts of the applied-ruleset cache (src/state/appliedRuleset.ts): natgw's own
 * netfilter objects for `want`, rendered by the backends' own renderers as a full sync renders
 * them into an empty kernel.
 *
 * - nftables: one transaction that first deletes natgw's tables (`add table` + `delete table`
 *   succeeds whether or not the table exists) and then builds them from nothing; replayed over
 *   an empty kernel or natgw's own older tables it leaves exactly what a full sync would, and
 *   touches no other table (the accounting table and share DNAT's `ip kube-ovn` are synced as
 *   ever by their own parts). A large one is cut in phases (nft/phases.ts) as a bulk change into
 *   absent tables is: the loader applies them where natgw's tables do not exist, with the element
 *   lists loaded on several cores before anything is hooked, and the prelude followed by every
 *   phase as that one transaction where they do.
 * - both: the accounting table `inet natgw_acct` from scratch, a transaction of its own that
 *   begins with `create table`, so it applies only where that table does not exist (a warm
 *   one keeps its counters; the engine then syncs it as ever).
 * - iptables: one `--noflush` restore per family with objects (nat and mangle): `:CHAIN - [0:0]`
 *   creates or flushes natgw's chains, but the jumps from the built-in chains are appended, so
 *   the loader replays it only where none of natgw's chains exists yet (the cold checks).
 */
import type { ColdCheck, NftPhase, RulesetBackend, StepTool } from '../../state/appliedRuleset.js';
import type { NatTables } from './backend.js';
import { ACCT_TABLE, elementsTx, skeletonTx } from '../eipCounters.js';
import { NftTransaction } from './nft/transaction.js';
import { NFT_FAMILIES, NATGW_TABLE, planNatgw, textPlan } from './nft/render.js';
import { natgwKernel } from './nft/readback.js';
import { PHASING } from './nft/backend.js';
import { phases } from './nft/phases.js';
import { ofFamily } from './iptables/backend.js';
import { desiredTables, planTable, renderRestore, TABLES } from './iptables/plan.js';
import { emptyTable } from './iptables/save.js';

const NONE: NatTables = { vpcIf: 'x', extIf: 'x', eips: [], snats: [], dnats: [], fips: [] };
const withNewline = (t: string): string => (t === '' || t.endsWith('\n') ? t : `${t}\n`);
const isEmpty = (t: NatTables) => t.eips.length + t.snats.length + t.dnats.length + t.fips.length === 0;

export interface ReplayScripts {
  readonly scripts: ReadonlyArray<{ step: StepTool; text: string }>;
  readonly cold: readonly ColdCheck[];
}

export function replayScripts(want: NatTables, backend: RulesetBackend): ReplayScripts {
  // `create table` fails the whole transaction where the table exists: a warm one keeps its counters.
  const acct = NftTransaction.concat(skeletonTx(), elementsTx(new Set(), want.eips)).text();
  const accounting = { step: { tool: 'accounting' } as const, text: `create table inet ${ACCT_TABLE}\n${withNewline(acct)}` };
  if (backend.kind === 'nftables') {
    const prelude = NFT_FAMILIES.map((f) => `add table ${f} ${NATGW_TABLE}\ndelete table ${f} ${NATGW_TABLE}\n`).join('');
    const planned = planNatgw(want, natgwKernel(null, null));
    const cut = phases(planned.tx, PHASING);
    if (cut) {
      // The loader runs first, groups, last where natgw's tables do not exist (first's `create
      // table` is refused where they do); else prelude + first + groups + last as one transaction.
      const phase = (p: NftPhase, tx: NftTransaction) => ({ step: { tool: 'nft', phase: p } as const, text: withNewline(tx.text()) });
      return {
        scripts: [
          { step: { tool: 'nft', phase: 'prelude' }, text: prelude },
          phase('first', cut.first),
          ...cut.groups.map((g) => phase('group', g)),
          phase('last', cut.last),
          accounting,
        ],
        cold: [],
      };
    }
    return { scripts: [{ step: { tool: 'nft' }, text: prelude + withNewline(textPlan(planned).script) }, accounting], cold: [] };
  }
  const scripts: Array<{ step: StepTool; text: string }> = [];
  const cold: ColdCheck[] = [];
  const owned = desiredTables(NONE);
  for (const family of [4, 6] as const) {
    for (const table of TABLES) cold.push({ family, table, chains: [...owned[table].owned.keys()] });
    const w = ofFamily(want, family);
    // The IPv4 skeleton is there even without objects (as syncFamily(4) keeps it); IPv6 only with objects.
    if (family === 6 && isEmpty(w)) continue;
    const desired = desiredTables(w);
    const text = TABLES.map((t) => renderRestore(t, planTable(emptyTable, desired[t]))).join('');
    if (text !== '') scripts.push({ step: { tool: 'iptables', family }, text });
  }
  scripts.push(accounting);
  return { scripts, cold };
}
