import type { Executor } from '../system/exec.js';
import { familyOf } from '../model/net.js';
import { snatEips, type Snat } from '../model/rules.js';
import { parseConntrackLines, type ConntrackEntry } from '../model/conntrackLine.js';
import { inCidr } from './conntrackStale.js';

/**
 * Draining an EIP out of a SNAT pool: the rule leaves it out of the pool (activeSnat), and
 * conntrack keeps translating the connections it already gave that address. What remains of
 * them is counted here, from the kernel's table, for the status.
 */
export interface DrainingStatus {
  /** The SNAT's identity (its first EIP and its CIDR). */
  readonly snat: { readonly eip: string; readonly cidr: string };
  /** The draining EIP. */
  readonly eip: string;
  /** Connections from the CIDR still translated to the EIP; null when conntrack could not be read. */
  readonly connections: number | null;
}

/** PURE: every (SNAT, draining EIP) pair of the state, in state order. */
export function drainingPairs(snats: readonly Snat[]): Array<{ snat: Snat; eip: string }> {
  return snats.flatMap((s) => (s.draining ?? []).filter((e) => snatEips(s).includes(e)).map((eip) => ({ snat: s, eip })));
}

/**
 * PURE: the entries a SNAT from `cidr` translated to `eip`: the reply goes to the EIP, the
 * original source is in the CIDR, and the destination was not rewritten (a hairpin's DNAT
 * connection also replies to an EIP, but belongs to the DNAT, not to the pool).
 */
export function countSnatTo(entries: readonly ConntrackEntry[], eip: string, cidr: string): number {
  let n = 0;
  for (const e of entries) if (e.reply.dst === eip && e.reply.src === e.original.dst && e.original.src !== eip && inCidr(e.original.src, cidr)) n++;
  return n;
}

/** PURE: `conntrack -L` arguments listing the connections source-NATed to `eip`. */
export const srcNatListArgs = (eip: string): string[] => ['-L', '-f', familyOf(eip) === 6 ? 'ipv6' : 'ipv4', '--src-nat', eip];

/** One listing per draining EIP (conntrack filters in the kernel), counted per SNAT. */
export async function countDraining(exec: Executor, snats: readonly Snat[]): Promise<DrainingStatus[]> {
  const pairs = drainingPairs(snats);
  const listings = new Map<string, Promise<ConntrackEntry[] | null>>();
  for (const { eip } of pairs) {
    if (listings.has(eip)) continue;
    listings.set(
      eip,
      exec.run({ file: 'conntrack', args: srcNatListArgs(eip) }).then((r) => (r.exitCode === 0 ? parseConntrackLines(r.stdout) : null)),
    );
  }
  return Promise.all(
    pairs.map(async ({ snat, eip }) => {
      const entries = await listings.get(eip);
      return { snat: { eip: snat.eip, cidr: snat.cidr }, eip, connections: entries ? countSnatTo(entries, eip, snat.cidr) : null };
    }),
  );
}
