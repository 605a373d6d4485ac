import { type IptablesVariant, probeIptablesVariant, toolsFor } from '../dataplane/netfilter/iptables/tools.js';
import { ExecError, type ExecRequest, type ExecResult, type Executor, runChecked } from '../system/exec.js';
import type { LinkView, NatChange, NatView, RouteView } from './plan.js';
import { NFT_TABLE, renderIptables, renderNft } from './render.js';
import { listsNftTable, parseIptablesNat, parseLink, parseNftTable, parseRoutes, parseRulesFrom } from './view.js';

/**
 * The thin layer that runs the tools for the LoadBalancer-service commands: reads what the
 * kernel holds and applies rendered scripts, through the Executor's plain `run` (argument
 * arrays and stdin scripts, never a shell).
 */

export type LbBackend = { readonly kind: 'iptables'; readonly variant: IptablesVariant } | { readonly kind: 'nftables' };

/** Run and throw the tool's ExecError, naming `what` was refused, unless it exited 0. */
function checked(exec: Executor, what: string, req: ExecRequest): Promise<ExecResult> {
  return runChecked(exec, req, what);
}

/**
 * GATEWAY_NETFILTER_MODE and NATGW_IPTABLES_VARIANT as natgw reads them (SPEC §4.3): an explicit
 * mode wins; `auto` keeps nftables where natgw's LB-service table already is, else iptables,
 * the script's layout. The variant: forced, else the script's probe (legacy iptables answering
 * for the nat table means legacy), as natgw's backend detection does.
 */
export async function chooseBackend(exec: Executor, mode: 'auto' | 'nftables' | 'iptables', variant: 'auto' | IptablesVariant): Promise<LbBackend> {
  if (mode === 'nftables') return { kind: 'nftables' };
  if (mode === 'auto' && (await nftTableExists(exec))) return { kind: 'nftables' };
  if (variant !== 'auto') return { kind: 'iptables', variant };
  return { kind: 'iptables', variant: await probeIptablesVariant(exec) };
}

async function nftTableExists(exec: Executor): Promise<boolean> {
  const r = await exec.run({ file: 'nft', args: ['-j', 'list', 'tables', 'ip'] });
  // No nft here (or no nf_tables): natgw has no table in it.
  return r.exitCode === 0 && listsNftTable(r.stdout);
}

export interface NatRead extends NatView {
  /** nftables: the skeleton needs no repair. iptables: always (its chains are built in). */
  readonly intact: boolean;
}

export async function readNat(exec: Executor, b: LbBackend): Promise<NatRead> {
  if (b.kind === 'iptables') {
    const r = await checked(exec, 'reading the nat table', { file: toolsFor(b.variant).save, args: ['-t', 'nat'] });
    return { ...parseIptablesNat(r.stdout), intact: true };
  }
  const r = await exec.run({ file: 'nft', args: ['-j', 'list', 'table', 'ip', NFT_TABLE] });
  if (r.exitCode === 0 && !r.timedOut) return parseNftTable(r.stdout);
  // A failed listing is an absent table only when the table list says so.
  if (!r.timedOut && !(await nftTableExists(exec))) return { dnats: [], masquerades: [], intact: false };
  throw new ExecError(r, `reading table ip ${NFT_TABLE}`);
}

/** One atomic transaction; nothing is run for an empty iptables change. */
export async function applyNat(exec: Executor, b: LbBackend, change: NatChange): Promise<void> {
  if (b.kind === 'iptables') {
    await checked(exec, 'the nat table transaction', { file: toolsFor(b.variant).restore, args: ['--noflush', '--wait'], input: renderIptables(change) });
  } else {
    await checked(exec, `the table ip ${NFT_TABLE} transaction`, { file: 'nft', args: ['-f', '-'], input: renderNft(change) });
  }
}

export async function readRoutes(exec: Executor): Promise<RouteView> {
  const r = await checked(exec, 'reading routes', { file: 'ip', args: ['-4', '-j', 'route', 'show', 'table', 'all'] });
  return parseRoutes(r.stdout);
}

export async function readLink(exec: Executor, dev: string): Promise<LinkView | undefined> {
  const r = await exec.run({ file: 'ip', args: ['-j', 'address', 'show', 'dev', dev] });
  return r.exitCode === 0 ? parseLink(r.stdout) : undefined;
}

export async function readRulesFrom(exec: Executor): Promise<Set<string>> {
  const r = await checked(exec, 'reading ip rules', { file: 'ip', args: ['-4', '-j', 'rule', 'show'] });
  return parseRulesFrom(r.stdout);
}

/** `ip -batch -`: stops at the first refused line. */
export async function ipBatch(exec: Executor, what: string, lines: readonly string[]): Promise<void> {
  if (lines.length === 0) return;
  await checked(exec, what, { file: 'ip', args: ['-batch', '-'], input: `${lines.join('\n')}\n` });
}

/**
 * The script's announcement: an ARP request for the gateway from the EIP (`arping -f -c 3 -s
 * EIP GATEWAY`), which also proves the gateway answers on EXT; without an answer the command fails, as the script's does.
 */
export async function announce(exec: Executor, dev: string, eip: string, gateway: string): Promise<void> {
  await checked(exec, `the ARP announcement of ${eip} to ${gateway} on ${dev}`, {
    file: 'arping',
    args: ['-q', '-f', '-c', '3', '-w', '4', '-I', dev, '-s', eip, gateway],
  });
}
