import { promises as fs } from 'node:fs';
import type { Logger } from 'pino';
import { ExecError, type Executor, runChecked } from '../system/exec.js';
import { RecordFile } from '../state/recordFile.js';
import { familyOf, formatCidr, parseCidr } from '../model/net.js';
import { heldDefaultRoutes, heldDefaultRouteText } from '../model/defaultRoute.js';
import type { DesiredState } from '../state/state.js';
import type { SyncOptions } from './netfilter/backend.js';
import { timelineMark } from '../system/timeline.js';
import { eipInterface, uplinkNames, type UplinkNetwork } from '../model/uplinks.js';

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
  /** The secondary uplink it is on (model/uplinks.ts); absent: the primary external interface. */
  readonly dev?: string;
}

export interface LinkRoute {
  readonly dst: string;
  readonly gateway?: string;
  /** `ip -j route`'s protocol (absent for `boot`, what `ip route replace` makes). */
  readonly protocol?: string;
}

export interface LinkView {
  /** The primary's addresses, then each secondary uplink's (`dev` set). */
  readonly extAddresses: readonly LinkAddress[];
  /** The secondary uplinks the kernel has (read only with secondary uplinks). */
  readonly devices?: ReadonlySet<string>;
  readonly vpcRoutes: readonly LinkRoute[];
  readonly extDefaults: readonly LinkRoute[];
}

/** One change planLink decides on, in the order it runs. */
export type LinkOp =
  | { readonly kind: 'addr-replace'; readonly address: string; readonly prefixLength: number; readonly dev?: string }
  | { readonly kind: 'addr-del'; readonly address: string; readonly prefixLength: number; readonly dev?: string }
  | { readonly kind: 'route-replace'; readonly cidr: string; readonly nexthop: string }
  | { readonly kind: 'route-del'; readonly cidr: string }
  | { readonly kind: 'default'; readonly gateway: string };

/**
 * What natgw may remove besides what the previous state lists: addresses (any prefix) on EXT
 * and route destinations on VPC that it owns by its durable record (an add that failed half-way
 * or a crash mid-apply left them) or that a delete command named (SPEC §5: a delete removes the
 * object it names whether or not the state lists it).
 */
export interface LinkOwned {
  readonly addresses: ReadonlySet<string>;
  readonly routes: ReadonlySet<string>;
}

/** PURE: the changes that take `have` to `want`, given what natgw programmed before and owns. */
export function linkOps(have: LinkView, want: DesiredState, previous: DesiredState | undefined, owned?: LinkOwned): LinkOp[] {
  const ops: LinkOp[] = [];
  // The kernel keys an IPv4 address by address AND prefix: `addr replace` with a new prefix
  // adds a second address, so every other prefix of an EIP's address is removed explicitly.
  // With several uplinks an address is keyed by its device too (addressKey).
  const prefixes = new Map<string, { dev: string | undefined; len: number }[]>();
  for (const a of have.extAddresses) prefixes.set(a.address, [...(prefixes.get(a.address) ?? []), { dev: a.dev, len: a.prefixLength }]);
  const heldAt = (address: string) => prefixes.get(address) ?? [];
  const deletes = new Map<string, LinkOp & { kind: 'addr-del' }>();
  const del = (dev: string | undefined, address: string, prefixLength: number): void => {
    const op = { kind: 'addr-del', address, prefixLength, ...onDev(dev) } as const;
    deletes.set(addressKey(op), op);
  };
  for (const e of want.eips) {
    const on = eipInterface(want.interfaces, e);
    const dev = on === want.interfaces.ext ? undefined : on;
    // A secondary uplink that is gone: its EIPs wait for it (the link event's resync adds them).
    if (dev !== undefined && !have.devices?.has(dev)) continue;
    for (const x of heldAt(e.address)) if (x.dev !== dev) del(x.dev, e.address, x.len);
    const present = heldAt(e.address)
      .filter((x) => x.dev === dev)
      .map((x) => x.len);
    const stale = present.filter((len) => len !== e.prefixLength);
    if (present.includes(e.prefixLength)) {
      for (const len of stale) del(dev, e.address, len);
      continue;
    }
    // IPv6 keys an address without its prefix: a replace would keep the old prefix and the
    // delete after it would take the address, so the old prefix goes first.
    if (familyOf(e.address) === 6) for (const len of stale) ops.push({ kind: 'addr-del', address: e.address, prefixLength: len, ...onDev(dev) });
    else for (const len of stale) del(dev, e.address, len);
    ops.push({ kind: 'addr-replace', address: e.address, prefixLength: e.prefixLength, ...onDev(dev) });
  }
  const wantedEips = new Set(want.eips.map((e) => e.address));
  const removable = new Set([...(previous?.eips ?? []).map((e) => e.address), ...(owned?.addresses ?? [])]);
  for (const address of removable) {
    if (wantedEips.has(address)) continue;
    for (const x of heldAt(address)) del(x.dev, address, x.len);
  }
  // Deleted in the reverse of the listed order: secondaries before their primary, so that
  // without promote_secondaries removing a primary cannot take the other EIPs of its subnet.
  const position = new Map(have.extAddresses.map((a, i) => [addressKey(a), i]));
  const at = (key: string): number => position.get(key) ?? -1;
  ops.push(...[...deletes].sort(([a], [b]) => at(b) - at(a)).map(([, op]) => op));

  const routeHave = new Map(have.vpcRoutes.map((r) => [normaliseDst(r.dst, r.gateway), r.gateway]));
  // A subnet route to a default the external default owns is held, not installed: installing
  // both would have each replace the other at every sync. Nor is it deleted where the kernel
  // still has it on VPC: the external default's `replace` below takes its place without a gap.
  const held = new Set(heldDefaultRoutes(want).map((h) => h.route.cidr));
  for (const r of want.routes) {
    if (held.has(r.cidr)) continue;
    if (routeHave.get(r.cidr) !== r.nexthop) ops.push({ kind: 'route-replace', cidr: r.cidr, nexthop: r.nexthop });
  }
  const wantedRoutes = new Set(want.routes.map((r) => r.cidr));
  for (const cidr of new Set([...(previous?.routes ?? []).map((r) => r.cidr), ...(owned?.routes ?? [])])) {
    if (!wantedRoutes.has(cidr) && routeHave.has(cidr)) ops.push({ kind: 'route-del', cidr });
  }

  for (const gw of [want.defaultRoutes.v4, want.defaultRoutes.v6]) {
    if (gw === undefined) continue;
    if (!have.extDefaults.some((d) => d.gateway === gw)) ops.push({ kind: 'default', gateway: gw });
  }
  return ops;
}

const onDev = (dev: string | undefined): { dev?: string } => (dev === undefined ? {} : { dev });

/** PURE: the `ip -batch` lines that take `have` to `want`, given what natgw programmed before. */
export function planLink(have: LinkView, want: DesiredState, previous: DesiredState | undefined): string[] {
  return linkOps(have, want, previous).map((op) => linkLine(op, want.interfaces));
}

function linkLine(op: LinkOp, ifs: DesiredState['interfaces']): string {
  switch (op.kind) {
    case 'addr-replace':
      // IPv6 EIPs skip DAD: IPAM allocated them, and a tentative address would drop traffic for seconds.
      return `addr replace ${op.address}/${op.prefixLength} dev ${op.dev ?? ifs.ext}${familyOf(op.address) === 6 ? ' nodad' : ''}`;
    case 'addr-del':
      return `addr del ${op.address}/${op.prefixLength} dev ${op.dev ?? ifs.ext}`;
    case 'route-replace':
      return `route replace ${op.cidr} via ${op.nexthop} dev ${ifs.vpc}`;
    case 'route-del':
      return `route del ${op.cidr} dev ${ifs.vpc}`;
    case 'default':
      return `route replace default via ${op.gateway} dev ${ifs.ext} onlink`;
  }
}

/** PURE: what the kernel holds once `ops` ran on `have` (addresses: see addressesAfter). */
export function linkViewAfter(have: LinkView, ops: readonly LinkOp[]): LinkView {
  let routes = [...have.vpcRoutes];
  let defaults = [...have.extDefaults];
  for (const op of ops) {
    switch (op.kind) {
      case 'route-replace':
        routes = [...routes.filter((r) => normaliseDst(r.dst, r.gateway) !== op.cidr), { dst: op.cidr, gateway: op.nexthop }];
        // A default route is keyed without its device: this one takes the place of EXT's.
        if (op.cidr === '0.0.0.0/0' || op.cidr === '::/0')
          defaults = defaults.filter((d) => d.gateway === undefined || familyOf(d.gateway) !== familyOf(op.nexthop));
        break;
      case 'route-del':
        routes = routes.filter((r) => normaliseDst(r.dst, r.gateway) !== op.cidr);
        break;
      case 'default': {
        // `replace` takes the place of the family's default route on the link, whatever its gateway.
        const fam = familyOf(op.gateway);
        defaults = [...defaults.filter((d) => d.gateway === undefined || familyOf(d.gateway) !== fam), { dst: 'default', gateway: op.gateway }];
        routes = routes.filter((r) => normaliseDst(r.dst, r.gateway) !== (fam === 4 ? '0.0.0.0/0' : '::/0'));
        break;
      }
      default:
        break;
    }
  }
  return { ...have, extAddresses: addressesAfter(have.extAddresses, ops), vpcRoutes: routes, extDefaults: defaults };
}

const isV4 = (a: LinkAddress): boolean => a.family === 4;

/** The external interfaces a kept view was read for. */
const uplinksKey = (s: DesiredState): string => uplinkNames(s.interfaces).join(',');

/** The IPv4 subnet of an address (address and prefix): the kernel's primary/secondary key. */
function subnetOf(a: LinkAddress): string {
  return formatCidr(parseCidr(`${a.address}/${a.prefixLength}`, { clearHostBits: true }) ?? { address: a.address, prefix: a.prefixLength });
}

/** An address's identity on natgw's uplinks: device (absent: the primary), address and prefix. */
const addressKey = (a: { readonly dev?: string; readonly address: string; readonly prefixLength: number }): string =>
  `${a.dev ?? ''}|${a.address}/${a.prefixLength}`;

/**
 * The addresses once `ops` ran: those kept in their order, new ones after them. The kernel lists
 * them otherwise (IPv4 primaries first, a promoted secondary behind the last primary, IPv6 newest
 * first), but keeps each IPv4 subnet's own order, the first address its primary; that order is
 * all linkOps relies on (a subnet's secondaries are deleted before its primary).
 */
function addressesAfter(have: readonly LinkAddress[], ops: readonly LinkOp[]): LinkAddress[] {
  const live = new Map(have.map((a) => [addressKey(a), a]));
  for (const op of ops) {
    if (op.kind === 'addr-del') live.delete(addressKey(op));
    else if (op.kind === 'addr-replace') {
      const a = { address: op.address, prefixLength: op.prefixLength, family: familyOf(op.address), scope: 'global', ...onDev(op.dev) };
      live.set(addressKey(a), a);
    }
  }
  return [...live.values()];
}

/** Whether an IPv4 address was deleted from a subnet that still holds other addresses. */
function leftInSubnet(ops: readonly LinkOp[], after: LinkView): boolean {
  const left = new Set(after.extAddresses.filter(isV4).map((a) => `${a.dev ?? ''}|${subnetOf(a)}`));
  return ops.some(
    (op) => op.kind === 'addr-del' && familyOf(op.address) === 4 && left.has(`${op.dev ?? ''}|${subnetOf({ ...op, family: 4, scope: 'global' })}`),
  );
}

/**
 * `ip -j route` prints host routes without a prefix length and a default route as `default`
 * (the gateway tells its family), while the state spells them as CIDRs.
 */
function normaliseDst(dst: string, gateway?: string): string {
  if (dst === 'default') return gateway === undefined ? dst : familyOf(gateway) === 4 ? '0.0.0.0/0' : '::/0';
  if (dst.includes('/')) return dst;
  return `${dst}/${familyOf(dst) === 4 ? 32 : 128}`;
}

interface IpAddrJson {
  ifname?: string;
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

export interface LinkSyncResult {
  readonly changes: number;
  readonly script: string;
  /** Warnings for the change's output (a subnet route held, not installed); absent when there are none. */
  readonly notes?: readonly string[];
}

/** PURE: the interface names /proc/net/dev lists (two header lines, then `name: counters…`). */
export function netDevNames(text: string): Set<string> {
  const names = new Set<string>();
  for (const line of text.split('\n').slice(2)) {
    const colon = line.indexOf(':');
    if (colon > 0) names.add(line.slice(0, colon).trim());
  }
  return names;
}

/**
 * The tool that tells the external segment an EIP lives here: arping's gratuitous ARP for IPv4;
 * for IPv6 an unsolicited neighbour advertisement to all nodes with the override flag and the
 * interface's link-layer address (`na6`, from ipv6toolkit: arping speaks only IPv4, ndisc6 only
 * solicits, and the kernel announces only after DAD, which natgw skips for EIPs).
 */
function announcement(ifname: string, ip: string): { file: string; args: string[] } {
  return familyOf(ip) === 4
    ? { file: 'arping', args: ['-U', '-c', '3', '-I', ifname, ip] }
    : { file: 'na6', args: ['-i', ifname, '-s', ip, '-d', 'ff02::1', '-t', ip, '-o', '-e'] };
}

/** Announcing processes at once, and how long one may take (`arping -c 3` sends for about 2 s). */
const ARP_PARALLELISM = 8;
const ARP_TIMEOUT_MS = 10_000;

/**
 * The durable ownership record of the link part (`owned.json` in the state dir): the EIP
 * addresses on EXT and the route destinations on VPC that natgw may have put into the kernel.
 *
 * Netfilter and share DNAT need no such record: their transactions are atomic and everything
 * in natgw's own tables and chains is natgw's, so a full sync converges them whatever a crash
 * left. Addresses and routes share their interfaces with other owners (the pod's own address,
 * the CNI's routes) and `ip -batch` stops half-way on an error, so the link part writes its
 * intent before touching the kernel: the record grows by what a change adds BEFORE it runs and
 * shrinks to what the state wants only AFTER it succeeded. Whatever happens in between (a
 * refused line, a hung tool, kill -9), the next sync finds every address and route natgw may
 * have added in the record and removes those the state does not want (roll forward to the
 * state that was persisted, which is the old or the new one).
 */
export interface OwnedRecord {
  readonly ext: string;
  readonly vpc: string;
  readonly addresses: readonly string[];
  readonly routes: readonly string[];
}

/** The addresses and routes of a state, as the record lists them once a sync of it succeeded. */
function ownedOf(s: DesiredState | undefined): { addresses: string[]; routes: string[] } {
  return { addresses: [...new Set((s?.eips ?? []).map((e) => e.address))], routes: [...new Set((s?.routes ?? []).map((r) => r.cidr))] };
}

/** The ownership record as natgw writes it; anything else owns nothing. */
function parseOwned(raw: unknown): OwnedRecord | undefined {
  const r = raw as Partial<OwnedRecord> | null;
  const strings = (x: unknown): string[] => (Array.isArray(x) ? x.filter((v): v is string => typeof v === 'string') : []);
  if (typeof r?.ext !== 'string' || typeof r.vpc !== 'string') return undefined;
  return { ext: r.ext, vpc: r.vpc, addresses: strings(r.addresses), routes: strings(r.routes) };
}

export class LinkManager {
  /** What the kernel holds for natgw's interfaces, as of the last read or successful apply. */
  private trusted: { readonly ext: string; readonly vpc: string; readonly view: LinkView } | undefined;
  /** The durable ownership record (see RecordFile for when it is read again). */
  private readonly owned: RecordFile<OwnedRecord> | undefined;
  /** Objects a delete command named in the transaction under way (see release). */
  private releasing: { addresses: Set<string>; routes: Set<string> } = { addresses: new Set(), routes: new Set() };

  constructor(
    private readonly exec: Executor,
    private readonly log?: Logger,
    /** Where the ownership record lives; without one (unit tests) only the previous state counts. */
    ownedFile?: string,
  ) {
    this.owned = ownedFile
      ? new RecordFile(ownedFile, parseOwned, (err) => log?.warn({ err, file: ownedFile }, 'ownership record unreadable: ignored'))
      : undefined;
  }

  /**
   * A delete command named these objects: the transaction under way removes them from natgw's
   * interfaces even where the state does not list them (SPEC §5). Cleared by endTransaction.
   */
  release(what: { readonly addresses?: readonly string[]; readonly routes?: readonly string[] }): void {
    for (const a of what.addresses ?? []) this.releasing.addresses.add(a);
    for (const r of what.routes ?? []) this.releasing.routes.add(r);
  }

  /** Whether a sync has removals of its own to do even where the state did not change. */
  hasReleases(): boolean {
    return this.releasing.addresses.size > 0 || this.releasing.routes.size > 0;
  }

  endTransaction(): void {
    this.releasing = { addresses: new Set(), routes: new Set() };
  }

  /** The ownership record; a missing or unreadable one owns nothing (the state's own lists still count). */
  async ownedRecord(): Promise<OwnedRecord | undefined> {
    return this.owned?.read();
  }

  private async writeOwned(rec: OwnedRecord): Promise<void> {
    if (!this.owned) return;
    const cur = await this.owned.read();
    const same = (a: readonly string[], b: readonly string[]) => a.length === b.length && a.every((x, i) => x === b[i]);
    if (cur && cur.ext === rec.ext && cur.vpc === rec.vpc && same(cur.addresses, rec.addresses) && same(cur.routes, rec.routes)) return;
    // The record must be durable before the kernel changes (intent) and is re-read by the next
    // process: the same atomic write as the state file.
    await this.owned.write(rec);
  }

  /** What the record and the delete commands under way let a sync of `want` remove. */
  private async removable(want: DesiredState): Promise<LinkOwned> {
    const rec = await this.ownedRecord();
    const mine = rec && rec.ext === want.interfaces.ext && rec.vpc === want.interfaces.vpc;
    return {
      addresses: new Set([...(mine ? rec.addresses : []), ...this.releasing.addresses]),
      routes: new Set([...(mine ? rec.routes : []), ...this.releasing.routes]),
    };
  }

  /**
   * Whether the interface exists. /proc/net/dev (this network namespace's interfaces) answers
   * without starting a process (the start-up and every resync ask); a name it does not list may
   * still be an alternative name, which only `ip` resolves.
   */
  async exists(ifname: string): Promise<boolean> {
    const dev = await this.exec.readKernelFile?.('/proc/net/dev');
    if (dev !== undefined && netDevNames(dev).has(ifname)) return true;
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
      const found = await Promise.all(names.map((n) => this.exists(n)));
      const missing = names.filter((_, i) => !found[i]);
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
  async view(s: DesiredState, previous?: DesiredState): Promise<LinkView> {
    const { vpc, ext } = s.interfaces;
    // The uplinks natgw applied before count too: a re-init that drops one takes its EIPs off it.
    const secondary = [...new Set([...(s.interfaces.secondary ?? []), ...(previous?.interfaces.secondary ?? [])].map((u) => u.name).filter((n) => n !== ext))];
    const [v4, v6, uplinks] = await Promise.all([
      this.batchJson(['-j', '-batch', '-'], [`addr show dev ${ext}`, `route show dev ${vpc}`, `route show default dev ${ext}`]),
      this.batchJson(['-6', '-j', '-batch', '-'], [`route show dev ${vpc}`, `route show default dev ${ext}`]),
      secondary.length > 0 ? this.allAddresses() : undefined,
    ]);
    const routes = (x: unknown): LinkRoute[] =>
      ((x ?? []) as { dst: string; gateway?: string; protocol?: string }[]).map((r) => ({
        dst: r.dst,
        gateway: r.gateway,
        ...(r.protocol ? { protocol: r.protocol } : {}),
      }));
    const primary = addressesOf((v4[0] ?? []) as IpAddrJson[]);
    const base = { vpcRoutes: [...routes(v4[1]), ...routes(v6[0])], extDefaults: [...routes(v4[2]), ...routes(v6[1])] };
    if (!uplinks) return { extAddresses: primary, ...base };
    const found = secondary.flatMap((dev) => uplinks.filter((l) => l.ifname === dev));
    return {
      extAddresses: [...primary, ...found.flatMap((l) => addressesOf([l]).map((a) => ({ ...a, dev: l.ifname ?? '' })))],
      devices: new Set(found.map((l) => l.ifname ?? '')),
      ...base,
    };
  }

  /** Every interface's addresses (`ip -j addr show`), for the secondary uplinks. */
  private async allAddresses(): Promise<IpAddrJson[]> {
    const r = await this.exec.run({ file: 'ip', args: ['-j', 'addr', 'show'] });
    return r.exitCode === 0 ? (JSON.parse(r.stdout || '[]') as IpAddrJson[]) : [];
  }

  /** The networks the named uplinks are connected to, from their addresses (what `ip route get` consults). */
  async uplinkNetworks(names: readonly string[]): Promise<UplinkNetwork[]> {
    const links = await this.allAddresses();
    return names.flatMap((dev) =>
      addressesOf(links.filter((l) => l.ifname === dev))
        .filter((a) => a.scope === 'global')
        .map((a) => ({ dev, cidr: `${a.address}/${a.prefixLength}` })),
    );
  }

  /** One JSON document per batch line; a line that failed (missing device) yields nothing. */
  private async batchJson(args: string[], lines: string[]): Promise<unknown[]> {
    const r = await this.exec.run({ file: 'ip', args, input: `${lines.join('\n')}\n` });
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
  async promoteSecondaries(ifname: string): Promise<boolean> {
    const file = `/proc/sys/net/ipv4/conf/${ifname}/promote_secondaries`;
    try {
      if ((await fs.readFile(file, 'utf8')).trim() !== '1') await fs.writeFile(file, '1\n');
      return true;
    } catch (e) {
      this.log?.warn({ err: e, ifname }, 'could not enable promote_secondaries');
      return false;
    }
  }

  /** promote_secondaries on every uplink an address is deleted from; whether each took. */
  private async promoteWhereDeleting(want: DesiredState, ops: readonly LinkOp[]): Promise<boolean> {
    const devs = new Set(ops.flatMap((op) => (op.kind === 'addr-del' ? [op.dev ?? want.interfaces.ext] : [])));
    let all = true;
    for (const dev of devs) if (!(await this.promoteSecondaries(dev))) all = false;
    return all;
  }

  /**
   * The ownership record grown by everything a change from `previous` to `want` may add, durable
   * before it returns (the intent a sync writes before its `ip -batch`).
   */
  async recordIntent(want: DesiredState, previous: DesiredState | undefined): Promise<void> {
    const rec = await this.ownedRecord();
    const mine = rec && rec.ext === want.interfaces.ext && rec.vpc === want.interfaces.vpc ? rec : undefined;
    await this.writeOwned({
      ext: want.interfaces.ext,
      vpc: want.interfaces.vpc,
      addresses: [...new Set([...(mine?.addresses ?? []), ...(previous?.eips ?? []).map((e) => e.address), ...want.eips.map((e) => e.address)])],
      routes: [...new Set([...(mine?.routes ?? []), ...(previous?.routes ?? []).map((r) => r.cidr), ...want.routes.map((r) => r.cidr)])],
    });
  }

  /**
   * Make addresses and routes hold `want` (SyncOptions' contract). `opts.view` is a read-back
   * the caller made itself (in parallel with other work) and counts as a full read.
   */
  async sync(want: DesiredState, previous: DesiredState | undefined, opts: SyncOptions = {}): Promise<LinkSyncResult> {
    const notes = this.heldNotes(want, opts.dryRun === true);
    const done = (changes: number, script: string): LinkSyncResult => (notes.length ? { changes, script, notes } : { changes, script });
    // A delete of an object the state does not list needs a fresh look: the kept view knows only what natgw did.
    const kept = opts.mode === 'partial' && !this.hasReleases() ? this.viewFor(want) : undefined;
    const have = kept ?? (await this.view(want, previous));
    const owned = await this.removable(want);
    const ops = linkOps(have, want, previous, owned);
    const lines = ops.map((op) => linkLine(op, want.interfaces));
    const script = lines.length ? `${lines.join('\n')}\n` : '';
    if (opts.dryRun) return done(lines.length, script);
    const settled: OwnedRecord = { ext: want.interfaces.ext, vpc: want.interfaces.vpc, ...ownedOf(want) };
    if (lines.length === 0) {
      await this.writeOwned(settled);
      this.trust(want, have);
      return done(0, script);
    }
    // Intent first: everything this change may add joins what natgw already owns.
    timelineMark('link: planned');
    await this.recordIntent(want, previous);
    const promoted = await this.promoteWhereDeleting(want, ops);
    timelineMark('link: intent recorded');
    const running = this.exec.run({ file: 'ip', args: ['-batch', '-'], input: script });
    // The view after the change is computed while `ip` applies it (used only if it succeeds).
    const after = linkViewAfter(have, ops);
    const r = await running;
    if (r.exitCode !== 0) {
      // `ip -batch` stops at the first error with the lines before it applied: the kernel is
      // somewhere in between, and the record (intent) lets the next sync finish the job.
      this.forget();
      throw new ExecError(r, 'the address and route change', script);
    }
    await this.writeOwned(settled);
    // Without promote_secondaries a deleted primary takes the rest of its subnet along.
    if (promoted || !leftInSubnet(ops, after)) this.trust(want, after);
    else this.forget();
    this.log?.debug({ changes: lines.length, partial: kept !== undefined }, 'addresses and routes applied');
    return done(lines.length, script);
  }

  /** Subnet routes to the default the external one owns (heldDefaultRoutes) warned about in the log so far. */
  private heldWarned = new Set<string>();

  /**
   * Each held subnet route as a `Warning:` line for the change's output; logged once while it
   * stays held (a resync every few seconds would repeat it), again if it comes back.
   */
  private heldNotes(want: DesiredState, dryRun: boolean): string[] {
    const texts = heldDefaultRoutes(want).map((h) => heldDefaultRouteText(h, want.interfaces));
    if (!dryRun) {
      for (const t of texts) if (!this.heldWarned.has(t)) this.log?.warn(t);
      this.heldWarned = new Set(texts);
    }
    return texts.map((t) => `Warning: ${t}`);
  }

  /** Stop trusting the kept view (a link event, a failure elsewhere): the next sync reads. */
  forget(): void {
    this.trusted = undefined;
  }

  private viewFor(want: DesiredState): LinkView | undefined {
    const t = this.trusted;
    return t && t.ext === uplinksKey(want) && t.vpc === want.interfaces.vpc ? t.view : undefined;
  }

  private trust(want: DesiredState, view: LinkView): void {
    this.trusted = { ext: uplinksKey(want), vpc: want.interfaces.vpc, view };
  }

  /**
   * Gratuitous ARP (IPv4) or an unsolicited neighbour advertisement (IPv6) without holding the
   * command (the script blocked ~3 s per EIP): queued and sent a few at a time (a bulk change
   * may announce thousands of EIPs), each tool a child this process waits for — so it is reaped
   * even where PID 1 (`sleep infinity`) reaps nothing.
   */
  announce(ifname: string, ip: string): void {
    const key = `${ifname} ${ip}`;
    if (this.arpQueued.has(key)) return;
    this.arpQueued.add(key);
    this.arpQueue.push({ ifname, ip });
    this.schedulePump();
  }

  /**
   * Spawning a tool blocks the event loop for milliseconds: starting 8 announcements in one go
   * (every restart queues one per EIP) held the daemon's readiness and its requests for ~50 ms.
   * One process is started per turn of the loop, after what is already waiting.
   */
  private schedulePump(): void {
    if (this.arpPumpScheduled) return;
    this.arpPumpScheduled = true;
    setImmediate(() => {
      this.arpPumpScheduled = false;
      this.pumpArp();
    });
  }

  /** Resolves when every announcement queued so far has finished (an in-process run waits for it). */
  async settle(): Promise<void> {
    while (this.arpRunning > 0 || this.arpQueue.length > 0) await new Promise<void>((r) => this.arpIdle.push(r));
  }

  private readonly arpQueue: Array<{ ifname: string; ip: string }> = [];
  private readonly arpQueued = new Set<string>();
  private arpRunning = 0;
  private arpPumpScheduled = false;
  private arpIdle: Array<() => void> = [];

  private pumpArp(): void {
    if (this.arpRunning < ARP_PARALLELISM && this.arpQueue.length > 0) {
      const { ifname, ip } = this.arpQueue.shift() as { ifname: string; ip: string };
      this.arpQueued.delete(`${ifname} ${ip}`);
      this.arpRunning++;
      void this.exec
        .run({ ...announcement(ifname, ip), timeoutMs: ARP_TIMEOUT_MS })
        .then(
          (r) => {
            if (r.exitCode !== 0 || r.failedToStart) this.log?.debug({ ip, ifname, exitCode: r.exitCode, stderr: r.stderr.trim() }, 'announcement not sent');
          },
          (e: unknown) => this.log?.debug({ err: e, ip }, 'announcement not sent'),
        )
        .finally(() => {
          this.arpRunning--;
          this.schedulePump();
          if (this.arpRunning === 0 && this.arpQueue.length === 0) for (const r of this.arpIdle.splice(0)) r();
        });
      if (this.arpQueue.length > 0) this.schedulePump();
    }
  }

  async ensureUp(ifname: string): Promise<void> {
    await runChecked(this.exec, { file: 'ip', args: ['link', 'set', 'dev', ifname, 'up'] });
  }
}
