import type { NatTables } from '../backend.js';
import type { Dnat, Fip, Snat } from '../../../model/rules.js';
import { CHAINS } from './ruleText.js';
import { parseCidr, formatCidr, isIp, familyOf } from '../../../model/net.js';
import type { SavedTable } from './save.js';

/**
 * Read natgw's chains back into NatTables: adoption when the state file is gone (a container
 * restart) or when upgrading from the script, which wrote the same chains. Rules that do not
 * have natgw's shape are left out (and so will be removed by the next sync of that chain).
 */
const MARK = /^-i (\S+) -j MARK --set-xmark 0x1\/0x1$/;
const SNAT = /^(?:-s (\S+) )?-o (\S+)(?: -m statistic --mode nth --every (\d+) --packet 0)? -j SNAT --to-source (\S+?)( --random-fully)?$/;
const FIP_DNAT = /^-d (\S+)\/(?:32|128) -j DNAT --to-destination (\S+)$/;
const FIP_SNAT = /^-s (\S+)\/(?:32|128) -j SNAT --to-source (\S+)$/;
/** A port range maps each port onto itself (ruleText.ts dnatSpec): `--dport a:b` to `ip:a-b`. */
const DNAT = /^-d (\S+)\/(?:32|128) -p (tcp|udp) -m (?:tcp|udp) --dport (\d+)(?::(\d+))? -j DNAT --to-destination \[?([\d.]+|[0-9a-f:]+)\]?:(\d+)(?:-(\d+))?$/;
const HAIRPIN = /^-o (\S+) -m mark --mark 0x1\/0x1 -m conntrack --ctstate DNAT --ctorigdst (\S+) -j SNAT --to-source \S+ --random-fully$/;

export function adoptFromSave(nat: SavedTable, mangle: SavedTable): NatTables | null {
  if (!nat.chains.has(CHAINS.snatFilter) && !nat.chains.has(CHAINS.dnatFilter) && !mangle.chains.has(CHAINS.vpcMark)) return null;
  const rules = (t: SavedTable, c: string) => t.rules.get(c) ?? [];
  let vpcIf: string | undefined;
  let extIf: string | undefined;
  for (const r of rules(mangle, CHAINS.vpcMark)) vpcIf ??= MARK.exec(r)?.[1];

  const snats: Snat[] = [];
  // A pool is a run of lines for one CIDR: `--every N`, `--every N-1`, …, `--every 2`, then
  // one without statistic (snatSpecs); the run's EIPs in order are the pool.
  let run: { cidr: string; eips: string[]; left: number; randomFully: boolean } | undefined;
  for (const r of rules(nat, CHAINS.sharedSnat)) {
    const m = SNAT.exec(r);
    if (!m || !isIp(m[4] ?? '')) continue;
    // A rule mixing families is not natgw's.
    // No `-s`: every source (iptables-save drops `-s 0.0.0.0/0`).
    const c = parseCidr(m[1] ?? (familyOf(m[4] ?? '') === 6 ? '::/0' : '0.0.0.0/0'), { clearHostBits: true, family: familyOf(m[4] ?? '') });
    if (!c) continue;
    extIf ??= m[2];
    const cidr = formatCidr(c);
    const eip = m[4] ?? '';
    const randomFully = m[5] !== undefined;
    const every = m[3] === undefined ? undefined : Number(m[3]);
    if (run && run.cidr === cidr && run.randomFully === randomFully && (every === undefined ? run.left === 1 : every === run.left)) {
      run.eips.push(eip);
      run.left--;
      if (every === undefined) {
        snats.push({ eip: run.eips[0] ?? eip, cidr, randomFully, eips: run.eips });
        run = undefined;
      }
      continue;
    }
    run = undefined;
    if (every !== undefined) {
      if (every >= 2) run = { cidr, eips: [eip], left: every - 1, randomFully };
      continue;
    }
    snats.push({ eip, cidr, randomFully });
  }

  const fips: Fip[] = [];
  const seen = new Set<string>();
  for (const r of rules(nat, CHAINS.exclusiveDnat)) {
    const m = FIP_DNAT.exec(r);
    if (!m || seen.has(m[1] ?? '')) continue;
    seen.add(m[1] ?? '');
    fips.push({ eip: m[1] ?? '', internalIp: m[2] ?? '' });
  }
  // A half pair (only the SNAT side survived) still names a floating IP.
  for (const r of rules(nat, CHAINS.exclusiveSnat)) {
    const m = FIP_SNAT.exec(r);
    if (!m || seen.has(m[2] ?? '')) continue;
    seen.add(m[2] ?? '');
    fips.push({ eip: m[2] ?? '', internalIp: m[1] ?? '' });
  }

  const dnats: Dnat[] = [];
  for (const r of rules(nat, CHAINS.sharedDnat)) {
    const m = DNAT.exec(r);
    if (!m || m[4] !== m[7]) continue;
    const d: Dnat = { eip: m[1] ?? '', protocol: m[2] as 'tcp' | 'udp', port: Number(m[3]), internalIp: m[5] ?? '', internalPort: Number(m[6]) };
    if (m[4] === undefined) dnats.push(d);
    else if (d.internalPort === d.port && d.port < Number(m[4])) dnats.push({ ...d, portEnd: Number(m[4]) });
  }

  const eips: string[] = [];
  for (const r of rules(nat, CHAINS.hairpinSnat)) {
    const m = HAIRPIN.exec(r);
    if (!m) continue;
    vpcIf ??= m[1];
    eips.push(m[2] ?? '');
  }
  return { vpcIf: vpcIf ?? '', extIf: extIf ?? '', eips, snats, dnats, fips };
}
