import { activeSnat, type Dnat, type Fip, type Snat } from '../../../model/rules.js';
import { familyOfValid } from '../../../model/net.js';
import type { RuleConflict } from '../../../model/errors.js';

/**
 * The iptables save form of each rule (SPEC §2). The iptables backend renders exactly these
 * lines and reads them back; conflict messages quote them, in either backend, so the
 * controller's log shows the same text whatever backend runs (quoteHeld).
 */

export const CHAINS = {
  dnatFilter: 'DNAT_FILTER',
  snatFilter: 'SNAT_FILTER',
  exclusiveDnat: 'EXCLUSIVE_DNAT',
  exclusiveSnat: 'EXCLUSIVE_SNAT',
  sharedDnat: 'SHARED_DNAT',
  sharedSnat: 'SHARED_SNAT',
  hairpinSnat: 'HAIRPIN_SNAT',
  vpcMark: 'VPC_MARK',
} as const;

// Rule texts are built from validated addresses: no address pattern per rule (ten thousand of them at a full sync).
const hostLen = (ip: string): number => (familyOfValid(ip) === 6 ? 128 : 32);
const withPort = (ip: string, port: number): string => (familyOfValid(ip) === 6 ? `[${ip}]:${port}` : [ip, port].join(':'));

// The per-object texts below are joined from their pieces, not written as template literals: a
// template is a chain of rope nodes (one per piece) that lives as long as the text, and ten
// thousand of them, kept for the next command, cost the young generation several times the
// flat texts a join makes at once.
export function fipDnatSpec(f: Fip): string {
  return ['-d ', f.eip, hostLen(f.eip) === 32 ? '/32' : '/128', ' -j DNAT --to-destination ', f.internalIp].join('');
}

export function fipSnatSpec(f: Fip): string {
  return ['-s ', f.internalIp, hostLen(f.internalIp) === 32 ? '/32' : '/128', ' -j SNAT --to-source ', f.eip].join('');
}

export function dnatSpec(d: Dnat): string {
  const head = ['-d ', d.eip, hostLen(d.eip) === 32 ? '/32' : '/128', ' -p ', d.protocol, ' -m ', d.protocol, ' --dport ', d.port];
  if (d.portEnd !== undefined) {
    // A range maps each port onto itself (internalPort is the range's first port).
    head.push(':', d.portEnd, ' -j DNAT --to-destination ', withPort(d.internalIp, d.port), '-', d.portEnd);
  } else {
    head.push(' -j DNAT --to-destination ', withPort(d.internalIp, d.internalPort));
  }
  return head.join('');
}

export function snatSpec(s: Snat, extIf: string): string {
  // iptables drops a match of every source (`-s 0.0.0.0/0`, `-s ::/0`) from what it saves: the
  // rule is rendered as it reads back, or every resync would replace it.
  const src = /\/0$/.test(s.cidr) ? '' : `-s ${s.cidr} `;
  return `${src}-o ${extIf} -j SNAT --to-source ${s.eip}${s.randomFully ? ' --random-fully' : ''}`;
}

/**
 * A SNAT's lines: one for a single EIP; for a pool of N, one per EIP, each but the last taking
 * every (N-k)-th new connection that reaches it (`statistic --mode nth`; a NAT chain sees only a
 * connection's first packet), so connections take the EIPs in turn. `--to-source a-b` would not
 * do: the kernel picks an address of a range by a hash of the source and destination addresses,
 * so one VPC host talking to one server would never leave the first EIP.
 */
export function snatSpecs(given: Snat, primary: string, eipIf?: ReadonlyMap<string, string>): string[] {
  const s = activeSnat(given);
  const pool = s.eips;
  // Each EIP's rule matches the interface it lives on (several external interfaces).
  const extIf = (eip: string): string => eipIf?.get(eip) ?? primary;
  if (!pool) return [snatSpec(s, extIf(s.eip))];
  const opt = s.randomFully ? ' --random-fully' : '';
  return pool.map((eip, k) => {
    const nth = k < pool.length - 1 ? ` -m statistic --mode nth --every ${pool.length - k} --packet 0` : '';
    return `-s ${s.cidr} -o ${extIf(eip)}${nth} -j SNAT --to-source ${eip}${opt}`;
  });
}

export function hairpinSpec(eip: string, vpcIf: string): string {
  return `-o ${vpcIf} -m mark --mark 0x1/0x1 -m conntrack --ctstate DNAT --ctorigdst ${eip} -j SNAT --to-source ${eip} --random-fully`;
}

export function vpcMarkSpec(vpcIf: string): string {
  return `-i ${vpcIf} -j MARK --set-xmark 0x1/0x1`;
}

/** The rule that holds a conflict's identity, as the script's message quotes it (`-A EXCLUSIVE_DNAT …`, `-A SHARED_DNAT …`). */
export function quoteHeld(c: RuleConflict): string {
  return c.kind === 'fip' ? `-A ${CHAINS.exclusiveDnat} ${fipDnatSpec(c.existing)}` : `-A ${CHAINS.sharedDnat} ${dnatSpec(c.existing)}`;
}
