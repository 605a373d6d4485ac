/**
 * PURE: a transaction that creates tables, cut into phases that nft can evaluate on several
 * cores. nft's own userspace work (parsing and evaluating every element of a bulk change's maps)
 * is most of a bulk apply and runs on one core; elements of tables that nothing is hooked to yet
 * can be loaded by several processes at once, and the hooks added last, in one transaction.
 *
 * Sound only for tables this transaction creates: until the last phase commits, no base chain
 * of theirs exists, so no packet traverses a half-filled table. Their `add table` becomes
 * `create table` (refused when the table exists), so a failure later can delete exactly the
 * tables this apply made. Operations on any other table (the accounting table where it may exist)
 * keep their atomicity: they all run in the last phase.
 */
import { NftTransaction, type NftElement, type NftOp, type NftPick, type NftTableRef } from './transaction.js';

export interface NftPhases {
  /** `create table`, sets and maps, regular chains and their rules: nothing hooked. */
  readonly first: NftTransaction;
  /** The element lists, in groups run at the same time, balanced by the size of their text. */
  readonly groups: readonly NftTransaction[];
  /** Base chains and their rules, and every operation on a table not created here: one transaction. */
  readonly last: NftTransaction;
  /** The tables `first` creates: what a failure after it deletes. */
  readonly created: readonly NftTableRef[];
  /** Elements the groups load. */
  readonly elements: number;
}

export interface PhaseOptions {
  /** Element lists smaller than this in total stay one `nft -f`: two more process starts cost more than they save. */
  readonly minElements: number;
  /** How many element groups run at once; below 2 nothing is split. */
  readonly groups: number;
}

const key = (t: NftTableRef): string => `${t.family} ${t.name}`;

/** The tables the transaction creates: `add` or `create table` first among their operations, never deleted. */
function createdTables(ops: readonly NftOp[]): Map<string, NftTableRef> {
  const seen = new Set<string>();
  const created = new Map<string, NftTableRef>();
  const deleted = new Set<string>();
  for (const op of ops) {
    const k = key(op.table);
    if (op.object === 'table' && op.verb === 'delete') deleted.add(k);
    if (!seen.has(k) && op.object === 'table' && (op.verb === 'add' || op.verb === 'create')) created.set(k, op.table);
    seen.add(k);
  }
  for (const k of deleted) created.delete(k);
  return created;
}

/** One element list, or a piece of one cut for balance. */
interface Piece {
  readonly pick: NftPick | NftOp;
  readonly weight: number;
  /** Where it came from, so that each group keeps the transaction's order. */
  readonly at: number;
  readonly part: number;
}

/** An element list much larger than a group's share is cut into pieces of about that share. */
function pieces(tx: NftTransaction, index: number, share: number): Piece[] {
  const op = tx.ops[index] as Extract<NftOp, { object: 'element' }>;
  const weight = tx.lineLength(index);
  const n = Math.min(Math.ceil(weight / share), op.elements.length);
  if (n <= 1) return [{ pick: { from: tx, index }, weight, at: index, part: 0 }];
  const per = Math.ceil(op.elements.length / n);
  const out: Piece[] = [];
  for (let p = 0; p * per < op.elements.length; p++) {
    const elements: readonly NftElement[] = op.elements.slice(p * per, (p + 1) * per);
    out.push({ pick: { ...op, elements }, weight: (weight * elements.length) / op.elements.length, at: index, part: p });
  }
  return out;
}

/**
 * The phases of `tx`, or null when it stays one transaction: it creates no table, does more to
 * a table it creates than add to it (a delete, a flush, a rule placed by handle), or loads fewer
 * than `minElements` elements.
 */
export function phases(tx: NftTransaction, opts: PhaseOptions): NftPhases | null {
  const k = Math.floor(opts.groups);
  if (k < 2) return null;
  const ops = tx.ops;
  const created = createdTables(ops);
  if (created.size === 0) return null;
  const first: Array<NftPick | NftOp> = [];
  const last: NftPick[] = [];
  const lists: number[] = [];
  const hooked = new Set<string>();
  const begun = new Set<string>();
  let elements = 0;
  for (let index = 0; index < ops.length; index++) {
    const op = ops[index] as NftOp;
    const pick: NftPick = { from: tx, index };
    const table = key(op.table);
    if (!created.has(table)) {
      last.push(pick);
      continue;
    }
    switch (op.object) {
      case 'table':
        if (op.verb !== 'add' && op.verb !== 'create') return null;
        // Once per table: a `create` followed by the skeleton's `add` (eipCounters.ts) is one creation.
        if (!begun.has(table)) first.push({ verb: 'create', object: 'table', table: op.table });
        begun.add(table);
        break;
      case 'set':
        if (op.verb !== 'add') return null;
        first.push(pick);
        break;
      case 'chain':
        if (op.verb !== 'add') return null;
        if (op.chain.base) {
          hooked.add(`${table} ${op.chain.name}`);
          last.push(pick);
        } else first.push(pick);
        break;
      case 'rule':
        if (op.verb === 'delete' || (op.verb === 'insert' && op.position !== undefined)) return null;
        (hooked.has(`${table} ${op.chain}`) ? last : first).push(pick);
        break;
      case 'element':
        if (op.verb !== 'add') return null;
        lists.push(index);
        elements += op.elements.length;
        break;
    }
  }
  if (elements < opts.minElements) return null;
  const total = lists.reduce((sum, i) => sum + tx.lineLength(i), 0);
  const share = Math.ceil(total / k);
  // Largest first onto the lightest group (LPT): within 4/3 of the best balance.
  const all = lists.flatMap((i) => pieces(tx, i, share)).sort((a, b) => b.weight - a.weight || a.at - b.at || a.part - b.part);
  const groups = Array.from({ length: k }, () => ({ weight: 0, pieces: [] as Piece[] }));
  for (const p of all) {
    const g = groups.reduce((min, x) => (x.weight < min.weight ? x : min));
    g.weight += p.weight;
    g.pieces.push(p);
  }
  return {
    first: NftTransaction.select(first),
    groups: groups
      .filter((g) => g.pieces.length > 0)
      .map((g) => NftTransaction.select(g.pieces.sort((a, b) => a.at - b.at || a.part - b.part).map((p) => p.pick))),
    last: NftTransaction.select(last),
    created: [...created.values()],
    elements,
  };
}

/** What undoes `first` after a later phase failed: its tables, nothing else. */
export function dropCreated(p: NftPhases): NftTransaction {
  const tx = new NftTransaction();
  for (const t of p.created) tx.deleteTable(t);
  return tx;
}
