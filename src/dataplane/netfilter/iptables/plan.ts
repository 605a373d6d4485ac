import { canonicalOrder, compareIp, handOffInterfaces, ofFamily, type NatTables, type PortRange } from '../backend.js';
import { familyOfValid, type Family } from '../../../model/net.js';
import type { Dnat, Fip } from '../../../model/rules.js';
import { sameValue, split, type StateChange } from '../../../state/change.js';
import type { DesiredState } from '../../../state/state.js';
import { CHAINS, dnatSpec, fipDnatSpec, fipSnatSpec, hairpinSpec, snatSpecs, vpcMarkSpec } from './ruleText.js';
import type { SavedTable } from './save.js';
import { diffChain, type ChainEdit } from '../tables/diff.js';

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
  /**
   * natgw's optional chains this configuration does not want (NATGW_DROP_INVALID once the
   * replica mode goes back to takeover), with their jumps: removed where present.
   */
  readonly retired?: { readonly chains: readonly string[]; readonly jumps: ReadonlyMap<string, string> };
}

/**
 * One family's objects in canonical order (backend.ts) with the rules of the chains that hold
 * one rule per object, index for index: what a sync rendered, kept by the backend so that the
 * next partial sync patches it from the change instead of rendering ten thousand rules again.
 */
export interface Rendered {
  readonly want: NatTables;
  readonly fipDnat: readonly string[];
  readonly fipSnat: readonly string[];
  readonly dnat: readonly string[];
}

export function renderFamily(given: NatTables): Rendered {
  const want = canonicalOrder(given);
  return { want, fipDnat: want.fips.map(fipDnatSpec), fipSnat: want.fips.map(fipSnatSpec), dnat: want.dnats.map(dnatSpec) };
}

const byDnat = (a: Dnat, b: Dnat): number => compareIp(a.eip, b.eip) || a.port - b.port || (a.protocol < b.protocol ? -1 : a.protocol > b.protocol ? 1 : 0);
const byFip = (a: Fip, b: Fip): number => compareIp(a.eip, b.eip);

/** Where `x` goes in `list`, sorted by `order` (identities are distinct: no ties). */
function sortedIndex<T>(list: readonly T[], x: T, order: (a: T, b: T) => number): number {
  let lo = 0;
  let hi = list.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (order(list[mid] as T, x) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * `list` and its rule lists (one per render) with `gone` taken out and `come` put in at their
 * sorted places; undefined when an object to take out is not there as it was (the kept
 * rendering is not of the state the change started from: the caller renders anew).
 */
function patched<T>(
  list: readonly T[],
  rules: ReadonlyArray<readonly string[]>,
  gone: readonly T[],
  come: readonly T[],
  order: (a: T, b: T) => number,
  renders: ReadonlyArray<(t: T) => string>,
): { list: T[]; rules: string[][] } | undefined {
  const out = [...list];
  const outRules = rules.map((r) => [...r]);
  for (const x of gone) {
    const i = sortedIndex(out, x, order);
    if (i >= out.length || !sameValue(out[i], x)) return undefined;
    out.splice(i, 1);
    for (const r of outRules) r.splice(i, 1);
  }
  for (const x of come) {
    const i = sortedIndex(out, x, order);
    if (i < out.length && order(out[i] as T, x) === 0) return undefined;
    out.splice(i, 0, x);
    outRules.forEach((r, k) => r.splice(i, 0, (renders[k] as (t: T) => string)(x)));
  }
  return { list: out, rules: outRules };
}

/** Most DNATs and FIPs in and out that a rendering is patched for. */
const PATCH_MAX = 64;

/**
 * `last` (one family's rendering) with the change made: the DNATs and FIPs it touched taken out
 * and put in at their places; the few EIPs and SNATs taken from `next` as they are. Undefined
 * when the change does not fit `last` or is larger than PATCH_MAX.
 */
export function patchFamily(last: Rendered, next: NatTables, change: StateChange, family: Family): Rendered | undefined {
  const sides = <K extends 'dnats' | 'fips'>(k: K) => {
    const { added, removed, updated } = split(change, k);
    const mine = (x: { eip: string }) => familyOfValid(x.eip) === family;
    return {
      gone: [...removed, ...updated.map((u) => u.before)].filter(mine) as DesiredState[K][number][],
      come: [...added, ...updated.map((u) => u.after)].filter(mine) as DesiredState[K][number][],
    };
  };
  const d = sides('dnats');
  const f = sides('fips');
  // A bulk change (a document, a redo) sorts and renders anew at less cost than placing each object.
  if (d.gone.length + d.come.length + f.gone.length + f.come.length > PATCH_MAX) return undefined;
  const dn = patched(last.want.dnats, [last.dnat], d.gone, d.come, byDnat, [dnatSpec]);
  const fp = patched(last.want.fips, [last.fipDnat, last.fipSnat], f.gone, f.come, byFip, [fipDnatSpec, fipSnatSpec]);
  if (!dn || !fp) return undefined;
  const want = canonicalOrder(ofFamily({ ...next, dnats: [], fips: [] }, family));
  return {
    want: { ...want, dnats: dn.list, fips: fp.list },
    dnat: dn.rules[0] as string[],
    fipDnat: fp.rules[0] as string[],
    fipSnat: fp.rules[1] as string[],
  };
}

/**
 * The chains natgw drops invalid packets in (mangle FORWARD, and INPUT apart: `-m socket` is
 * valid only on the way in), only with dropInvalid. On INPUT a packet of the replica's own
 * sockets passes (nftables render.ts says why). Before the drop, a copy of what arrived on the
 * VPC or an uplink goes to each peer (NatTables.handOff). A new UDP packet to the replica that
 * no socket takes (wildcard listeners count here) is handed off and dropped the same way.
 */
const DROP_INVALID = 'NATGW_DROP_INVALID';
const INPUT_INVALID = 'NATGW_INPUT_INVALID';
const INVALID = '-m conntrack --ctstate INVALID';
const DROP_INVALID_JUMPS = [['FORWARD', `-j ${DROP_INVALID}`] as const, ['INPUT', `-j ${INPUT_INVALID}`] as const];

const NEW_UDP = '-p udp -m conntrack --ctstate NEW';

function dropInvalidChains(want: NatTables): Map<string, readonly string[]> {
  const ifs = handOffInterfaces(want);
  const h = want.handOff;
  const limit = h && `-m limit --limit ${h.rate}/sec --limit-burst ${h.rate}`;
  const handOff = (match: string) => (h ? h.peers.flatMap((peer) => ifs.map((i) => `-i ${i} ${match} ${limit} -j TEE --gateway ${peer}`)) : []);
  const invalid = [...handOff(INVALID), `${INVALID} -j DROP`];
  return new Map([
    [DROP_INVALID, invalid],
    [INPUT_INVALID, [`${INVALID} -m socket -j RETURN`, ...invalid, `${NEW_UDP} -m socket --nowildcard -j RETURN`, ...handOff(NEW_UDP), `${NEW_UDP} -j DROP`]],
  ]);
}
const DROP_INVALID_CHAINS = [DROP_INVALID, INPUT_INVALID];

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

/** What natgw's chains must hold for `given` (one family's objects). */
export function desiredTables(given: NatTables | Rendered): Record<TableName, TableWant> {
  const r = 'dnat' in given ? given : renderFamily(given);
  const want = r.want;
  const nat = new Map<string, readonly string[]>([
    [CHAINS.dnatFilter, [`-j ${CHAINS.exclusiveDnat}`, `-j ${CHAINS.sharedDnat}`]],
    [CHAINS.snatFilter, [`-j ${CHAINS.exclusiveSnat}`, `-j ${CHAINS.sharedSnat}`, `-j ${CHAINS.hairpinSnat}`]],
    [CHAINS.exclusiveDnat, r.fipDnat],
    [CHAINS.exclusiveSnat, r.fipSnat],
    [CHAINS.sharedDnat, r.dnat],
    [CHAINS.sharedSnat, want.snats.flatMap((s) => withPortSlice(snatSpecs(s, want.extIf, want.eipIf), want.snatPorts))],
    [CHAINS.hairpinSnat, want.eips.flatMap((e) => withPortSlice([hairpinSpec(e, want.vpcIf)], want.snatPorts))],
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
      owned: new Map([[CHAINS.vpcMark, [vpcMarkSpec(want.vpcIf)]], ...(want.dropInvalid ? dropInvalidChains(want) : [])]),
      jumps: new Map([['PREROUTING', `-j ${CHAINS.vpcMark}`], ...(want.dropInvalid ? DROP_INVALID_JUMPS : [])]),
      ...(want.dropInvalid ? {} : { retired: { chains: DROP_INVALID_CHAINS, jumps: new Map(DROP_INVALID_JUMPS) } }),
    },
  };
}

export interface TablePlan {
  readonly lines: string[];
  readonly changes: number;
}

export interface PlanOptions {
  /**
   * Delete a rule that occurs once by its spec instead of its position: a partial sync plans
   * against the table as natgw left it, and if someone removed a rule since, a position would
   * silently hit its neighbour while a spec is refused (and the command retried as a full sync).
   */
  readonly deleteBySpec?: boolean;
}

/**
 * The edit lines for one table, from the differ of both backends (tables/diff.ts). Per chain:
 * when the rules both sides keep are in the same relative order (always, unless someone
 * reordered them), delete what is extra and insert what is missing at its position —
 * element-level edits; otherwise rewrite that chain. Then natgw's jump in each built-in chain,
 * exactly once, other owners' rules untouched.
 */
export function planTable(have: SavedTable, want: TableWant, opts: PlanOptions = {}): TablePlan {
  const lines: string[] = [];
  let changes = 0;
  // Create missing chains first: in --noflush mode declaring an existing chain would flush it.
  for (const chain of want.owned.keys()) if (!have.chains.has(chain)) lines.push(`:${chain} - [0:0]`);
  for (const [chain, rules] of want.owned) {
    // A chain whose kept rules are out of order is rewritten rather than moved rule by rule.
    const held = have.rules.get(chain) ?? [];
    const plan = chainLines(chain, held, rules, diffChain(held, rules, { rewriteMoved: true }), opts);
    lines.push(...plan.lines);
    changes += plan.changes;
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
  // A retired chain goes after every jump to it.
  const retire: string[] = [];
  for (const [builtin, jump] of want.retired?.jumps ?? []) {
    for (const r of have.rules.get(builtin) ?? []) if (r === jump) retire.push(`-D ${builtin} ${jump}`);
  }
  for (const c of want.retired?.chains ?? []) if (have.chains.has(c)) retire.push(`-F ${c}`, `-X ${c}`);
  return { lines: [...lines, ...retire], changes: changes + retire.length };
}

/**
 * The differ's operations as iptables-restore lines. Deletes go by position, last first:
 * `-D CHAIN <spec>` would remove the FIRST copy of a duplicated rule, which may be the copy
 * that is meant to stay. A rule that occurs once may go by its spec (PlanOptions). Inserts go
 * in desired order: the chain then holds want[0..i) and the kept rules not yet passed, so a
 * rule goes in at i+1, or at the end when no kept rule follows it.
 */
function chainLines(chain: string, have: readonly string[], want: readonly string[], edit: ChainEdit, opts: PlanOptions): TablePlan {
  const append = `-A ${chain} `;
  if (edit.kind === 'rewrite') return { lines: [`-F ${chain}`, ...want.map((r) => append + r)], changes: have.length + want.length };
  const once = opts.deleteBySpec ? occursOnce(have, edit.deletes.length) : undefined;
  const lines: string[] = [];
  for (let k = edit.deletes.length - 1; k >= 0; k--) {
    const i = edit.deletes[k] as number;
    const spec = have[i] as string;
    lines.push(once?.(spec) ? `-D ${chain} ${spec}` : `-D ${chain} ${i + 1}`);
  }
  for (const { rule } of edit.inserts) lines.push(`-I ${chain} ${rule + 1} ${want[rule]}`);
  for (let i = edit.appendFrom; i < want.length; i++) lines.push(append + want[i]);
  return { lines, changes: lines.length };
}

/** Whether a rule occurs once in `list`: a scan for a few deletes (a command), a count for many. */
function occursOnce(list: readonly string[], deletes: number): (x: string) => boolean {
  if (deletes <= 8) {
    return (x) => {
      const first = list.indexOf(x);
      return first !== -1 && list.indexOf(x, first + 1) === -1;
    };
  }
  const count = new Map<string, number>();
  for (const r of list) count.set(r, (count.get(r) ?? 0) + 1);
  return (x) => count.get(x) === 1;
}

/**
 * PURE: what a partial sync plans against once `want` was applied: natgw's chains holding
 * exactly their rules, each built-in chain natgw hooks holding its jump once, nothing retired.
 * Other owners' rules are left out: the plan never touches them.
 */
export function savedAfter(want: TableWant): SavedTable {
  const jumps = [...want.jumps].map(([builtin, jump]): [string, readonly string[]] => [builtin, [jump]]);
  return { chains: new Set(want.owned.keys()), rules: new Map([...want.owned, ...jumps]) };
}

export function renderRestore(table: TableName, plan: TablePlan): string {
  return plan.lines.length === 0 ? '' : `*${table}\n${plan.lines.join('\n')}\nCOMMIT\n`;
}
