import type { Logger } from 'pino';
import type { Config } from '../config/config.js';
import type { Executor } from '../system/exec.js';
import type { BackendRecord } from '../state/store.js';
import type { NetfilterBackend } from '../dataplane/netfilter/backend.js';
import { IptablesBackend, type IptablesVariant, toolsFor } from '../dataplane/netfilter/iptables/backend.js';
import { NftBackend } from '../dataplane/netfilter/nft/backend.js';
import { CHAINS } from '../model/ruleText.js';

export type BackendChoice = Pick<BackendRecord, 'kind' | 'variant'>;

export function instantiate(choice: BackendChoice, exec: Executor, log?: Logger): NetfilterBackend {
  return choice.kind === 'nftables' ? new NftBackend(exec, log) : new IptablesBackend(exec, choice.variant ?? 'nft', log);
}

export function sameChoice(a: BackendChoice, b: BackendChoice): boolean {
  return a.kind === b.kind && (a.kind === 'nftables' || a.variant === b.variant);
}

/** The evidence decideBackend weighs; BackendProbe reads it from the kernel, tests fake it. */
export interface BackendEvidence {
  iptablesVariant(): Promise<IptablesVariant>;
  ownsIptables(variant: IptablesVariant): Promise<boolean>;
  ownsNft(): Promise<boolean>;
  nftWorks(): Promise<boolean>;
}

/** Evidence only from this network namespace (SPEC §4.3). */
export class BackendProbe implements BackendEvidence {
  constructor(private readonly exec: Executor) {}

  /** The script's probe: legacy iptables answering for the nat table means legacy. */
  async iptablesVariant(): Promise<IptablesVariant> {
    const r = await this.exec.run({ file: 'iptables-legacy', args: ['-t', 'nat', '-S', 'INPUT', '1'] });
    return r.exitCode === 0 ? 'legacy' : 'nft';
  }

  async ownsIptables(variant: IptablesVariant): Promise<boolean> {
    const r = await this.exec.run({ file: toolsFor(variant).save, args: ['-t', 'nat'] });
    return r.exitCode === 0 && r.stdout.includes(`:${CHAINS.snatFilter} `);
  }

  async ownsNft(): Promise<boolean> {
    const r = await this.exec.run({ file: 'nft', args: ['list', 'table', 'ip', 'natgw'] });
    return r.exitCode === 0;
  }

  async nftWorks(): Promise<boolean> {
    const r = await this.exec.run({ file: 'nft', args: ['list', 'tables'] });
    return r.exitCode === 0;
  }
}

/**
 * Decide the backend: an explicit mode wins; `auto` takes the recorded choice, then what
 * natgw already owns here, then whether nftables works. The iptables variant: forced by
 * config, else the recorded one, else one that already holds natgw's chains, else the probe.
 * Two variants are never mixed.
 */
export async function decideBackend(
  config: Pick<Config, 'mode' | 'iptablesVariant'>,
  record: BackendRecord | undefined,
  probe: BackendEvidence,
): Promise<BackendChoice> {
  const variant = async (): Promise<IptablesVariant> => {
    if (config.iptablesVariant !== 'auto') return config.iptablesVariant;
    if (record?.kind === 'iptables' && record.variant) return record.variant;
    for (const v of ['legacy', 'nft'] as const) if (await probe.ownsIptables(v)) return v;
    return probe.iptablesVariant();
  };
  if (config.mode === 'nftables') return { kind: 'nftables' };
  if (config.mode === 'iptables') return { kind: 'iptables', variant: await variant() };
  if (record) return record.kind === 'iptables' ? { kind: 'iptables', variant: await variant() } : { kind: 'nftables' };
  if (await probe.ownsNft()) return { kind: 'nftables' };
  for (const v of ['legacy', 'nft'] as const) if (await probe.ownsIptables(v)) return { kind: 'iptables', variant: v };
  if (await probe.nftWorks()) return { kind: 'nftables' };
  return { kind: 'iptables', variant: await variant() };
}
