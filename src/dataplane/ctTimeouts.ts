import type { Logger } from 'pino';
import { ExecError, runChecked, type Executor } from '../system/exec.js';
import type { DesiredState } from '../state/state.js';
import type { SyncMode } from './netfilter/backend.js';
import type { NftClient } from './netfilter/nft/client.js';
import { toolsFor, type IptablesVariant } from './netfilter/iptables/tools.js';
import {
  CT_SETS,
  CT_TABLE,
  compareLine,
  iptCtFamily,
  isConfigured,
  nftCtTable,
  parseIptCt,
  parseNfctList,
  parseNftCt,
  planIptCt,
  planNftCt,
  type CtTimeoutPolicy,
  type IptCtFamily,
  type IptCtHave,
  type NftCtHave,
  type NftCtTable,
} from './ctTimeoutsRender.js';

/** The netfilter backend the timeouts follow (its kernel interface and tools). */
export type CtTarget = { readonly kind: 'nftables' } | { readonly kind: 'iptables'; readonly variant: IptablesVariant };

export interface CtSyncResult {
  readonly changes: number;
  readonly script: string;
  readonly notes: readonly string[];
}

const FAMILIES = [4, 6] as const;
type IptView = Record<4 | 6, IptCtHave>;

/** What this process applied last, valid for one target: a partial sync plans against it. */
type View = { readonly key: string; readonly nft: NftCtHave } | { readonly key: string; readonly ipt: IptView };

const keyOf = (t: CtTarget): string => (t.kind === 'nftables' ? 'nftables' : `iptables-${t.variant}`);

/** A kernel that lacks cttimeout support refuses this; anything else creates and deletes a scratch table. */
const NFT_PROBE = `table inet ${CT_TABLE}_probe {\n\tct timeout p {\n\t\tprotocol udp; l3proto ip; policy = { unreplied: 30 };\n\t}\n}\ndelete table inet ${CT_TABLE}_probe\n`;

const lineCount = (s: string): number => s.split('\n').filter((l) => l.trim() !== '').length;

/**
 * The thin layer of connection timeouts (ctTimeoutsRender.ts is the pure one): reads what natgw
 * holds (a full sync, or no view), plans, applies. Where the kernel or the tools cannot hold
 * timeout policies (no nfnetlink_cttimeout, no `nfct`), it says so once in the log and in the
 * change's notes and leaves the flows the kernel's timeouts; the NAT itself is unaffected.
 */
export class CtTimeouts {
  private view: View | undefined;
  private readonly supported = new Map<string, boolean>();
  /** What an earlier configuration left is removed by the first full sync (leftovers). */
  private cleaned = false;
  /** The backend the policy was last reported in place for (logged once per backend). */
  private announced: string | undefined;
  /** Said once, with the sync that found timeouts unsupported. */
  private note: string | undefined;

  constructor(
    private readonly exec: Executor,
    private readonly nft: NftClient,
    private readonly log: Logger,
    readonly policy: CtTimeoutPolicy | undefined,
  ) {}

  get configured(): boolean {
    return isConfigured(this.policy);
  }

  /** The next sync reads the kernel back. */
  forget(): void {
    this.view = undefined;
  }

  async sync(want: DesiredState, target: CtTarget, opts: { mode: SyncMode; dryRun?: boolean }): Promise<CtSyncResult> {
    const policy = this.policy;
    const left = await this.leftovers(target, isConfigured(policy), opts);
    if (!isConfigured(policy)) return left;
    const key = keyOf(target);
    if (!(await this.probe(target, key))) {
      const notes = this.note ? [this.note] : [];
      this.note = undefined;
      return { changes: 0, script: '', notes };
    }
    try {
      const r =
        target.kind === 'nftables' ? await this.syncNft(nftCtTable(want, policy), key, opts) : await this.syncIpt(want, policy, target.variant, key, opts);
      if (!opts.dryRun && this.announced !== key) {
        this.announced = key;
        this.log.info({ backend: key, seconds: policy }, 'connection timeouts in place for the flows natgw translates');
      }
      return { ...r, changes: r.changes + left.changes, script: left.script + r.script };
    } catch (e) {
      this.view = undefined;
      throw e;
    }
  }

  /** Once per target: can this kernel (and its tools) hold timeout policies? */
  private async probe(target: CtTarget, key: string): Promise<boolean> {
    const known = this.supported.get(key);
    if (known !== undefined) return known;
    const why = target.kind === 'nftables' ? await this.probeNft() : await this.probeNfct();
    const ok = why === undefined;
    this.supported.set(key, ok);
    if (!ok) {
      this.note = `connection timeouts not applied: ${why}; translated flows keep the kernel's timeouts`;
      this.log.warn(
        { backend: key, why },
        'connection timeouts configured, but this kernel or its tools cannot hold timeout policies (nfnetlink_cttimeout; nfct for iptables): translated flows keep the kernel timeouts',
      );
    }
    return ok;
  }

  /** Why nftables cannot hold the policies here; undefined when it can. */
  private async probeNft(): Promise<string | undefined> {
    if (!this.nft.listJson) return 'the nftables client cannot list ct timeout objects';
    try {
      await this.nft.run(NFT_PROBE);
      return undefined;
    } catch (e) {
      return `the kernel refused a ct timeout object (${e instanceof Error ? e.message.split('\n')[0] : String(e)})`;
    }
  }

  private async probeNfct(): Promise<string | undefined> {
    const r = await this.exec.run({ file: 'nfct', args: ['list', 'timeout'] });
    if (r.exitCode === 0) return undefined;
    return r.failedToStart ? 'nfct is not installed' : `nfct list timeout failed: ${r.stderr.trim().split('\n')[0] ?? ''}`;
  }

  // ---- nftables ----

  private async readNft(): Promise<NftCtHave | null> {
    const json = (await this.nft.listJson?.('inet', CT_TABLE)) ?? null;
    return json === null ? null : parseNftCt(json);
  }

  private async syncNft(want: NftCtTable, key: string, opts: { mode: SyncMode; dryRun?: boolean }): Promise<CtSyncResult> {
    const trusted = opts.mode === 'partial' && this.view?.key === key && 'nft' in this.view ? this.view.nft : undefined;
    const have = trusted ?? (await this.readNft());
    const script = planNftCt(want, have);
    if (script !== '' && !opts.dryRun) await this.nft.run(script);
    if (!opts.dryRun) this.view = { key, nft: heldNft(want) };
    return { changes: lineCount(script), script, notes: [] };
  }

  // ---- iptables ----

  private async readIpt(variant: IptablesVariant): Promise<IptView> {
    const policies = parseNfctList((await runChecked(this.exec, { file: 'nfct', args: ['list', 'timeout'] })).stdout);
    const read = async (f: 4 | 6): Promise<IptCtHave> => {
      if (!(await this.rawMayHold(variant, f))) return { policies: policies[f], lines: [], chains: false };
      const r = await this.exec.run({ file: toolsFor(variant, f).save, args: ['-t', 'raw'] });
      // Without ip6tables (or its raw table) nothing of natgw's can be there.
      if (r.exitCode !== 0) {
        if (f === 6) return { policies: policies[6], lines: [], chains: false };
        throw new ExecError(r, 'read the raw table');
      }
      return { policies: policies[f], ...parseIptCt(r.stdout) };
    };
    const [v4, v6] = await Promise.all([read(4), read(6)]);
    return { 4: v4, 6: v6 };
  }

  private async syncIpt(
    state: DesiredState,
    policy: CtTimeoutPolicy,
    variant: IptablesVariant,
    key: string,
    opts: { mode: SyncMode; dryRun?: boolean },
  ): Promise<CtSyncResult> {
    const trusted = opts.mode === 'partial' && this.view?.key === key && 'ipt' in this.view ? this.view.ipt : undefined;
    const have = trusted ?? (await this.readIpt(variant));
    // IPv6 only where something of IPv6 is translated.
    const want: Record<4 | 6, IptCtFamily | null> = {
      4: iptCtFamily(state, policy, 4),
      6: hasV6(state) ? iptCtFamily(state, policy, 6) : null,
    };
    const add: string[][] = [];
    const del: string[][] = [];
    const restores: Array<{ family: 4 | 6; script: string }> = [];
    for (const f of FAMILIES) {
      const w = want[f];
      for (const [name, args] of w?.policies ?? []) if (!have[f].policies.has(name)) add.push(['add', 'timeout', name, ...args]);
      for (const name of have[f].policies) if (!w?.policies.has(name)) del.push(['delete', 'timeout', name]);
      const script = planIptCt(w, have[f]);
      if (script !== null) restores.push({ family: f, script });
    }
    const text = [...add.map((a) => `nfct ${a.join(' ')}\n`), ...restores.map((r) => r.script), ...del.map((d) => `nfct ${d.join(' ')}\n`)].join('');
    if (!opts.dryRun) {
      for (const a of add) await runChecked(this.exec, { file: 'nfct', args: a }, 'connection timeouts');
      for (const r of restores) {
        await runChecked(this.exec, { file: toolsFor(variant, r.family).restore, args: ['--noflush'], input: r.script }, 'connection timeouts');
      }
      // A policy still named by a rule elsewhere stays (the kernel refuses); the next full sync tries again.
      for (const d of del) {
        const r = await this.exec.run({ file: 'nfct', args: d });
        if (r.exitCode !== 0) this.log.warn({ policy: d[2], stderr: r.stderr.trim() }, 'connection timeouts: a stale policy could not be deleted yet');
      }
      this.view = { key, ipt: { 4: heldIpt(want[4]), 6: heldIpt(want[6]) } };
    }
    return { changes: add.length + del.length + restores.reduce((n, r) => n + lineCount(r.script) - 2, 0), script: text, notes: [] };
  }

  /**
   * Whether the family's raw table may hold natgw's chains. Listing a legacy table that does not
   * exist yet creates it (with its hooks) in this namespace: the kernel's list of legacy tables
   * is asked first, where this executor can read it.
   */
  private async rawMayHold(variant: IptablesVariant, f: 4 | 6): Promise<boolean> {
    if (variant !== 'legacy' || !this.exec.readKernelFile) return true;
    const names = await this.exec.readKernelFile(f === 4 ? '/proc/net/ip_tables_names' : '/proc/net/ip6_tables_names');
    // No such file: no legacy table at all in this namespace.
    return names !== undefined && /^raw$/m.test(names);
  }

  // ---- leftovers ----

  /**
   * What another configuration left, removed once per process at its first full sync: without a
   * policy, natgw's timeout objects of every kind; with one, those of the backends not in use (a
   * backend switch), whose stale selectors would otherwise keep applying. Errors are only logged.
   */
  private async leftovers(target: CtTarget, configured: boolean, opts: { mode: SyncMode; dryRun?: boolean }): Promise<CtSyncResult> {
    const none = { changes: 0, script: '', notes: [] };
    if (this.cleaned || opts.mode !== 'full' || opts.dryRun) return none;
    this.cleaned = true;
    let changes = 0;
    let script = '';
    const step = async (what: string, run: () => Promise<{ changes: number; script: string }>): Promise<void> => {
      try {
        const r = await run();
        changes += r.changes;
        script += r.script;
      } catch (e) {
        this.log.warn({ err: e, what }, 'connection timeouts: leftovers of an earlier configuration not removed');
      }
    };
    if (!configured || target.kind !== 'nftables') await step('nftables', () => this.removeNft());
    for (const variant of ['legacy', 'nft'] as const) {
      if (configured && target.kind === 'iptables' && target.variant === variant) continue;
      await step(`iptables-${variant}`, () => this.removeIpt(variant));
    }
    // The policies only once no rule names them; the backend in use deletes its stale ones itself.
    if (!configured || target.kind === 'nftables') await step('nfct', () => this.removeNfct());
    if (changes > 0) this.log.info({ changes }, 'connection timeouts: what an earlier configuration left was removed');
    return { changes, script, notes: [] };
  }

  private async removeNft(): Promise<{ changes: number; script: string }> {
    const json = (await this.nft.listJson?.('inet', CT_TABLE)) ?? null;
    if (json === null) return { changes: 0, script: '' };
    const script = planNftCt(null, parseNftCt(json));
    await this.nft.run(script);
    return { changes: 1, script };
  }

  private async removeIpt(variant: IptablesVariant): Promise<{ changes: number; script: string }> {
    let changes = 0;
    let text = '';
    for (const f of FAMILIES) {
      if (!(await this.rawMayHold(variant, f))) continue;
      const r = await this.exec.run({ file: toolsFor(variant, f).save, args: ['-t', 'raw'] });
      if (r.exitCode !== 0) continue;
      const script = planIptCt(null, { policies: new Set(), ...parseIptCt(r.stdout) });
      if (script === null) continue;
      await runChecked(this.exec, { file: toolsFor(variant, f).restore, args: ['--noflush'], input: script }, 'connection timeouts');
      changes += lineCount(script) - 2;
      text += script;
    }
    return { changes, script: text };
  }

  private async removeNfct(): Promise<{ changes: number; script: string }> {
    const list = await this.exec.run({ file: 'nfct', args: ['list', 'timeout'] });
    if (list.exitCode !== 0) return { changes: 0, script: '' };
    const owned = parseNfctList(list.stdout);
    let changes = 0;
    let text = '';
    for (const name of [...owned[4], ...owned[6]]) {
      const r = await this.exec.run({ file: 'nfct', args: ['delete', 'timeout', name] });
      if (r.exitCode !== 0) continue;
      changes++;
      text += `nfct delete timeout ${name}\n`;
    }
    return { changes, script: text };
  }
}

const hasV6 = (s: DesiredState): boolean =>
  s.initialized &&
  [...s.snats.map((x) => x.cidr), ...s.dnats.map((d) => d.eip), ...s.fips.map((f) => f.eip), ...s.shareDnats.map((d) => d.eip)].some((a) => a.includes(':'));

/** What the kernel holds once `want` is applied, as a read-back would find it. */
function heldNft(want: NftCtTable): NftCtHave {
  return {
    objects: new Set(want.objects.keys()),
    sets: new Map(CT_SETS.map((s) => [s, new Set(want.sets[s])])),
    chains: new Map(Object.entries(want.chains).map(([name, rules]) => [name, rules.map((r) => r.id)])),
    declaredRight: true,
  };
}

/** The order of the selector lines may differ from the kernel's after an edit: planIptCt compares them as a multiset. */
function heldIpt(want: IptCtFamily | null): IptCtHave {
  if (want === null) return { policies: new Set(), lines: [], chains: false };
  return { policies: new Set(want.policies.keys()), lines: want.lines.map(compareLine), chains: true };
}
