import type { Logger } from 'pino';
import { ExecError, type Executor, runChecked } from '../../../system/exec.js';
import { familyOfValid, type Family } from '../../../model/net.js';
import {
  hasFamily,
  joinFamilies,
  ofFamily,
  withReplicaRules,
  type NatTables,
  type NetfilterBackend,
  type ReplicaRules,
  type SyncOptions,
  type SyncReport,
} from '../backend.js';
import { CHAINS } from './ruleText.js';
import {
  desiredTables,
  patchFamily,
  planTable,
  renderFamily,
  renderRestore,
  savedAfter,
  TABLES,
  type Rendered,
  type TableName,
  type TableWant,
} from './plan.js';
import { emptyTable, parseSave, type SavedTable } from './save.js';
import { adoptFromSave } from './adopt.js';
import { type IptablesVariant, toolsFor } from './tools.js';
import { timelineMark } from '../../../system/timeline.js';

export { type IptablesVariant, toolsFor } from './tools.js';

/** Every chain and jump natgw may have made (every optional chain too, whatever an earlier configuration added), retired. */
const REMOVAL = ((skeleton: Record<TableName, TableWant>) => {
  const retire = (t: TableWant): TableWant => ({ owned: new Map(), jumps: new Map(), retired: { chains: [...t.owned.keys()], jumps: t.jumps } });
  return { nat: retire(skeleton.nat), mangle: retire(skeleton.mangle) };
})(desiredTables({ vpcIf: 'x', extIf: 'x', eips: [], snats: [], dnats: [], fips: [], dropInvalid: true }));

const inFamily =
  (family: Family) =>
  (ip: string): boolean =>
    familyOfValid(ip) === family;

/**
 * The iptables backend: the script's chains (SPEC §2 layout), edited with one
 * `iptables-restore --noflush` transaction per table from a diff against `iptables-save`.
 * IPv6 objects (API only) get the same layout through ip6tables, which exists only while
 * there are IPv6 objects.
 */
export class IptablesBackend implements NetfilterBackend {
  readonly kind = 'iptables' as const;

  constructor(
    private readonly exec: Executor,
    readonly variant: IptablesVariant,
    private readonly log?: Logger,
    /** What this replica adds to every state's rules (a port slice, invalid dropped). */
    private readonly replica?: ReplicaRules,
  ) {}

  /**
   * natgw's tables as this backend left them (`family/table` → the save form): a partial sync
   * plans against these instead of running iptables-save.
   */
  private view = new Map<string, SavedTable>();

  /** Per family, what the last sync rendered (plan.ts Rendered): a partial sync patches it from the change. */
  private rendered = new Map<Family, Rendered>();

  forget(): void {
    this.view.clear();
    this.rendered.clear();
  }

  private async read(table: TableName, family: Family = 4): Promise<SavedTable> {
    if (!(await this.mayExist(table, family))) return emptyTable;
    const r = await this.exec.run({ file: toolsFor(this.variant, family).save, args: ['-t', table] });
    // ip6tables may be missing or unusable on a v4-only node: that family then holds nothing.
    // Any other failure (a hang, a lock, a crash) is not an empty table: reading it as one
    // would plan to re-create what is there, or adopt nothing.
    if (r.exitCode !== 0 && family === 6 && ip6Unusable(r)) return emptyTable;
    if (r.exitCode !== 0) throw new ExecError(r, 'the listing');
    return parseSave(r.stdout);
  }

  /**
   * False when the kernel has no such legacy table in this namespace (it then holds nothing of
   * natgw's). iptables-legacy-save would create the table just to list it empty, which costs
   * ~0.2 s for ip6tables in a fresh namespace on every full sync of a v4-only gateway.
   */
  private async mayExist(table: TableName, family: Family): Promise<boolean> {
    if (this.variant !== 'legacy' || !this.exec.readKernelFile) return true;
    const names = await this.exec.readKernelFile(family === 4 ? '/proc/net/ip_tables_names' : '/proc/net/ip6_tables_names');
    return names === undefined || names.split('\n').includes(table);
  }

  async isInitialized(): Promise<boolean> {
    const nat = await this.read('nat');
    return (nat.rules.get(CHAINS.snatFilter) ?? []).includes(`-j ${CHAINS.sharedSnat}`);
  }

  async sync(want: NatTables, opts: SyncOptions = {}): Promise<SyncReport> {
    try {
      return await this.syncBoth(withReplicaRules(want, this.replica), opts);
    } catch (e) {
      this.forget();
      throw e;
    }
  }

  /**
   * A full sync of a gateway not yet initialised: what iptables-save shows now becomes the
   * view, as an apply's result would, so that the first change after it (a bulk PUT into an
   * empty gateway) plans against it instead of reading back. A table not read keeps no view.
   */
  async observe(): Promise<void> {
    const keys = ([4, 6] as const).flatMap((family) => TABLES.map((table) => ({ family, table })));
    const read = await Promise.all(
      keys.map(({ family, table }) => (this.view.has(`${family}/${table}`) ? undefined : this.read(table, family).catch(() => undefined))),
    );
    keys.forEach(({ family, table }, i) => {
      const t = read[i];
      if (t) this.view.set(`${family}/${table}`, t);
    });
  }

  /** The table as the last apply left it (partial), else as iptables-save shows it now. */
  private async have(table: TableName, family: Family, opts: SyncOptions): Promise<SavedTable> {
    const trusted = opts.mode === 'partial' ? this.view.get(`${family}/${table}`) : undefined;
    return trusted ?? this.read(table, family);
  }

  private async syncBoth(want: NatTables, opts: SyncOptions): Promise<SyncReport> {
    const v4 = this.renderedFor(4, want, opts);
    const v6 = this.renderedFor(6, want, opts);
    const [v4Report, v6Report] = await Promise.all([
      this.syncFamily(4, v4, opts),
      hasFamily(want, 6) ? this.syncFamily(6, v6, opts) : this.removeFamily(6, opts),
    ]);
    if (!opts.dryRun) {
      this.rendered.set(4, v4);
      this.rendered.set(6, v6);
    }
    return { changes: v4Report.changes + v6Report.changes, script: v4Report.script + v6Report.script };
  }

  /** One family's rendering: the last one patched by a partial sync's change, or rendered anew. */
  private renderedFor(family: Family, want: NatTables, opts: SyncOptions): Rendered {
    const last = opts.mode === 'partial' && opts.change ? this.rendered.get(family) : undefined;
    return (last && opts.change && patchFamily(last, want, opts.change, inFamily(family))) || renderFamily(ofFamily(want, family));
  }

  private async syncFamily(family: Family, want: Rendered, opts: SyncOptions): Promise<SyncReport> {
    const desired = desiredTables(want);
    timelineMark(`iptables: IPv${family} tables desired`);
    const have = await Promise.all(TABLES.map((t) => this.have(t, family, opts)));
    let script = '';
    let changes = 0;
    const touched: TableName[] = [];
    for (const [i, table] of TABLES.entries()) {
      const plan = planTable(have[i] as SavedTable, desired[table], { deleteBySpec: opts.mode === 'partial' });
      const text = renderRestore(table, plan);
      if (text === '') continue;
      changes += plan.changes;
      script += text;
      touched.push(table);
    }
    timelineMark(`iptables: IPv${family} rendered`);
    if (!opts.dryRun) {
      // One run for the family's tables: each commits at its own COMMIT, in order.
      if (script !== '') await this.restore(family, touched, script);
      for (const [i, table] of TABLES.entries()) this.view.set(`${family}/${table}`, savedAfter(have[i] as SavedTable, desired[table]));
    }
    return { changes, script };
  }

  /** --noflush: only the listed edits happen; other owners' chains stay as they are. */
  private async restore(family: Family, names: readonly TableName[], text: string): Promise<void> {
    const tool = toolsFor(this.variant, family).restore;
    await runChecked(
      this.exec,
      { file: tool, args: ['--noflush', '--wait'], input: text },
      `the ${names.join(' and ')} table transaction${names.length > 1 ? 's' : ''}`,
    );
    this.log?.debug({ family, tables: names }, 'iptables transaction applied');
  }

  async readBack(): Promise<NatTables | null> {
    const [nat, mangle, nat6, mangle6] = await Promise.all([this.read('nat'), this.read('mangle'), this.read('nat', 6), this.read('mangle', 6)]);
    return joinFamilies(adoptFromSave(nat, mangle), adoptFromSave(nat6, mangle6));
  }

  async removeAll(): Promise<void> {
    this.forget();
    await this.removeFamily(4, {});
    await this.removeFamily(6, {});
  }

  /** Remove natgw's jumps and chains of one family; nothing to do where there are none. */
  private async removeFamily(family: Family, opts: SyncOptions): Promise<SyncReport> {
    let script = '';
    let changes = 0;
    // nat first: a removal it refuses (another owner jumps into natgw's chains) leaves every
    // table as it was, still pending.
    for (const table of TABLES) {
      const plan = planTable(await this.have(table, family, opts), REMOVAL[table]);
      const text = renderRestore(table, plan);
      if (text === '') continue;
      changes += plan.changes;
      script += text;
      if (!opts.dryRun) await this.restore(family, [table], text);
    }
    if (!opts.dryRun) for (const table of TABLES) this.view.set(`${family}/${table}`, emptyTable);
    return { changes, script };
  }

  async versionLine(): Promise<string> {
    const r = await runChecked(this.exec, { file: toolsFor(this.variant).cmd, args: ['--version'] });
    return r.stdout.trim().split('\n')[0] ?? '';
  }
}

/** ip6tables cannot work here at all (no binary, no IPv6 tables in this kernel), as opposed to failing this once. */
function ip6Unusable(r: { failedToStart: boolean; timedOut: boolean; stderr: string }): boolean {
  if (r.failedToStart) return true;
  return !r.timedOut && /table does not exist|can't initialize|address family not supported|protocol not supported/i.test(r.stderr);
}
