import { promises as fs } from 'node:fs';
import type { Logger } from 'pino';
import { runChecked, type Executor } from '../system/exec.js';
import type { DesiredState } from '../state/state.js';
import type { SyncMode } from './netfilter/backend.js';
import type { NftClient } from './netfilter/nft/client.js';
import type { CtTarget } from './ctTimeouts.js';
import { toolsFor } from './netfilter/iptables/tools.js';
import {
  IPT_UPLINK_CHAIN,
  IPT_UPLINK_JUMP,
  iptMarksLines,
  iptMarksScript,
  NFT_UPLINK_TABLE,
  nftMarksScript,
  ownedRoutes,
  ownedRules,
  planUplinks,
  routeText,
  ruleText,
  UPLINK_TABLES,
} from './linkUplinksPlan.js';

export interface UplinkSyncResult {
  readonly changes: number;
  readonly script: string;
  readonly notes: readonly string[];
}

interface Have {
  readonly rules: readonly string[];
  /** As routeText spells them. */
  readonly routes: readonly string[];
  /** What natgw's connection-mark rules read as (compared with what they read as after natgw wrote them). */
  readonly marks: string;
  readonly iptJump: boolean;
  readonly iptChain: boolean;
}

/**
 * The thin layer of the secondary uplinks' policy routing (linkUplinksPlan.ts is the pure one):
 * read what natgw holds (its rule priorities, its tables, its connection-mark rules), apply
 * the difference, adding before removing. A partial sync plans against what the last apply
 * left; a full one reads back. A gateway with one external interface never runs a tool here: a
 * marker file in the state dir says whether anything may be left to remove.
 *
 * A route through an uplink that is down or gone cannot be installed: that is a note, not a
 * failure (the table's unreachable default holds its traffic; the link event's resync adds
 * the route when the uplink is back), so losing one uplink never fails a change for the others.
 */
export class UplinkRoutes {
  /** The connection-mark rules as read back right after natgw wrote them, per target. */
  private written: { readonly key: string; readonly marks: string } | undefined;
  /** What the last apply left in place (a partial sync's view). */
  private trusted: (Have & { readonly key: string }) | undefined;

  constructor(
    private readonly exec: Executor,
    private readonly nft: NftClient,
    private readonly log: Logger,
    /** Present while natgw may hold something here. */
    private readonly markerFile: string,
  ) {}

  async sync(want: DesiredState, target: CtTarget, opts: { mode: SyncMode; dryRun?: boolean }): Promise<UplinkSyncResult> {
    const plan = planUplinks(want);
    const empty = plan.rules.length === 0 && plan.routes.length === 0 && plan.marks.length === 0;
    const kept = opts.mode === 'partial' && this.trusted?.key === keyOf(target) ? this.trusted : undefined;
    if (empty && !kept && !(await this.markerPresent())) return { changes: 0, script: '', notes: [] };
    const have = kept ?? (await this.read(target));
    const rulesWanted = plan.rules.map(ruleText);
    const routesWanted = plan.routes.map(routeText);
    const marksText = target.kind === 'nftables' ? nftMarksScript(plan) : iptMarksScript(plan, have.iptJump, have.iptChain);
    const marksKey = `${keyOf(target)}\n${target.kind === 'nftables' ? marksText : iptMarksLines(plan).join('\n')}`;
    const marksHeld = this.written?.key === marksKey && (kept !== undefined || this.written.marks === have.marks);
    const ruleAdds = rulesWanted.filter((r) => !have.rules.includes(r));
    const ruleDels = have.rules.filter((r) => !rulesWanted.includes(r));
    const routeAdds = routesWanted.filter((r) => !have.routes.includes(r));
    const routeDels = have.routes.filter((r) => !routesWanted.includes(r));
    const lines = [
      ...(marksHeld ? [] : [marksText.trimEnd()]),
      ...ruleAdds.map((r) => `rule add ${r}`),
      ...routeAdds.map((r) => `route replace ${r}`),
      ...ruleDels.map((r) => `rule del ${r}`),
      ...routeDels.map((r) => `route del ${r}`),
    ];
    const script = lines.length ? `${lines.join('\n')}\n` : '';
    if (opts.dryRun) return { changes: lines.length, script, notes: [] };
    if (lines.length === 0) {
      if (empty) await this.setMarker(false);
      this.trusted = { key: keyOf(target), ...have };
      return { changes: 0, script, notes: [] };
    }
    this.trusted = undefined;
    await this.setMarker(true);
    const notes: string[] = [];
    let routesIn = true;
    // Marks first (removed last when none are wanted): a rule never selects on a mark not yet set.
    if (!marksHeld && plan.marks.length > 0) await this.applyMarks(target, marksText);
    if (ruleAdds.length)
      await runChecked(this.exec, { file: 'ip', args: ['-batch', '-'], input: ruleAdds.map((r) => `rule add ${r}\n`).join('') }, 'uplink rules');
    if (routeAdds.length) {
      const r = await this.exec.run({ file: 'ip', args: ['-force', '-batch', '-'], input: routeAdds.map((x) => `route replace ${x}\n`).join('') });
      if (r.exitCode !== 0) {
        routesIn = false;
        const why = r.stderr.trim().split('\n')[0] ?? '';
        notes.push(`INFO: an uplink route is not in place yet (${why}); the uplink's resync adds it`);
        this.log.warn({ stderr: r.stderr.trim(), routes: routeAdds }, 'uplink route not installed (uplink down or gone?); retried at the next resync');
      }
    }
    if (ruleDels.length) await this.exec.run({ file: 'ip', args: ['-force', '-batch', '-'], input: ruleDels.map((r) => `rule del ${r}\n`).join('') });
    if (routeDels.length) await this.exec.run({ file: 'ip', args: ['-force', '-batch', '-'], input: routeDels.map((r) => `route del ${r}\n`).join('') });
    if (!marksHeld && plan.marks.length === 0) await this.applyMarks(target, marksText);
    const marks = marksHeld && this.written ? this.written.marks : (await this.read(target, true)).marks;
    this.written = { key: marksKey, marks };
    // What is in place now, unless a route could not go in (the next sync reads it back).
    const ipt = plan.marks.length > 0;
    if (routesIn) this.trusted = { key: keyOf(target), rules: rulesWanted, routes: routesWanted, marks, iptJump: ipt, iptChain: ipt };
    if (empty) await this.setMarker(false);
    this.log.info({ added: ruleAdds.length + routeAdds.length, removed: ruleDels.length + routeDels.length, marks: !marksHeld }, 'uplink routing applied');
    return { changes: lines.length, script, notes };
  }

  /** What natgw holds; `marksOnly` reads just the connection-mark rules. */
  private async read(target: CtTarget, marksOnly = false): Promise<Have> {
    const marks = this.readMarks(target);
    if (marksOnly) return { rules: [], routes: [], ...(await marks) };
    const [rules, routes, m] = await Promise.all([
      runChecked(this.exec, { file: 'ip', args: ['-j', 'rule', 'show'] }, 'uplink rules'),
      this.exec.run({ file: 'ip', args: ['-j', '-force', '-batch', '-'], input: UPLINK_TABLES.map((t) => `route show table ${t}\n`).join('') }),
      marks,
    ]);
    const lines = routes.stdout.split('\n').filter((l) => l.startsWith('['));
    return { rules: ownedRules(rules.stdout), routes: lines.length === UPLINK_TABLES.length ? ownedRoutes(lines).map(routeText) : [], ...m };
  }

  private async readMarks(target: CtTarget): Promise<Pick<Have, 'marks' | 'iptJump' | 'iptChain'>> {
    if (target.kind === 'nftables') {
      const json = (await this.nft.listJson?.('ip', NFT_UPLINK_TABLE)) ?? null;
      // Handles and the table's own metadata aside, the listing changes only when a rule does.
      return { marks: json === null ? '' : json.replace(/"handle":\s*\d+,?/g, ''), iptJump: false, iptChain: false };
    }
    const r = await this.exec.run({ file: toolsFor(target.variant, 4).save, args: ['-t', 'mangle'] });
    const mine = r.stdout.split('\n').filter((l) => l.includes(IPT_UPLINK_CHAIN));
    return {
      marks: mine.join('\n'),
      iptJump: mine.includes(IPT_UPLINK_JUMP),
      iptChain: mine.some((l) => l.startsWith(`:${IPT_UPLINK_CHAIN} `)),
    };
  }

  private async applyMarks(target: CtTarget, text: string): Promise<void> {
    if (target.kind === 'nftables') {
      await this.nft.run(text);
      return;
    }
    await runChecked(this.exec, { file: toolsFor(target.variant, 4).restore, args: ['--noflush'], input: text }, 'the uplink connection marks');
  }

  private async markerPresent(): Promise<boolean> {
    return fs.stat(this.markerFile).then(
      () => true,
      () => false,
    );
  }

  private async setMarker(on: boolean): Promise<void> {
    if (on) {
      if (!(await this.markerPresent())) await fs.writeFile(this.markerFile, 'natgw holds policy routing for secondary uplinks\n');
    } else await fs.rm(this.markerFile, { force: true });
  }
}

const keyOf = (t: CtTarget): string => (t.kind === 'nftables' ? 'nftables' : `iptables-${t.variant}`);
