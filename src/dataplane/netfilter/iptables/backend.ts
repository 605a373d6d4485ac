import { ExecError, type Executor, runChecked } from '../../../system/exec.js';
import type { Family } from '../../../model/net.js';
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

/** Every chain and jump natgw may have made (every optional chain too, whatever an earlier configuration added), retired. */
const REMOVAL = ((skeleton: Record<TableName, TableWant>) => {
  const retire = (t: TableWant): TableWant => ({ owned: new Map(), jumps: new Map(), retired: { chains: [...t.owned.keys()], jumps: t.jumps } });
  return { nat: retire(skeleton.nat), mangle: retire(skeleton.mangle) };
})(desiredTables({ vpcIf: 'x', extIf: 'x', eips: [], snats: [], dnats: [], fips: [], dropInvalid: true }));

/**
 * The iptables backend: the script's chains (SPEC §2 layout), edited with one
 * `iptables-restore --noflush` run per family from a diff against `iptables-save`.
 * IPv6 objects (API only) get the same layout through ip6tables, which exists only while
 * there are IPv6 objects.
 */
export class IptablesBackend implements NetfilterBackend {
  readonly kind = 'iptables' as const;

  constructor(
    private readonly exec: Executor,
    readonly variant: IptablesVariant,
    /** What this replica adds to every state's rules (a port slice, invalid dropped). */
    private readonly replica?: ReplicaRules,
  ) {}

  /**
   * Per family, what the last apply rendered (plan.ts Rendered) and made natgw's tables hold: a
   * partial sync plans against those tables instead of running iptables-save, and patches the
   * rendering from the change.
   */
  private last = new Map<Family, { rendered: Rendered; desired: Record<TableName, TableWant> }>();
  /**
   * The tables as a full sync of a gateway not yet initialised saw them (observe), by
   * `family/table`: the first change after it (a bulk PUT into an empty gateway) plans against
   * these instead of reading back. Dropped by any apply.
   */
  private observed = new Map<string, SavedTable>();

  forget(): void {
    this.last.clear();
    this.observed.clear();
  }

  async observe(): Promise<void> {
    const keys = ([4, 6] as const).flatMap((family) => TABLES.map((table) => `${family}/${table}`));
    const read = await Promise.all(([4, 6] as const).flatMap((family) => TABLES.map((table) => this.read(table, family).catch(() => undefined))));
    this.observed.clear();
    keys.forEach((key, i) => {
      const t = read[i];
      if (t) this.observed.set(key, t);
    });
  }

  /** One table as iptables-save shows it now. */
  async read(table: TableName, family: Family = 4): Promise<SavedTable> {
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
   * natgw's; with no list at all, ip_tables is not loaded and there are no legacy tables).
   * iptables-legacy-save would create the table just to list it empty: ~0.2 s for ip6tables in
   * a fresh namespace on every full sync of a v4-only gateway, and a nat table that the
   * script's variant probe would then take for legacy iptables in use.
   */
  private async mayExist(table: TableName, family: Family): Promise<boolean> {
    if (this.variant !== 'legacy' || !this.exec.readKernelFile) return true;
    const names = await this.exec.readKernelFile(family === 4 ? '/proc/net/ip_tables_names' : '/proc/net/ip6_tables_names');
    return names?.split('\n').includes(table) === true;
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

  /** The table as the last apply left it or observe saw it (partial), else as iptables-save shows it now. */
  private async have(table: TableName, family: Family, opts: SyncOptions): Promise<SavedTable> {
    if (opts.mode === 'partial') {
      const last = this.last.get(family);
      if (last) return savedAfter(last.desired[table]);
      const seen = this.observed.get(`${family}/${table}`);
      if (seen) return seen;
    }
    return this.read(table, family);
  }

  /** ip6tables holds natgw's chains only while there are IPv6 objects. */
  private async syncBoth(want: NatTables, opts: SyncOptions): Promise<SyncReport> {
    const v4 = this.renderedFor(4, want, opts);
    const v6 = this.renderedFor(6, want, opts);
    const d4 = desiredTables(v4);
    const d6 = hasFamily(want, 6) ? desiredTables(v6) : REMOVAL;
    const [v4Report, v6Report] = await Promise.all([this.syncFamily(4, d4, opts), this.syncFamily(6, d6, opts)]);
    if (!opts.dryRun) {
      this.last.set(4, { rendered: v4, desired: d4 });
      this.last.set(6, { rendered: v6, desired: d6 });
      this.observed.clear();
    }
    return { changes: v4Report.changes + v6Report.changes, script: v4Report.script + v6Report.script };
  }

  /** One family's rendering: the last one patched by a partial sync's change, or rendered anew. */
  private renderedFor(family: Family, want: NatTables, opts: SyncOptions): Rendered {
    const last = opts.mode === 'partial' && opts.change ? this.last.get(family)?.rendered : undefined;
    return (last && opts.change && patchFamily(last, want, opts.change, family)) || renderFamily(ofFamily(want, family));
  }

  /**
   * One family's tables made `desired`, in one iptables-restore run: each table commits at its
   * own COMMIT, in order, and a table it refuses stops the run there. nat goes first, so a
   * removal it refuses (another owner jumps into natgw's chains) leaves every table as it was.
   */
  private async syncFamily(family: Family, desired: Record<TableName, TableWant>, opts: SyncOptions): Promise<SyncReport> {
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
    if (!opts.dryRun && script !== '') {
      // --noflush: only the listed edits happen; other owners' chains stay as they are.
      const request = { file: toolsFor(this.variant, family).restore, args: ['--noflush', '--wait'], input: script };
      await runChecked(this.exec, request, `the ${touched.join(' and ')} table transaction${touched.length > 1 ? 's' : ''}`);
    }
    return { changes, script };
  }

  async readBack(): Promise<NatTables | null> {
    const [nat, mangle, nat6, mangle6] = await Promise.all([this.read('nat'), this.read('mangle'), this.read('nat', 6), this.read('mangle', 6)]);
    return joinFamilies(adoptFromSave(nat, mangle), adoptFromSave(nat6, mangle6));
  }

  async removeAll(): Promise<void> {
    this.forget();
    for (const family of [4, 6] as const) await this.syncFamily(family, REMOVAL, {});
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
