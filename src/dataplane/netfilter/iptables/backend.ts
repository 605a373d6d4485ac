import type { Logger } from 'pino';
import { type Executor, runChecked } from '../../../system/exec.js';
import { SystemError } from '../../../model/errors.js';
import type { NatTables, NetfilterBackend, SyncOptions, SyncReport } from '../backend.js';
import { CHAINS } from '../../../model/ruleText.js';
import { desiredTables, planTable, renderRestore, type TableName } from './plan.js';
import { emptyTable, parseSave, type SavedTable } from './save.js';
import { adoptFromSave } from './adopt.js';

export type IptablesVariant = 'legacy' | 'nft';

export interface IptablesTools {
  readonly cmd: string;
  readonly save: string;
  readonly restore: string;
}

export function toolsFor(variant: IptablesVariant): IptablesTools {
  return { cmd: `iptables-${variant}`, save: `iptables-${variant}-save`, restore: `iptables-${variant}-restore` };
}

const TABLES: readonly TableName[] = ['nat', 'mangle'];

/**
 * The iptables backend: the script's chains (SPEC §2 layout), edited with one
 * `iptables-restore --noflush` transaction per table from a diff against `iptables-save`.
 */
export class IptablesBackend implements NetfilterBackend {
  readonly kind = 'iptables' as const;
  private readonly tools: IptablesTools;

  constructor(
    private readonly exec: Executor,
    readonly variant: IptablesVariant,
    private readonly log?: Logger,
  ) {
    this.tools = toolsFor(variant);
  }

  /**
   * The nat table the init guard just read, handed to the sync that follows it in the same
   * transaction (under natgw's lock) so a command reads a large table once, not twice.
   */
  private guardRead: { at: number; table: SavedTable } | undefined;

  private async read(table: TableName): Promise<SavedTable> {
    if (table === 'nat' && this.guardRead && Date.now() - this.guardRead.at < 1000) {
      const cached = this.guardRead.table;
      this.guardRead = undefined;
      return cached;
    }
    const r = await runChecked(this.exec, { file: this.tools.save, args: ['-t', table] });
    return parseSave(r.stdout);
  }

  async isInitialized(): Promise<boolean> {
    const nat = await this.read('nat');
    this.guardRead = { at: Date.now(), table: nat };
    return (nat.rules.get(CHAINS.snatFilter) ?? []).includes(`-j ${CHAINS.sharedSnat}`);
  }

  async sync(want: NatTables, opts: SyncOptions = {}): Promise<SyncReport> {
    const desired = desiredTables(want);
    let script = '';
    let changes = 0;
    const have = await Promise.all(TABLES.map((t) => this.read(t)));
    for (const [i, table] of TABLES.entries()) {
      const plan = planTable(have[i] ?? emptyTable, desired[table]);
      const text = renderRestore(table, plan);
      if (text === '') continue;
      changes += plan.changes;
      script += text;
      if (opts.dryRun) continue;
      // --noflush: only the listed edits happen; other owners' chains stay as they are.
      const r = await this.exec.run({ file: this.tools.restore, args: ['--noflush', '--wait'], input: text });
      if (r.exitCode !== 0) {
        throw new SystemError(`Error: ${this.tools.restore} rejected the ${table} table transaction: ${r.stderr.trim() || r.stdout.trim()}`);
      }
      this.log?.debug({ table, changes: plan.changes }, 'iptables transaction applied');
    }
    return { changes, script };
  }

  async readBack(): Promise<NatTables | null> {
    const [nat, mangle] = await Promise.all([this.read('nat'), this.read('mangle')]);
    return adoptFromSave(nat, mangle);
  }

  async removeAll(): Promise<void> {
    const skeleton = desiredTables({ vpcIf: 'x', extIf: 'x', eips: [], snats: [], dnats: [], fips: [] });
    for (const table of TABLES) {
      const have = await this.read(table);
      const owned = [...skeleton[table].owned.keys()];
      const lines: string[] = [];
      for (const [builtin, jump] of skeleton[table].jumps) {
        for (const r of have.rules.get(builtin) ?? []) if (r === jump) lines.push(`-D ${builtin} ${jump}`);
      }
      const present = owned.filter((c) => have.chains.has(c));
      // Flush all first: a chain can only be deleted once nothing jumps to it.
      for (const c of present) lines.push(`-F ${c}`);
      for (const c of present) lines.push(`-X ${c}`);
      if (lines.length === 0) continue;
      const r = await this.exec.run({ file: this.tools.restore, args: ['--noflush', '--wait'], input: `*${table}\n${lines.join('\n')}\nCOMMIT\n` });
      if (r.exitCode !== 0) throw new SystemError(`Error: removing natgw's ${table} chains failed: ${r.stderr.trim()}`);
    }
  }

  async versionLine(): Promise<string> {
    const r = await runChecked(this.exec, { file: this.tools.cmd, args: ['--version'] });
    return r.stdout.trim().split('\n')[0] ?? '';
  }
}
