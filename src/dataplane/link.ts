import { promises as fs } from 'node:fs';
import type { Logger } from 'pino';
import { type Executor, runChecked } from '../system/exec.js';
import { SystemError } from '../model/errors.js';
import { familyOf } from '../model/net.js';
import type { DesiredState } from '../state/state.js';

/**
 * Addresses, routes and ARP: what `ip` holds for natgw. Sync is additive for what is desired
 * and removes only what natgw itself had programmed (the previous state), so addresses and
 * routes of other owners are never touched.
 */
export interface LinkAddress {
  readonly address: string;
  readonly prefixLength: number;
  readonly family: 4 | 6;
  readonly scope: string;
}

export interface LinkRoute {
  readonly dst: string;
  readonly gateway?: string;
}

export interface LinkView {
  readonly extAddresses: readonly LinkAddress[];
  readonly vpcRoutes: readonly LinkRoute[];
  readonly extDefaults: readonly LinkRoute[];
}

/** PURE: the `ip -batch` lines that take `have` to `want`, given what natgw programmed before. */
export function planLink(have: LinkView, want: DesiredState, previous: DesiredState | undefined): string[] {
  const ext = want.interfaces.ext;
  const vpc = want.interfaces.vpc;
  const lines: string[] = [];
  // The kernel keys an IPv4 address by address AND prefix: `addr replace` with a new prefix
  // adds a second address, so every other prefix of an EIP's address is removed explicitly.
  const prefixesOf = (address: string) => have.extAddresses.filter((a) => a.address === address).map((a) => a.prefixLength);
  const deletes = new Set<string>();
  for (const e of want.eips) {
    const present = prefixesOf(e.address);
    // IPv6 EIPs skip DAD: IPAM allocated them, and a tentative address would drop traffic for seconds.
    const nodad = familyOf(e.address) === 6 ? ' nodad' : '';
    if (!present.includes(e.prefixLength)) lines.push(`addr replace ${e.address}/${e.prefixLength} dev ${ext}${nodad}`);
    for (const len of present) if (len !== e.prefixLength) deletes.add(`${e.address}/${len}`);
  }
  const wantedEips = new Set(want.eips.map((e) => e.address));
  for (const e of previous?.eips ?? []) {
    if (wantedEips.has(e.address)) continue;
    for (const len of prefixesOf(e.address)) deletes.add(`${e.address}/${len}`);
  }
  // Deleted in the reverse of the kernel's order: secondaries before their primary, so that
  // without promote_secondaries removing a primary cannot take the other EIPs of its subnet.
  const order = have.extAddresses.map((a) => `${a.address}/${a.prefixLength}`);
  for (const d of [...deletes].sort((a, b) => order.indexOf(b) - order.indexOf(a))) lines.push(`addr del ${d} dev ${ext}`);

  const routeHave = new Map(have.vpcRoutes.map((r) => [normaliseDst(r.dst), r.gateway]));
  for (const r of want.routes) {
    if (routeHave.get(r.cidr) !== r.nexthop) lines.push(`route replace ${r.cidr} via ${r.nexthop} dev ${vpc}`);
  }
  const wantedRoutes = new Set(want.routes.map((r) => r.cidr));
  for (const r of previous?.routes ?? []) {
    if (!wantedRoutes.has(r.cidr) && routeHave.has(r.cidr)) lines.push(`route del ${r.cidr} dev ${vpc}`);
  }

  for (const gw of [want.defaultRoutes.v4, want.defaultRoutes.v6]) {
    if (gw === undefined) continue;
    if (!have.extDefaults.some((d) => d.gateway === gw)) lines.push(`route replace default via ${gw} dev ${ext} onlink`);
  }
  return lines;
}

/** `ip -j route` prints host routes without a prefix length. */
function normaliseDst(dst: string): string {
  if (dst === 'default' || dst.includes('/')) return dst;
  return `${dst}/${familyOf(dst) === 4 ? 32 : 128}`;
}

interface IpAddrJson {
  addr_info?: { family?: string; local?: string; prefixlen?: number; scope?: string }[];
}

function addressesOf(links: IpAddrJson[]): LinkAddress[] {
  return links.flatMap((l) =>
    (l.addr_info ?? [])
      .filter((a) => (a.family === 'inet' || a.family === 'inet6') && a.local)
      .map((a) => ({
        address: a.local ?? '',
        prefixLength: a.prefixlen ?? 32,
        family: a.family === 'inet' ? (4 as const) : (6 as const),
        scope: a.scope ?? 'global',
      })),
  );
}

export class LinkManager {
  constructor(
    private readonly exec: Executor,
    private readonly log?: Logger,
  ) {}

  async exists(ifname: string): Promise<boolean> {
    const r = await this.exec.run({ file: 'ip', args: ['link', 'show', 'dev', ifname] });
    return r.exitCode === 0;
  }

  /**
   * Wait until every named interface exists, polling with a deadline (Multus attaches net1
   * late). Returns the names still missing at the deadline.
   */
  async waitFor(names: readonly string[], timeoutMs: number, onWait?: (missing: string[]) => void): Promise<string[]> {
    const deadline = Date.now() + timeoutMs;
    let told = '';
    for (;;) {
      const missing: string[] = [];
      for (const n of names) if (!(await this.exists(n))) missing.push(n);
      if (missing.length === 0 || Date.now() >= deadline) return missing;
      if (missing.join(',') !== told) {
        told = missing.join(',');
        onWait?.(missing);
      }
      await new Promise((r) => setTimeout(r, Math.min(100, Math.max(0, deadline - Date.now()))));
    }
  }

  async addresses(ifname: string): Promise<LinkAddress[]> {
    const r = await this.exec.run({ file: 'ip', args: ['-j', 'addr', 'show', 'dev', ifname] });
    return r.exitCode === 0 ? addressesOf(JSON.parse(r.stdout || '[]') as IpAddrJson[]) : [];
  }

  /**
   * Everything planLink needs, in two `ip -batch` runs (one per family) instead of one process
   * per question: spawning is the dominant cost of a command on a small machine.
   */
  async view(s: DesiredState): Promise<LinkView> {
    const { vpc, ext } = s.interfaces;
    const [v4, v6] = await Promise.all([
      this.batchJson(['-j', '-batch', '-'], [`addr show dev ${ext}`, `route show dev ${vpc}`, `route show default dev ${ext}`]),
      this.batchJson(['-6', '-j', '-batch', '-'], [`route show dev ${vpc}`, `route show default dev ${ext}`]),
    ]);
    const routes = (x: unknown): LinkRoute[] => ((x ?? []) as { dst: string; gateway?: string }[]).map((r) => ({ dst: r.dst, gateway: r.gateway }));
    return {
      extAddresses: addressesOf((v4[0] ?? []) as IpAddrJson[]),
      vpcRoutes: [...routes(v4[1]), ...routes(v6[0])],
      extDefaults: [...routes(v4[2]), ...routes(v6[1])],
    };
  }

  /** One JSON document per batch line; a line that failed (missing device) yields nothing. */
  private async batchJson(args: string[], lines: string[]): Promise<unknown[]> {
    const r = await this.exec.run({ file: 'ip', args, input: lines.join('\n') + '\n' });
    return r.stdout
      .split('\n')
      .filter((l) => l.startsWith('['))
      .map((l) => JSON.parse(l) as unknown);
  }

  /**
   * Deleting a primary IPv4 address also deletes the secondaries of its subnet unless
   * promote_secondaries is on (it is off in a new network namespace, so in a pod): an eip-del
   * would take the other EIPs of that subnet with it. Best effort; failures are logged.
   */
  async promoteSecondaries(ifname: string): Promise<void> {
    const file = `/proc/sys/net/ipv4/conf/${ifname}/promote_secondaries`;
    try {
      if ((await fs.readFile(file, 'utf8')).trim() !== '1') await fs.writeFile(file, '1\n');
    } catch (e) {
      this.log?.warn({ err: e, ifname }, 'could not enable promote_secondaries');
    }
  }

  async sync(
    want: DesiredState,
    previous: DesiredState | undefined,
    opts: { dryRun?: boolean; view?: LinkView } = {},
  ): Promise<{ changes: number; script: string }> {
    const lines = planLink(opts.view ?? (await this.view(want)), want, previous);
    const script = lines.length ? lines.join('\n') + '\n' : '';
    if (lines.length === 0 || opts.dryRun) return { changes: lines.length, script };
    if (lines.some((l) => l.startsWith('addr del'))) await this.promoteSecondaries(want.interfaces.ext);
    const r = await this.exec.run({ file: 'ip', args: ['-batch', '-'], input: script });
    if (r.exitCode !== 0) throw new SystemError(`Error: ip rejected an address or route change: ${r.stderr.trim().split('\n')[0] ?? ''}`);
    this.log?.debug({ changes: lines.length }, 'addresses and routes applied');
    return { changes: lines.length, script };
  }

  /** Gratuitous ARP without holding the command (the script blocked ~3 s per EIP). */
  announce(ifname: string, ip: string): void {
    if (familyOf(ip) !== 4) return;
    this.exec.spawnDetached({ file: 'arping', args: ['-U', '-c', '3', '-I', ifname, ip] });
  }

  async hasTool(file: string, args: string[] = ['-V']): Promise<boolean> {
    const r = await this.exec.run({ file, args });
    return !r.failedToStart;
  }

  async ensureUp(ifname: string): Promise<void> {
    await runChecked(this.exec, { file: 'ip', args: ['link', 'set', 'dev', ifname, 'up'] });
  }
}
