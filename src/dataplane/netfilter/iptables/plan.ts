import { canonicalOrder, type NatTables, type PortRange } from '../backend.js';
import type { Dnat, Fip, Snat } from '../../../model/rules.js';
import { refDiff, type RefDiff } from '../../../state/refDiff.js';
import { CHAINS, dnatSpec, fipDnatSpec, fipSnatSpec, hairpinSpec, snatSpecs, vpcMarkSpec } from '../../../model/ruleText.js';
import type { SavedTable } from './save.js';

/**
 * What natgw's iptables chains must hold (SPEC §2 layout), and the iptables-restore script
 * that turns what the kernel holds into that, touching only natgw's chains and its one
 * jump in each built-in chain.
 */

export type TableName = 'nat' | 'mangle';

/** The tables natgw edits in each family. A removal takes nat first: one it refuses leaves every table as it was. */
export const TABLES: readonly TableName[] = ['nat', 'mangle'];

export interface TableWant {
  /** natgw's own chains and their exact rules, in order. */
  readonly owned: ReadonlyMap<string, readonly string[]>;
  /** Built-in chain → the jump natgw needs there (exactly once). */
  readonly jumps: ReadonlyMap<string, string>;
}

/**
 * A chain's rules derived from one collection (and an interface name), kept with that
 * collection: an unchanged collection hands the planner the same list as the last sync, which
 * it passes over by reference instead of comparing ten thousand rules.
 */
class Derived<T> {
  private readonly cache = new WeakMap<readonly T[], { readonly param: string; readonly rules: string[] }>();
  constructor(private readonly build: (list: readonly T[], param: string) => string[]) {}

  of(list: readonly T[], param = ''): string[] {
    const hit = this.cache.get(list);
    if (hit && hit.param === param) return hit.rules;
    const rules = this.build(list, param);
    this.cache.set(list, { param, rules });
    return rules;
  }
}

/**
 * One rule per object, the rules of a collection that changed a little (a command) taken from
 * the last lists built: the objects it kept keep their texts, found by a walk by reference, and
 * only new objects are rendered. A bulk change (a start, a new document: all objects new)
 * renders every rule once, with no per-object cache to fill.
 */
class PerObject<T> {
  /** The last lists built, newest first: the IPv4 and the IPv6 objects of a sync take turns. */
  private recent: Array<{ readonly list: readonly T[]; readonly rules: string[] }> = [];
  constructor(private readonly render: (t: T) => string) {}

  of(list: readonly T[]): string[] {
    let rules: string[] | undefined;
    for (const [at, e] of this.recent.entries()) {
      if (e.list === list) return e.rules;
      const d = refDiff(e.list, list, MAX_REUSE);
      if (!d) continue;
      rules = patched(e.rules, d, this.render);
      this.recent.splice(at, 1);
      break;
    }
    rules ??= list.map(this.render);
    this.recent = [{ list, rules }, ...this.recent].slice(0, 2);
    return rules;
  }
}

/** Most objects in and out that a list is patched for; more are rendered anew. */
const MAX_REUSE = 64;

/** `before`'s rules with the removed ones dropped and the added objects' rules placed (refDiff's order). */
function patched<T>(before: readonly string[], d: RefDiff<T>, render: (t: T) => string): string[] {
  const out: string[] = [];
  let i = 0;
  let r = 0;
  for (const [j, x] of d.added) {
    while (out.length < j) {
      while (d.removed[r] === i) {
        r++;
        i++;
      }
      out.push(before[i++] as string);
    }
    out.push(render(x));
  }
  for (; i < before.length; i++) {
    if (d.removed[r] === i) r++;
    else out.push(before[i] as string);
  }
  return out;
}

const fipDnatRules = new PerObject<Fip>(fipDnatSpec);
const fipSnatRules = new PerObject<Fip>(fipSnatSpec);
const dnatRules = new PerObject<Dnat>(dnatSpec);
const snatRules = new Derived<Snat>((snats, param) => {
  const [extIf = '', lo, hi] = param.split('|');
  const ports = lo === undefined ? undefined : { lo: Number(lo), hi: Number(hi) };
  return snats.flatMap((s) => withPortSlice(snatSpecs(s, extIf), ports));
});

/** The chain natgw drops invalid packets in (mangle FORWARD and INPUT), only with dropInvalid. */
export const DROP_INVALID = 'NATGW_DROP_INVALID';

/**
 * A SNAT's lines under a port slice: TCP, then UDP, into the slice (iptables takes ports only
 * with -p), then the lines as they are for the other protocols. A pool's lines stay together
 * per protocol, so each protocol takes the EIPs in turn.
 */
function withPortSlice(specs: readonly string[], ports: PortRange | undefined): string[] {
  if (!ports) return [...specs];
  const slice = (spec: string, proto: 'tcp' | 'udp'): string =>
    spec
      .replace(/(^|\s)-o (\S+)/, `$1-o $2 -p ${proto}`)
      .replace(/--to-source (\S+)/, (_m, ip: string) => `--to-source ${ip.includes(':') ? `[${ip}]` : ip}:${ports.lo}-${ports.hi}`);
  return [...specs.map((s) => slice(s, 'tcp')), ...specs.map((s) => slice(s, 'udp')), ...specs];
}
const hairpinRules = new Derived<string>((eips, param) => {
  const [vpcIf = '', lo, hi] = param.split('|');
  const ports = lo === undefined ? undefined : { lo: Number(lo), hi: Number(hi) };
  return eips.flatMap((e) => withPortSlice([hairpinSpec(e, vpcIf)], ports));
});

export function desiredTables(given: NatTables): Record<TableName, TableWant> {
  const want = canonicalOrder(given);
  const nat = new Map<string, string[]>([
    [CHAINS.dnatFilter, [`-j ${CHAINS.exclusiveDnat}`, `-j ${CHAINS.sharedDnat}`]],
    [CHAINS.snatFilter, [`-j ${CHAINS.exclusiveSnat}`, `-j ${CHAINS.sharedSnat}`, `-j ${CHAINS.hairpinSnat}`]],
    [CHAINS.exclusiveDnat, fipDnatRules.of(want.fips)],
    [CHAINS.exclusiveSnat, fipSnatRules.of(want.fips)],
    [CHAINS.sharedDnat, dnatRules.of(want.dnats)],
    [CHAINS.sharedSnat, snatRules.of(want.snats, want.snatPorts ? `${want.extIf}|${want.snatPorts.lo}|${want.snatPorts.hi}` : want.extIf)],
    [CHAINS.hairpinSnat, hairpinRules.of(want.eips, want.snatPorts ? `${want.vpcIf}|${want.snatPorts.lo}|${want.snatPorts.hi}` : want.vpcIf)],
  ]);
  return {
    nat: {
      owned: nat,
      jumps: new Map([
        ['PREROUTING', `-j ${CHAINS.dnatFilter}`],
        ['POSTROUTING', `-j ${CHAINS.snatFilter}`],
      ]),
    },
    mangle: {
      owned: new Map([
        [CHAINS.vpcMark, [vpcMarkSpec(want.vpcIf)]],
        ...(want.dropInvalid ? [[DROP_INVALID, ['-m conntrack --ctstate INVALID -j DROP']] as const] : []),
      ]),
      jumps: new Map([
        ['PREROUTING', `-j ${CHAINS.vpcMark}`],
        ...(want.dropInvalid ? (['FORWARD', 'INPUT'] as const).map((c) => [c, `-j ${DROP_INVALID}`] as const) : []),
      ]),
    },
  };
}

export interface TablePlan {
  readonly lines: string[];
  readonly changes: number;
}

/**
 * The edit lines for one table. Per chain: when the rules both sides keep are in the same
 * relative order (always, unless someone reordered them), delete what is extra and insert
 * what is missing at its position — element-level edits; otherwise rewrite that chain.
 */
export interface PlanOptions {
  /**
   * Delete a rule that occurs once by its spec instead of its position: a partial sync plans
   * against the table as natgw left it, and if someone removed a rule since, a position would
   * silently hit its neighbour while a spec is refused (and the command retried as a full sync).
   */
  readonly deleteBySpec?: boolean;
}

export function planTable(have: SavedTable, want: TableWant, opts: PlanOptions = {}): TablePlan {
  const lines: string[] = [];
  let changes = 0;
  // Create missing chains first: in --noflush mode declaring an existing chain would flush it.
  for (const chain of want.owned.keys()) {
    if (!have.chains.has(chain)) lines.push(`:${chain} - [0:0]`);
  }
  for (const [chain, rules] of want.owned) {
    const edit = planChain(chain, have.rules.get(chain) ?? [], rules, opts);
    lines.push(...edit.lines);
    changes += edit.changes;
  }
  for (const [builtin, jump] of want.jumps) {
    const present = (have.rules.get(builtin) ?? []).filter((r) => r === jump).length;
    if (present === 0) {
      lines.push(`-A ${builtin} ${jump}`);
      changes++;
    }
    // A duplicated jump would run natgw's chains twice; keep exactly one.
    for (let i = 1; i < present; i++) {
      lines.push(`-D ${builtin} ${jump}`);
      changes++;
    }
  }
  return { lines, changes };
}

/** Element-level edits below this many deletes, whatever their share of the chain. */
const REWRITE_ABOVE = 64;

export function planChain(chain: string, have: readonly string[], want: readonly string[], opts: PlanOptions = {}): TablePlan {
  if (sameList(have, want)) return { lines: [], changes: 0 };
  // A chain natgw creates (every full sync of a fresh namespace): the general plan below would
  // write exactly these appends, after counting ten thousand rule texts to learn nothing stays.
  if (have.length === 0) {
    const append = `-A ${chain} `;
    return { lines: want.map((r) => append + r), changes: want.length };
  }
  const few = fewEdits(chain, have, want, opts);
  if (few) return few;
  const budget = countOf(want);
  const kept: string[] = [];
  const deleteAt: number[] = [];
  have.forEach((r, i) => {
    const n = budget.get(r) ?? 0;
    if (n > 0) {
      budget.set(r, n - 1);
      kept.push(r);
    } else {
      deleteAt.push(i + 1);
    }
  });
  // A rewrite when the kept rules are out of order, and when most of a long chain goes: each
  // positional delete costs iptables-nft a chain walk (10,000 replaced SNAT rules: 0.9 s of
  // edits against 0.1 s for a flush and append, in the same atomic restore).
  if (!isSubsequence(kept, want) || (deleteAt.length > REWRITE_ABOVE && deleteAt.length > kept.length)) {
    return {
      lines: [`-F ${chain}`, ...want.map((r) => `-A ${chain} ${r}`)],
      changes: have.length + want.length,
    };
  }
  // Delete by position, last first: `-D CHAIN <spec>` would remove the FIRST copy of a
  // duplicated rule, which may be the copy that is meant to stay. A rule that occurs once may
  // go by its spec (PlanOptions).
  const once = opts.deleteBySpec ? countOf(have) : undefined;
  const lines = deleteAt.reverse().map((n) => {
    const spec = have[n - 1] ?? '';
    return once?.get(spec) === 1 ? `-D ${chain} ${spec}` : `-D ${chain} ${n}`;
  });
  let k = 0;
  want.forEach((r, i) => {
    if (k < kept.length && kept[k] === r) {
      k++;
    } else {
      // The chain now holds want[0..i) then the kept rules not yet passed: insert at i+1.
      lines.push(k === kept.length ? `-A ${chain} ${r}` : `-I ${chain} ${i + 1} ${r}`);
    }
  });
  return { lines, changes: lines.length };
}

function sameList(a: readonly string[], b: readonly string[]): boolean {
  return a === b || (a.length === b.length && a.every((x, i) => x === b[i]));
}

/** At most this many rules between the common ends take the short way (one command's change). */
const FEW = 8;

/**
 * A change of a few rules amid many that stay (every command), found by trimming the rules
 * both ends share: no map of the whole chain. The lines are the ones the general plan below
 * writes for such a change (deletes last first, then inserts in order). Undefined when the
 * middle is larger, or holds a rule on both sides (a move): the general plan takes those.
 */
function fewEdits(chain: string, have: readonly string[], want: readonly string[], opts: PlanOptions): TablePlan | undefined {
  const max = Math.min(have.length, want.length);
  let p = 0;
  while (p < max && have[p] === want[p]) p++;
  let s = 0;
  while (s < max - p && have[have.length - 1 - s] === want[want.length - 1 - s]) s++;
  const gone = have.length - s - p;
  const come = want.length - s - p;
  if (gone + come > FEW) return undefined;
  for (let i = p; i < p + gone; i++) {
    const at = want.indexOf(have[i] as string, p);
    if (at !== -1 && at < p + come) return undefined;
  }
  const lines: string[] = [];
  for (let i = p + gone - 1; i >= p; i--) {
    const spec = have[i] as string;
    lines.push(opts.deleteBySpec && occursOnce(have, spec) ? `-D ${chain} ${spec}` : `-D ${chain} ${i + 1}`);
  }
  for (let j = p; j < p + come; j++) lines.push(s === 0 ? `-A ${chain} ${want[j]}` : `-I ${chain} ${j + 1} ${want[j]}`);
  return { lines, changes: lines.length };
}

function occursOnce(list: readonly string[], x: string): boolean {
  const first = list.indexOf(x);
  return first !== -1 && list.indexOf(x, first + 1) === -1;
}

function countOf(list: readonly string[]): Map<string, number> {
  const m = new Map<string, number>();
  for (const r of list) m.set(r, (m.get(r) ?? 0) + 1);
  return m;
}

function isSubsequence(sub: readonly string[], of: readonly string[]): boolean {
  let i = 0;
  for (const x of of) if (i < sub.length && sub[i] === x) i++;
  return i === sub.length;
}

/**
 * PURE: the table as it stands after `planTable(have, want)` was applied — natgw's chains hold
 * exactly their rules, each built-in chain natgw hooks holds its jump once. Only what natgw
 * plans against is kept (other owners' chains stay as they were seen).
 */
export function savedAfter(have: SavedTable, want: TableWant): SavedTable {
  const chains = new Set(have.chains);
  const rules = new Map(have.rules);
  for (const [chain, list] of want.owned) {
    chains.add(chain);
    rules.set(chain, list);
  }
  for (const [builtin, jump] of want.jumps) {
    const list = rules.get(builtin) ?? [];
    const first = list.indexOf(jump);
    rules.set(builtin, first === -1 ? [...list, jump] : list.filter((r, i) => r !== jump || i === first));
  }
  return { chains, rules };
}

export function renderRestore(table: TableName, plan: TablePlan): string {
  return plan.lines.length === 0 ? '' : `*${table}\n${plan.lines.join('\n')}\nCOMMIT\n`;
}
