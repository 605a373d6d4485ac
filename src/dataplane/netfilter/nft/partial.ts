/**
 * PURE partial sync of natgw's nftables tables (kube-proxy's model): the change between the
 * NatTables natgw applied last and the new one, as one script, without reading the kernel.
 *
 * Map and set elements change one by one, so a DNAT or a floating IP costs one element
 * whatever the number of others. The SNAT chain is ordered and nft deletes a rule only by its
 * handle, which nft reports only by reading back (`--echo` fetches the whole ruleset, as slow
 * as a listing at ten thousand elements): so a change of SNAT rules flushes `shared_snat` and
 * writes its rules again, in the same transaction (atomic: no packet sees it empty). SNAT rules
 * are few (one per subnet and EIP).
 *
 * Anything structural — an interface renamed, a family's table appearing or going — returns
 * null: the caller then runs a full sync, which reads back and repairs.
 */
import { compareIp, type NatTables } from '../backend.js';
import { snatKey, type Dnat, type Fip, type Snat } from '../../../model/rules.js';
import { CHAIN, NATGW_TABLE, NftRenderError, SET, ruleText, needsFamily, famOf, type NftFamily, type NftPlan } from './render.js';

/** What a partial sync trusts: the tables natgw applied last, and which families have a table. */
export interface NftView {
  readonly tables: NatTables;
  readonly families: ReadonlySet<NftFamily>;
}

const FAMILIES: readonly NftFamily[] = ['ip', 'ip6'];

/** Objects of `after` not in `before`, and of `before` not in `after` (by reference; O(n)). */
function changed<T>(before: readonly T[], after: readonly T[]): { added: T[]; removed: T[] } {
  if (before === after) return { added: [], removed: [] };
  const b = new Set(before);
  const a = new Set(after);
  return { added: after.filter((x) => !b.has(x)), removed: before.filter((x) => !a.has(x)) };
}

class Lines {
  readonly deletes: string[] = [];
  readonly adds: string[] = [];
  changes = 0;

  elements(verb: 'add' | 'delete', fam: NftFamily, set: string, items: readonly string[]): void {
    if (items.length === 0) return;
    (verb === 'add' ? this.adds : this.deletes).push(`${verb} element ${fam} ${NATGW_TABLE} ${set} { ${items.join(', ')} }`);
    this.changes += items.length;
  }
}

const dnatElementKey = (d: Dnat): string => `${d.eip} . ${d.protocol} . ${d.port}`;

function checkFamily(what: string, a: string, b: string): void {
  if (famOf(a) !== famOf(b)) throw new NftRenderError(`${what}: ${a} and ${b} are not of the same IP family`);
}

/** The EIP that SNATs an internal IP bound by several floating IPs: the lowest (render.ts). */
function firstEips(fips: readonly Fip[], internal: ReadonlySet<string>): Map<string, string> {
  const first = new Map<string, string>();
  for (const f of fips) {
    if (!internal.has(f.internalIp)) continue;
    const cur = first.get(f.internalIp);
    if (cur === undefined || compareIp(f.eip, cur) < 0) first.set(f.internalIp, f.eip);
  }
  return first;
}

function snatRules(snats: readonly Snat[], fam: NftFamily): string[] {
  const seen = new Set<string>();
  const out: string[] = [];
  for (const s of snats) {
    if (famOf(s.eip) !== fam || seen.has(snatKey(s))) continue;
    seen.add(snatKey(s));
    checkFamily(`snat ${s.eip}`, s.eip, s.cidr.split('/')[0] ?? '');
    out.push(ruleText({ kind: 'snat', cidr: s.cidr, eip: s.eip, randomFully: s.randomFully }, fam));
  }
  return out;
}

/** The partial script taking the kernel from `view` to `next`; null when only a full sync can. */
export function renderPartial(view: NftView, next: NatTables): NftPlan | null {
  const prev = view.tables;
  if (prev.vpcIf !== next.vpcIf || prev.extIf !== next.extIf) return null;
  for (const fam of FAMILIES) if (needsFamily(next, fam) !== view.families.has(fam)) return null;

  const out = new Lines();
  const byFam = <T>(items: readonly T[], ip: (t: T) => string, fam: NftFamily): T[] => items.filter((t) => famOf(ip(t)) === fam);

  const dn = changed(prev.dnats, next.dnats);
  dn.added.forEach((d) => checkFamily(`dnat ${d.eip}:${d.port}/${d.protocol}`, d.eip, d.internalIp));
  const fp = changed(prev.fips, next.fips);
  fp.added.forEach((f) => checkFamily(`floating ip ${f.eip}`, f.eip, f.internalIp));
  const ep = changed(prev.eips, next.eips);
  // A FIP whose internal IP changes hands may change which EIP SNATs it.
  const touched = new Set([...fp.added, ...fp.removed].map((f) => f.internalIp));
  const firstBefore = firstEips(prev.fips, touched);
  const firstAfter = firstEips(next.fips, touched);

  for (const fam of FAMILIES) {
    if (!view.families.has(fam)) continue;
    // An identity removed and added again (a changed target) is deleted, then added: one transaction.
    out.elements('delete', fam, SET.portDnat, byFam(dn.removed, (d) => d.eip, fam).map(dnatElementKey));
    out.elements('add', fam, SET.portDnat, byFam(dn.added, (d) => d.eip, fam).map((d) => `${dnatElementKey(d)} : ${d.internalIp} . ${d.internalPort}`));
    out.elements('delete', fam, SET.fipDnat, byFam(fp.removed, (f) => f.eip, fam).map((f) => f.eip));
    out.elements('add', fam, SET.fipDnat, byFam(fp.added, (f) => f.eip, fam).map((f) => `${f.eip} : ${f.internalIp}`));
    const snatDel: string[] = [];
    const snatAdd: string[] = [];
    for (const ip of touched) {
      if (famOf(ip) !== fam) continue;
      const was = firstBefore.get(ip);
      const now = firstAfter.get(ip);
      if (was === now) continue;
      if (was !== undefined) snatDel.push(ip);
      if (now !== undefined) snatAdd.push(`${ip} : ${now}`);
    }
    out.elements('delete', fam, SET.fipSnat, snatDel);
    out.elements('add', fam, SET.fipSnat, snatAdd);
    out.elements('delete', fam, SET.hairpinEips, [...new Set(byFam(ep.removed, (e) => e, fam))]);
    out.elements('add', fam, SET.hairpinEips, [...new Set(byFam(ep.added, (e) => e, fam))]);

    if (prev.snats !== next.snats) {
      const before = snatRules(prev.snats, fam);
      const after = snatRules(next.snats, fam);
      if (before.length !== after.length || before.some((r, i) => r !== after[i])) {
        const t = `${fam} ${NATGW_TABLE}`;
        out.adds.push(`flush chain ${t} ${CHAIN.sharedSnat}`, ...after.map((r) => `add rule ${t} ${CHAIN.sharedSnat} ${r}`));
        out.changes += before.length + after.length;
      }
    }
  }
  const all = [...out.deletes, ...out.adds];
  return { script: all.length === 0 ? '' : `${all.join('\n')}\n`, changes: out.changes };
}
