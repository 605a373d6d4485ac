import type { Family } from '../../../model/net.js';
import type { Executor } from '../../../system/exec.js';

export type IptablesVariant = 'legacy' | 'nft';

/** The binaries of one variant and family. */
export function toolsFor(variant: IptablesVariant, family: Family = 4): { cmd: string; save: string; restore: string } {
  const base = family === 4 ? 'iptables' : 'ip6tables';
  return { cmd: `${base}-${variant}`, save: `${base}-${variant}-save`, restore: `${base}-${variant}-restore` };
}

/**
 * The script's variant probe, which Kube-OVN's own tests read through: legacy iptables answering
 * for the nat table means legacy, anything else nft.
 */
export async function probeIptablesVariant(exec: Executor): Promise<IptablesVariant> {
  const r = await exec.run({ file: 'iptables-legacy', args: ['-t', 'nat', '-S', 'INPUT', '1'] });
  return r.exitCode === 0 ? 'legacy' : 'nft';
}
