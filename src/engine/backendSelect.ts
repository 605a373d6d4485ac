import type { Logger } from 'pino';
import type { Config } from '../config/config.js';
import { ExecError, type Executor } from '../system/exec.js';
import type { BackendRecord } from '../state/store.js';
import type { NetfilterBackend, ReplicaRules } from '../dataplane/netfilter/backend.js';
import { IptablesBackend } from '../dataplane/netfilter/iptables/backend.js';
import { probeIptablesVariant, type IptablesVariant } from '../dataplane/netfilter/iptables/tools.js';
import { NftBackend } from '../dataplane/netfilter/nft/backend.js';
import { SystemNftClient, type NftClient } from '../dataplane/netfilter/nft/client.js';
import { NATGW_TABLE } from '../dataplane/netfilter/nft/render.js';
import { CHAINS } from '../dataplane/netfilter/iptables/ruleText.js';

export type BackendChoice = Pick<BackendRecord, 'kind' | 'variant'>;

export function instantiate(choice: BackendChoice, exec: Executor, log?: Logger, nft?: NftClient, replica?: ReplicaRules): NetfilterBackend {
  return choice.kind === 'nftables' ? new NftBackend(exec, log, nft, undefined, replica) : new IptablesBackend(exec, choice.variant ?? 'nft', replica);
}

/** NATGW_HA_HAND_OFF_RATE's default, and the most iptables' limit match takes. */
const HAND_OFF_RATE = 10_000;

/**
 * What this replica adds to the rules: its SNAT port slice (wherever configured), and in the
 * active-active mode the drop of invalid packets (a packet that ECMP sends here before its
 * flow's state arrived is never answered with a reset by a local socket), after a copy to every
 * peer (one of them holds the state and carries it) unless NATGW_HA_HAND_OFF=off.
 */
export function replicaRulesOf(config: Pick<Config, 'ha'>): ReplicaRules | undefined {
  const ha = config.ha;
  const slice = ha?.snatPortSlice;
  const activeActive = (ha?.peers.length ?? 0) > 0 && ha?.mode === 'active-active';
  if (!slice && !activeActive) return undefined;
  return {
    ...(slice ? { snatPorts: { lo: slice.lo, hi: slice.hi } } : {}),
    ...(activeActive ? { dropInvalid: true } : {}),
    ...(activeActive && ha?.handOff !== false ? { handOff: { peers: ha?.peers ?? [], rate: ha?.handOffRate ?? HAND_OFF_RATE } } : {}),
  };
}

export function sameChoice(a: BackendChoice, b: BackendChoice): boolean {
  return a.kind === b.kind && (a.kind === 'nftables' || a.variant === b.variant);
}

/** The evidence decideBackend weighs; BackendProbe reads it from the kernel, tests fake it. */
export interface BackendEvidence {
  iptablesVariant(): Promise<IptablesVariant>;
  ownsIptables(variant: IptablesVariant): Promise<boolean>;
  ownsNft(): Promise<boolean>;
}

/** Evidence only from this network namespace (SPEC §4.3). */
export class BackendProbe implements BackendEvidence {
  constructor(
    private readonly exec: Executor,
    private readonly nft: NftClient = new SystemNftClient(exec),
  ) {}

  /** The script's probe: legacy iptables answering for the nat table means legacy. */
  iptablesVariant(): Promise<IptablesVariant> {
    return probeIptablesVariant(this.exec);
  }

  /** Read as the backend reads (a legacy table that does not exist is not created by looking). */
  async ownsIptables(variant: IptablesVariant): Promise<boolean> {
    try {
      return (await new IptablesBackend(this.exec, variant).read('nat')).chains.has(CHAINS.snatFilter);
    } catch (e) {
      // A hung listing is no answer at all (see ownsNft); a variant that cannot list here owns nothing.
      if (e instanceof ExecError && e.timedOut) throw e;
      return false;
    }
  }

  /**
   * Where nft cannot work here at all (no binary, no nf_tables), natgw owns nothing in it. A
   * listing that fails while nft works (a hang, a transient error) is not "owns nothing": that
   * answer would choose iptables beside a populated nft table and leave both doing NAT, so the
   * failure propagates and the transaction is retried instead.
   */
  async ownsNft(): Promise<boolean> {
    try {
      return (await this.nft.list('ip', NATGW_TABLE)) !== null;
    } catch (e) {
      if (e instanceof ExecError && e.timedOut) throw e;
      if (!(await this.nft.present())) return false;
      throw e;
    }
  }
}

/**
 * Decide the backend: an explicit mode wins; `auto` takes the recorded choice, then what
 * natgw already owns here, and with no evidence iptables: the script's observable layout, which
 * Kube-OVN's e2e suite and operators' runbooks read with `iptables-save` (SPEC §4.3). nftables
 * is chosen by configuration, or kept where natgw already runs on it. The iptables variant:
 * forced by config, else the recorded one, else one that already holds natgw's chains, else the
 * script's probe. Two variants are never mixed.
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
  return (await ownedElsewhere(probe)) ?? { kind: 'iptables', variant: await variant() };
}

/**
 * A backend other than `choice` that holds natgw's objects here, if any (nftables first): what
 * `auto` keeps; where to switch from when nothing is recorded (a lost state dir, an upgrade from
 * the script); what is still left after a cleanup (an older switch whose cleanup was overtaken).
 * Never mix two backends.
 */
export async function ownedElsewhere(probe: BackendEvidence, choice?: BackendChoice): Promise<BackendChoice | undefined> {
  if (choice?.kind !== 'nftables' && (await probe.ownsNft())) return { kind: 'nftables' };
  for (const v of ['legacy', 'nft'] as const) {
    if (choice?.kind === 'iptables' && choice.variant === v) continue;
    if (await probe.ownsIptables(v)) return { kind: 'iptables', variant: v };
  }
  return undefined;
}
