import type { Family } from '../../../model/net.js';

export type IptablesVariant = 'legacy' | 'nft';

export interface IptablesTools {
  readonly cmd: string;
  readonly save: string;
  readonly restore: string;
}

/** The binaries of one variant and family. */
export function toolsFor(variant: IptablesVariant, family: Family = 4): IptablesTools {
  const base = family === 4 ? 'iptables' : 'ip6tables';
  return { cmd: `${base}-${variant}`, save: `${base}-${variant}-save`, restore: `${base}-${variant}-restore` };
}
