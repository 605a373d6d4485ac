/**
 * An independent reading of what the kernel holds: natgw's DNATs, FIPs, SNATs and routes as
 * plain facts ("dnat 172.20.0.10,8080,tcp -> 10.0.1.6:80"), parsed by the test from the tools'
 * own text (`iptables-save`, `nft list table`, `ip route`), never through natgw's read-back.
 * A test that compares these facts with its model therefore fails when natgw's read-back and
 * the kernel disagree, which a check through natgw's own eyes (a dry-run plan) cannot.
 */
import type { Topology } from './netns.js';

export type NetfilterKind = 'iptables-legacy' | 'iptables-nft' | 'nftables';

/** Facts from `iptables-save -t nat` (the script's chains, as SPEC section 2 writes them). */
export function factsFromIptablesSave(text: string): string[] {
  const facts: string[] = [];
  for (const line of text.split('\n')) {
    let m = /^-A SHARED_DNAT -d (\S+)\/32 -p (\w+) -m \w+ --dport (\d+) -j DNAT --to-destination (\S+)$/.exec(line);
    if (m) {
      facts.push(`dnat ${m[1]},${m[3]},${m[2]} -> ${m[4]}`);
      continue;
    }
    m = /^-A EXCLUSIVE_DNAT -d (\S+)\/32 -j DNAT --to-destination (\S+)$/.exec(line);
    if (m) {
      facts.push(`fip ${m[1]} -> ${m[2]}`);
      continue;
    }
    m = /^-A EXCLUSIVE_SNAT -s (\S+)\/32 -j SNAT --to-source (\S+)$/.exec(line);
    if (m) {
      facts.push(`fip-snat ${m[1]} -> ${m[2]}`);
      continue;
    }
    // iptables-save leaves out `-s 0.0.0.0/0`.
    m = /^-A SHARED_SNAT (?:-s (\S+) )?-o \S+ -j SNAT --to-source (\S+?)( --random-fully)?$/.exec(line);
    if (m) {
      const cidr = m[1] === undefined ? '0.0.0.0/0' : m[1].includes('/') ? m[1] : `${m[1]}/32`;
      facts.push(`snat ${m[2]},${cidr}${m[3] ? ' random-fully' : ''}`);
      continue;
    }
    if (/^-A (SHARED_DNAT|EXCLUSIVE_DNAT|EXCLUSIVE_SNAT|SHARED_SNAT) /.test(line)) facts.push(`unrecognised ${line}`);
  }
  return facts.sort();
}

/** The elements of one named map/set in `nft list table` text (they may wrap over lines). */
function nftElements(text: string, name: string): string[] {
  const block = new RegExp(`(?:map|set) ${name} \\{([^]*?)\\n\\t\\}`).exec(text)?.[1];
  const els = block === undefined ? undefined : /elements = \{([^}]*)\}/.exec(block)?.[1];
  if (els === undefined) return [];
  return els
    .split(',')
    .map((e) => e.replace(/\s+/g, ' ').trim())
    .filter(Boolean);
}

/** Facts from `nft list table ip natgw` (the maps and the shared_snat chain). */
export function factsFromNftText(text: string): string[] {
  const facts: string[] = [];
  for (const e of nftElements(text, 'port_dnat')) {
    const m = /^(\S+) \. (\w+) \. (\d+) : (\S+) \. (\d+)$/.exec(e);
    facts.push(m ? `dnat ${m[1]},${m[3]},${m[2]} -> ${m[4]}:${m[5]}` : `unrecognised port_dnat ${e}`);
  }
  for (const e of nftElements(text, 'fip_dnat')) {
    const m = /^(\S+) : (\S+)$/.exec(e);
    facts.push(m ? `fip ${m[1]} -> ${m[2]}` : `unrecognised fip_dnat ${e}`);
  }
  for (const e of nftElements(text, 'fip_snat')) {
    const m = /^(\S+) : (\S+)$/.exec(e);
    facts.push(m ? `fip-snat ${m[1]} -> ${m[2]}` : `unrecognised fip_snat ${e}`);
  }
  // A SNAT CIDR of one EIP is an element of its length's data map; any other has its own chain
  // (snatLayout.ts); shared_snat itself holds only the dispatch rules.
  for (const [, fr, len] of text.matchAll(/map snat_to_(fr_)?len_(\d+) \{/g)) {
    for (const e of nftElements(text, `snat_to_${fr ?? ''}len_${len}`)) {
      const m = /^(\S+) : (\S+)$/.exec(e);
      facts.push(m ? `snat ${m[2]},${m[1]}/${len}${fr ? ' random-fully' : ''}` : `unrecognised snat_to_${fr ?? ''}len_${len} ${e}`);
    }
  }
  const chains = [...text.matchAll(/chain (shared_snat|snat_[0-9a-f_]+) \{([\s\S]*?)\n\t\}/g)].map((m) => m[2] ?? '');
  for (const raw of chains.join('\n').split('\n')) {
    const line = raw.trim();
    if (line === '' || /^ip saddr (& \S+ )?vmap @snat_len_\d+$/.test(line)) continue;
    if (/^snat to ip saddr (& \S+ )?map @snat_to_(fr_)?len_\d+( fully-random)?$/.test(line)) continue;
    const m = /^ip saddr (\S+) snat to (\S+?)( fully-random)?$/.exec(line);
    if (!m) {
      facts.push(`unrecognised shared_snat ${line}`);
      continue;
    }
    const cidr = m[1]!.includes('/') ? m[1]! : `${m[1]}/32`;
    facts.push(`snat ${m[2]},${cidr}${m[3] ? ' random-fully' : ''}`);
  }
  return facts.sort();
}

/** Routes natgw programs: `ip route show dev <vpc>` lines with a gateway. */
export function factsFromRoutes(text: string): string[] {
  const facts: string[] = [];
  for (const line of text.split('\n')) {
    const m = /^(\S+) via (\S+) /.exec(`${line.trim()} `);
    if (m && m[1] !== 'default') facts.push(`route ${m[1]!.includes('/') ? m[1] : `${m[1]}/32`} via ${m[2]}`);
  }
  return facts.sort();
}

/**
 * FIPs appear as two halves; one fact per FIP when both agree, the odd half otherwise, so a
 * half-applied FIP shows up as a difference.
 */
function foldFips(facts: readonly string[]): string[] {
  const snat = new Map<string, string>();
  for (const f of facts) {
    const m = /^fip-snat (\S+) -> (\S+)$/.exec(f);
    if (m) snat.set(`${m[2]}`, m[1]!);
  }
  const out: string[] = [];
  const used = new Set<string>();
  for (const f of facts) {
    if (f.startsWith('fip-snat ')) continue;
    const m = /^fip (\S+) -> (\S+)$/.exec(f);
    if (m) {
      // In nftables fip_snat keeps only the first EIP of an internal IP; iptables keeps every pair.
      const internalHasSnat = [...snat.values()].includes(m[2]!) || snat.get(m[1]!) === m[2];
      out.push(internalHasSnat ? f : `${f} (no SNAT half)`);
      used.add(m[1]!);
      continue;
    }
    out.push(f);
  }
  for (const [eip, internal] of snat) if (!used.has(eip)) out.push(`fip-snat ${internal} -> ${eip} (no DNAT half)`);
  return out.sort();
}

/** The kernel's facts about natgw's NAT objects and VPC routes, read with the tools themselves. */
export async function kernelFacts(topo: Topology, kind: NetfilterKind, vpcIf = 'eth0'): Promise<string[]> {
  let nat: string[];
  if (kind === 'nftables') {
    const r = await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'natgw'], { reject: false });
    nat = r.exitCode === 0 ? factsFromNftText(r.stdout) : [];
  } else {
    const variant = kind === 'iptables-legacy' ? 'legacy' : 'nft';
    nat = factsFromIptablesSave(await topo.iptablesSave('nat', variant));
  }
  const routes = await topo.exec('gw', ['ip', '-4', 'route', 'show', 'dev', vpcIf]);
  return [...foldFips(nat), ...factsFromRoutes(routes.stdout)].sort();
}
