/**
 * The kernel side of the fake nft (fakeNft.ts): nftables' objects in memory and how one
 * transaction changes them, operation by operation, with the kernel's refusals. Kept apart
 * from the client so each stays readable; see fakeNft.ts for what is modelled and what not.
 */
import { canonicalIp, isIpv6 } from '../../src/model/net.js';
import type { BaseHook } from '../../src/dataplane/netfilter/tables/model.js';
import type { NftOp, NftPriority, NftRule, NftTableFamily, NftTableRef } from '../../src/dataplane/netfilter/nft/transaction.js';

/** Priority names as nft resolves them for the ip, ip6 and inet families. */
const PRIORITY: Record<Exclude<NftPriority, number>, number> = { raw: -300, mangle: -150, dstnat: -100, filter: 0, security: 50, srcnat: 100 };

const STRERROR = {
  ENOENT: 'No such file or directory',
  EEXIST: 'File exists',
  EBUSY: 'Device or resource busy',
  EOPNOTSUPP: 'Operation not supported',
  EINVAL: 'Invalid argument',
} as const;
export type Errno = keyof typeof STRERROR;

/** Why one operation was refused, and by whom: nft itself (nothing sent) or the kernel. */
export class Refusal extends Error {
  constructor(
    readonly errno: Errno,
    readonly by: 'nft' | 'kernel',
  ) {
    super(STRERROR[errno]);
  }
}

export interface FakeRule {
  readonly handle: number;
  readonly expr: readonly unknown[];
  /** Chains it jumps or goes to, sets it looks up: what keeps them from being deleted. */
  readonly chainRefs: readonly string[];
  readonly setRefs: readonly string[];
}

export interface FakeChain {
  readonly name: string;
  readonly handle: number;
  base?: BaseHook;
  rules: FakeRule[];
}

export interface FakeSet {
  readonly name: string;
  readonly handle: number;
  readonly kind: 'set' | 'map';
  readonly type: string;
  readonly map?: string;
  readonly counter: boolean;
  /** Canonical key text → value text (undefined in a plain set), in insertion order. */
  readonly elements: Map<string, string | undefined>;
}

export interface FakeTable {
  readonly family: NftTableFamily;
  readonly name: string;
  /** The last handle given out in this table. */
  counter: number;
  readonly chains: Map<string, FakeChain>;
  readonly sets: Map<string, FakeSet>;
}

export const tableKey = (family: string, name: string): string => `${family} ${name}`;

/** Element text as nft lists it back: IPv6 in canonical form, the rest as written. */
export function canonicalElement(text: string): string {
  return text
    .split(' . ')
    .map((t) => (isIpv6(t) ? canonicalIp(t) : t))
    .join(' . ');
}

/** What a rule's JSON refers to, and how many anonymous sets (`{ tcp, udp }`, `map { 0 : … }`) it carries. */
function refsOfExpr(expr: readonly unknown[]): { chains: string[]; sets: string[]; anonymous: number } {
  const out = { chains: [] as string[], sets: [] as string[], anonymous: 0 };
  const walk = (v: unknown): void => {
    if (typeof v === 'string') {
      if (v.startsWith('@')) out.sets.push(v.slice(1));
    } else if (Array.isArray(v)) {
      v.forEach(walk);
    } else if (typeof v === 'object' && v !== null) {
      for (const [k, val] of Object.entries(v)) {
        if ((k === 'jump' || k === 'goto') && typeof val === 'object' && val !== null && typeof (val as { target?: unknown }).target === 'string') {
          out.chains.push((val as { target: string }).target);
        } else if (k === 'set' && Array.isArray(val)) {
          out.anonymous++;
          walk(val);
        } else {
          walk(val);
        }
      }
    }
  };
  walk(expr);
  return out;
}

/** The same, read off a rule's text where no JSON was given (a foreign rule). */
function refsOfText(text: string): { chains: string[]; sets: string[]; anonymous: number } {
  return {
    chains: [...text.matchAll(/\b(?:jump|goto) ([A-Za-z0-9_.-]+)/g)].map((m) => m[1] as string),
    sets: [...text.matchAll(/@([A-Za-z0-9_.-]+)/g)].map((m) => m[1] as string),
    anonymous: (text.match(/\{/g) ?? []).length,
  };
}

function cloneTable(t: FakeTable): FakeTable {
  return {
    family: t.family,
    name: t.name,
    counter: t.counter,
    chains: new Map([...t.chains].map(([n, c]) => [n, { ...c, rules: [...c.rules] }])),
    sets: new Map([...t.sets].map(([n, s]) => [n, { ...s, elements: new Map(s.elements) }])),
  };
}

/**
 * One transaction against a copy of the tables: operations in order, each refused one
 * skipped (the kernel goes on through the batch to report every error), then kept or dropped
 * whole by the caller.
 */
export class Batch {
  readonly tables: Map<string, FakeTable>;
  /** Copy → the live table it was copied from: its handles stay consumed on a refusal. */
  readonly origin = new Map<FakeTable, FakeTable>();
  first: { refusal: Refusal; op: NftOp } | undefined;
  refusedByNft = false;

  constructor(live: ReadonlyMap<string, FakeTable>) {
    this.tables = new Map(
      [...live].map(([k, t]) => {
        const copy = cloneTable(t);
        this.origin.set(copy, t);
        return [k, copy] as const;
      }),
    );
  }

  apply(op: NftOp): void {
    try {
      this.one(op);
    } catch (e) {
      if (!(e instanceof Refusal)) throw e;
      this.first ??= { refusal: e, op };
      if (e.by === 'nft') this.refusedByNft = true;
    }
  }

  private table(t: NftTableRef): FakeTable {
    const table = this.tables.get(tableKey(t.family, t.name));
    if (!table) throw new Refusal('ENOENT', 'kernel');
    return table;
  }

  private chain(table: FakeTable, name: string): FakeChain {
    const c = table.chains.get(name);
    if (!c) throw new Refusal('ENOENT', 'kernel');
    return c;
  }

  /** nft looks sets up itself (it needs their types), so a missing one never reaches the kernel. */
  private set(t: NftTableRef, name: string): FakeSet {
    const s = this.tables.get(tableKey(t.family, t.name))?.sets.get(name);
    if (!s) throw new Refusal('ENOENT', 'nft');
    return s;
  }

  private one(op: NftOp): void {
    switch (op.object) {
      case 'table':
        this.onTable(op);
        return;
      case 'chain':
        this.onChain(op);
        return;
      case 'set':
        this.onSet(op);
        return;
      case 'element':
        this.onElements(op);
        return;
      case 'rule':
        this.onRule(op);
        return;
    }
  }

  private onTable(op: Extract<NftOp, { object: 'table' }>): void {
    const k = tableKey(op.table.family, op.table.name);
    if (op.verb === 'create' && this.tables.has(k)) throw new Refusal('EEXIST', 'kernel');
    if (op.verb === 'add' || op.verb === 'create') {
      if (!this.tables.has(k)) this.tables.set(k, { family: op.table.family, name: op.table.name, counter: 0, chains: new Map(), sets: new Map() });
      return;
    }
    this.table(op.table);
    this.tables.delete(k);
  }

  private onChain(op: Extract<NftOp, { object: 'chain' }>): void {
    const table = this.table(op.table);
    if (op.verb === 'add') {
      const have = table.chains.get(op.chain.name);
      const b = op.chain.base;
      const base: BaseHook | undefined = b && {
        type: b.type,
        hook: b.hook,
        priority: typeof b.priority === 'number' ? b.priority : PRIORITY[b.priority],
        policy: b.policy ?? have?.base?.policy ?? 'accept',
      };
      if (!have) {
        table.chains.set(op.chain.name, { name: op.chain.name, handle: ++table.counter, ...(base ? { base } : {}), rules: [] });
        return;
      }
      if (!base) return;
      if (!have.base) throw new Refusal('EOPNOTSUPP', 'kernel');
      if (have.base.type !== base.type) throw new Refusal('EEXIST', 'kernel');
      if (have.base.hook !== base.hook || have.base.priority !== base.priority) throw new Refusal('EOPNOTSUPP', 'kernel');
      table.chains.set(have.name, { ...have, base });
      return;
    }
    const chain = this.chain(table, op.name);
    if (op.verb === 'flush') {
      table.chains.set(chain.name, { ...chain, rules: [] });
      return;
    }
    if (chain.rules.length > 0 || this.chainInUse(table, chain.name)) throw new Refusal('EBUSY', 'kernel');
    table.chains.delete(chain.name);
  }

  private chainInUse(table: FakeTable, name: string): boolean {
    for (const c of table.chains.values()) if (c.rules.some((r) => r.chainRefs.includes(name))) return true;
    for (const s of table.sets.values()) {
      if (s.map !== 'verdict') continue;
      for (const v of s.elements.values()) if (v === `goto ${name}` || v === `jump ${name}`) return true;
    }
    return false;
  }

  private onSet(op: Extract<NftOp, { object: 'set' }>): void {
    const table = this.table(op.table);
    if (op.verb === 'delete') {
      // nft deletes a set and a map alike by name, whichever keyword was written.
      if (!table.sets.has(op.name)) throw new Refusal('ENOENT', 'kernel');
      for (const c of table.chains.values()) if (c.rules.some((r) => r.setRefs.includes(op.name))) throw new Refusal('EBUSY', 'kernel');
      table.sets.delete(op.name);
      return;
    }
    const spec = op.set;
    const have = table.sets.get(spec.name);
    if (have) {
      const same = have.kind === spec.kind && have.type === spec.type && (have.map ?? '') === (spec.map ?? '') && have.counter === !!spec.counter;
      if (!same) throw new Refusal('EEXIST', 'kernel');
      return;
    }
    table.sets.set(spec.name, {
      name: spec.name,
      handle: ++table.counter,
      kind: spec.kind,
      type: spec.type,
      ...(spec.kind === 'map' ? { map: spec.map ?? '' } : {}),
      counter: !!spec.counter,
      elements: new Map(),
    });
  }

  private onElements(op: Extract<NftOp, { object: 'element' }>): void {
    const set = this.set(op.table, op.set);
    const table = this.table(op.table);
    for (const e of op.elements) {
      const k = canonicalElement(e.key);
      if (op.verb === 'delete') {
        if (!set.elements.has(k)) throw new Refusal('ENOENT', 'kernel');
        set.elements.delete(k);
        continue;
      }
      if ((set.kind === 'map') !== (e.value !== undefined)) throw new Refusal('EINVAL', 'nft');
      const v = e.value === undefined ? undefined : canonicalElement(e.value);
      const verdict = v === undefined ? undefined : /^(?:goto|jump) (\S+)$/.exec(v)?.[1];
      if (verdict !== undefined) {
        const target = table.chains.get(verdict);
        if (!target) throw new Refusal('ENOENT', 'kernel');
        if (target.base) throw new Refusal('EOPNOTSUPP', 'kernel');
      }
      if (set.elements.has(k)) {
        if (set.elements.get(k) !== v) throw new Refusal('EEXIST', 'kernel');
        continue;
      }
      set.elements.set(k, v);
    }
  }

  private onRule(op: Extract<NftOp, { object: 'rule' }>): void {
    const table = this.table(op.table);
    if (op.verb === 'delete') {
      const chain = this.chain(table, op.chain);
      const at = chain.rules.findIndex((r) => r.handle === op.handle);
      if (at === -1) throw new Refusal('ENOENT', 'kernel');
      table.chains.set(chain.name, { ...chain, rules: chain.rules.filter((_, i) => i !== at) });
      return;
    }
    const rule: NftRule = op.rule;
    const refs = rule.expr ? refsOfExpr(rule.expr) : refsOfText(rule.text);
    for (const s of refs.sets) this.set(op.table, s);
    // Anonymous sets are sent ahead of their rule and numbered first, whatever becomes of it.
    table.counter += refs.anonymous;
    const chain = this.chain(table, op.chain);
    let at = op.verb === 'add' ? chain.rules.length : 0;
    if (op.verb === 'insert' && op.position !== undefined) {
      // nft resolves a position against the rules it listed first, and sends nothing without it.
      at = chain.rules.findIndex((r) => r.handle === op.position);
      if (at === -1) throw new Refusal('ENOENT', 'nft');
    }
    if (op.verb === 'insert' && op.index !== undefined) {
      // nft turns an index into the handle of the rule there, counting rules added earlier in
      // the same transaction; an index past the last rule is refused before anything is sent.
      if (op.index >= chain.rules.length) throw new Refusal('ENOENT', 'nft');
      at = op.index;
    }
    const handle = ++table.counter;
    for (const c of refs.chains) {
      const target = table.chains.get(c);
      if (!target) throw new Refusal('ENOENT', 'kernel');
      if (target.base) throw new Refusal('EOPNOTSUPP', 'kernel');
    }
    const expr = rule.expr ? structuredClone([...rule.expr]) : [{ opaque: rule.text }];
    const rules = [...chain.rules];
    rules.splice(at, 0, { handle, expr, chainRefs: refs.chains, setRefs: refs.sets });
    table.chains.set(chain.name, { ...chain, rules });
  }
}
