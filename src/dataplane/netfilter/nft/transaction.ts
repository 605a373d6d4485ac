/**
 * One nft transaction, built from typed operations and rendered as ONE script for `nft -f -`
 * (knftables' transaction.go): the renderers say what to change, the client runs it once.
 * The operations stay readable after rendering, so an in-memory fake applies exactly what
 * the kernel would be sent, without parsing text.
 *
 * Every name and element placed in the script is plain data (checked here: a value that
 * could be read as nft syntax is a programmer error, never written). Rule bodies are
 * rendered by their owners (render.ts, shareDnatRender.ts, eipCounters.ts) from validated
 * values, interface names quoted; a rule may carry the JSON `nft -j` lists it as, which
 * read-back recognition compares against.
 */

export type NftTableFamily = 'ip' | 'ip6' | 'inet';

export interface NftTableRef {
  readonly family: NftTableFamily;
  readonly name: string;
}

/** Written by name where nft knows one for the hook (`dstnat`), else by number. */
export type NftPriority = number | 'raw' | 'mangle' | 'dstnat' | 'filter' | 'security' | 'srcnat';

export interface NftBaseChainSpec {
  readonly type: 'filter' | 'nat' | 'route';
  readonly hook: 'prerouting' | 'input' | 'forward' | 'output' | 'postrouting';
  readonly priority: NftPriority;
  /** Omitted from the script when unset (the kernel's default is accept). */
  readonly policy?: 'accept' | 'drop';
}

export interface NftChainSpec {
  readonly name: string;
  /** Absent for a regular chain. */
  readonly base?: NftBaseChainSpec;
}

export interface NftSetSpec {
  readonly name: string;
  readonly kind: 'set' | 'map';
  /** Key type, concatenations joined with ` . ` (`ipv4_addr . inet_proto . inet_service`). */
  readonly type: string;
  /** Data type of a map (`ipv4_addr`, `verdict`). */
  readonly map?: string;
  /** Per-element counters. */
  readonly counter?: boolean;
}

/** An element as nft prints it: `1.2.3.4 . tcp . 80`, value `10.0.1.6 . 8080` or `goto dnat-…`. */
export interface NftElement {
  readonly key: string;
  readonly value?: string;
}

export interface NftRule {
  /** The rule as written after `add rule <table> <chain> `. */
  readonly text: string;
  /** Its expressions as `nft -j` lists them, where the owner knows them. */
  readonly expr?: readonly unknown[];
}

export type NftOp =
  | { readonly verb: 'add' | 'delete'; readonly object: 'table'; readonly table: NftTableRef }
  /** `create table`: refused (EEXIST) when the table exists, so a table it made is certainly natgw's. */
  | { readonly verb: 'create'; readonly object: 'table'; readonly table: NftTableRef }
  | { readonly verb: 'add'; readonly object: 'chain'; readonly table: NftTableRef; readonly chain: NftChainSpec }
  | { readonly verb: 'flush' | 'delete'; readonly object: 'chain'; readonly table: NftTableRef; readonly name: string }
  | { readonly verb: 'add'; readonly object: 'set'; readonly table: NftTableRef; readonly set: NftSetSpec }
  | { readonly verb: 'delete'; readonly object: 'set'; readonly table: NftTableRef; readonly kind: 'set' | 'map'; readonly name: string }
  | {
      readonly verb: 'add' | 'delete';
      readonly object: 'element';
      readonly table: NftTableRef;
      readonly set: string;
      readonly elements: readonly NftElement[];
    }
  | { readonly verb: 'add'; readonly object: 'rule'; readonly table: NftTableRef; readonly chain: string; readonly rule: NftRule }
  | {
      readonly verb: 'insert';
      readonly object: 'rule';
      readonly table: NftTableRef;
      readonly chain: string;
      readonly rule: NftRule;
      /** Before the rule with this handle; at the head of the chain when absent. */
      readonly position?: number;
      /**
       * Before the rule at this index (0-based, counting the rules this transaction added
       * before it): no handle needed, so a partial sync places a rule without reading back.
       */
      readonly index?: number;
    }
  | { readonly verb: 'delete'; readonly object: 'rule'; readonly table: NftTableRef; readonly chain: string; readonly handle: number };

const NAME = /^[A-Za-z0-9_][A-Za-z0-9_.-]*$/;
/** Addresses, prefixes, protocol names, ports, verdicts: what natgw's elements are made of. */
const ELEMENT = /^[0-9A-Za-z.:/ _-]+$/;

/** Whether an element's key or value as nft listed it may be written back into a script (a stale element's delete). */
export const isPlainElement = (text: string): boolean => ELEMENT.test(text);
const TYPE = /^[a-z0-9_]+( \. [a-z0-9_]+)*$/;

function checked(re: RegExp, what: string, v: string): string {
  if (!re.test(v)) throw new TypeError(`nft transaction: ${what} ${JSON.stringify(v)} is not plain data`);
  return v;
}

function checkHandle(h: number): number {
  if (!Number.isInteger(h) || h < 0) throw new TypeError(`nft transaction: handle ${h} is not a kernel handle`);
  return h;
}

const tableText = (t: NftTableRef): string => `${t.family} ${checked(NAME, 'table', t.name)}`;

function chainDecl(b: NftBaseChainSpec | undefined): string {
  if (!b) return '';
  const policy = b.policy ? ` policy ${b.policy};` : '';
  return ` { type ${b.type} hook ${b.hook} priority ${b.priority};${policy} }`;
}

function setDecl(s: NftSetSpec): string {
  const type = checked(TYPE, 'type', s.type);
  if (s.kind === 'map') return `{ type ${type} : ${checked(TYPE, 'type', s.map ?? '')}; }`;
  return `{ type ${type};${s.counter ? ' counter;' : ''} }`;
}

function elementText(e: NftElement): string {
  const key = checked(ELEMENT, 'element', e.key);
  return e.value === undefined ? key : `${key} : ${checked(ELEMENT, 'element value', e.value)}`;
}

/** One operation as the line nft reads. */
export function opText(op: NftOp): string {
  const t = tableText(op.table);
  switch (op.object) {
    case 'table':
      return `${op.verb} table ${t}`;
    case 'chain':
      return op.verb === 'add'
        ? `add chain ${t} ${checked(NAME, 'chain', op.chain.name)}${chainDecl(op.chain.base)}`
        : `${op.verb} chain ${t} ${checked(NAME, 'chain', op.name)}`;
    case 'set':
      return op.verb === 'add'
        ? `add ${op.set.kind} ${t} ${checked(NAME, op.set.kind, op.set.name)} ${setDecl(op.set)}`
        : `delete ${op.kind} ${t} ${checked(NAME, op.kind, op.name)}`;
    case 'element':
      return `${op.verb} element ${t} ${checked(NAME, 'set', op.set)} { ${op.elements.map(elementText).join(', ')} }`;
    case 'rule': {
      const c = `${t} ${checked(NAME, 'chain', op.chain)}`;
      if (op.verb === 'delete') return `delete rule ${c} handle ${checkHandle(op.handle)}`;
      if (op.verb === 'insert' && op.position !== undefined) return `insert rule ${c} position ${checkHandle(op.position)} ${op.rule.text}`;
      if (op.verb === 'insert' && op.index !== undefined) return `insert rule ${c} index ${checkHandle(op.index)} ${op.rule.text}`;
      return `${op.verb} rule ${c} ${op.rule.text}`;
    }
  }
}

/** An operation of another transaction, its line reused as rendered there. */
export interface NftPick {
  readonly from: NftTransaction;
  readonly index: number;
}

/**
 * Operations collected in order and run once. Typed methods only: a caller cannot slip raw
 * text in except as a rule body. Empty element lists add nothing, so callers need not check.
 */
export class NftTransaction {
  private readonly list: NftOp[] = [];
  /** Each operation's line, rendered when it was added (a bulk change renders once). */
  private readonly lines: string[] = [];

  /** Several transactions as one, in the given order (phases of one change, a folded one). */
  static concat(...parts: ReadonlyArray<NftTransaction | undefined>): NftTransaction {
    const tx = new NftTransaction();
    for (const p of parts) {
      if (!p) continue;
      for (const op of p.list) tx.list.push(op);
      for (const l of p.lines) tx.lines.push(l);
    }
    return tx;
  }

  /**
   * Operations of other transactions (their lines as rendered there: a split of a bulk change
   * renders nothing twice), or new ones (rendered and checked now), in the given order.
   */
  static select(picks: ReadonlyArray<NftPick | NftOp>): NftTransaction {
    const tx = new NftTransaction();
    for (const p of picks) {
      if ('from' in p) {
        tx.list.push(p.from.list[p.index] as NftOp);
        tx.lines.push(p.from.lines[p.index] as string);
      } else tx.push(p);
    }
    return tx;
  }

  get ops(): readonly NftOp[] {
    return this.list;
  }

  /** The length of operation `index`'s line: what nft parses for it. */
  lineLength(index: number): number {
    return this.lines[index]?.length ?? 0;
  }

  get isEmpty(): boolean {
    return this.list.length === 0;
  }

  /** The script for `nft -f -`: one line per operation; '' when there is nothing to do. */
  text(): string {
    return this.lines.length === 0 ? '' : `${this.lines.join('\n')}\n`;
  }

  private push(op: NftOp): this {
    // Rendered now, so a value that is not plain data fails where it was added, not at run time.
    this.lines.push(opText(op));
    this.list.push(op);
    return this;
  }

  addTable(table: NftTableRef): this {
    return this.push({ verb: 'add', object: 'table', table });
  }

  createTable(table: NftTableRef): this {
    return this.push({ verb: 'create', object: 'table', table });
  }

  deleteTable(table: NftTableRef): this {
    return this.push({ verb: 'delete', object: 'table', table });
  }

  addChain(table: NftTableRef, chain: NftChainSpec): this {
    return this.push({ verb: 'add', object: 'chain', table, chain });
  }

  flushChain(table: NftTableRef, name: string): this {
    return this.push({ verb: 'flush', object: 'chain', table, name });
  }

  deleteChain(table: NftTableRef, name: string): this {
    return this.push({ verb: 'delete', object: 'chain', table, name });
  }

  addSet(table: NftTableRef, set: Omit<NftSetSpec, 'kind' | 'map'>): this {
    return this.push({ verb: 'add', object: 'set', table, set: { ...set, kind: 'set' } });
  }

  addMap(table: NftTableRef, map: Omit<NftSetSpec, 'kind' | 'counter'> & { readonly map: string }): this {
    return this.push({ verb: 'add', object: 'set', table, set: { ...map, kind: 'map' } });
  }

  deleteSet(table: NftTableRef, kind: 'set' | 'map', name: string): this {
    return this.push({ verb: 'delete', object: 'set', table, kind, name });
  }

  addElements(table: NftTableRef, set: string, elements: readonly NftElement[]): this {
    return elements.length === 0 ? this : this.push({ verb: 'add', object: 'element', table, set, elements });
  }

  /** By key: nft finds a map element by its key alone. */
  deleteElements(table: NftTableRef, set: string, keys: readonly string[]): this {
    return keys.length === 0 ? this : this.push({ verb: 'delete', object: 'element', table, set, elements: keys.map((key) => ({ key })) });
  }

  addRule(table: NftTableRef, chain: string, rule: NftRule): this {
    return this.push({ verb: 'add', object: 'rule', table, chain, rule });
  }

  insertRule(table: NftTableRef, chain: string, rule: NftRule, position?: number): this {
    return this.push({ verb: 'insert', object: 'rule', table, chain, rule, ...(position === undefined ? {} : { position }) });
  }

  /** Before the rule now at `index` of the chain (nft's `insert rule … index N`). */
  insertRuleAt(table: NftTableRef, chain: string, rule: NftRule, index: number): this {
    return this.push({ verb: 'insert', object: 'rule', table, chain, rule, index });
  }

  deleteRule(table: NftTableRef, chain: string, handle: number): this {
    return this.push({ verb: 'delete', object: 'rule', table, chain, handle });
  }
}
