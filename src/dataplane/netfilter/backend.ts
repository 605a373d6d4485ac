import ipaddr from 'ipaddr.js';
import { prefixOf, type Dnat, type Fip, type Snat } from '../../model/rules.js';
import { familyOfValid, type Family } from '../../model/net.js';
import type { DesiredState } from '../../state/state.js';
import type { StateChange } from '../../state/change.js';
import type { NftTransaction } from './nft/transaction.js';
import { eipInterface, hasSecondaryUplinks, uplinkNames } from '../../model/uplinks.js';

/** What netfilter must hold for natgw: the NAT part of the desired state. */
export interface NatTables {
  readonly vpcIf: string;
  readonly extIf: string;
  /** EIP addresses: each gets a hairpin SNAT rule. */
  readonly eips: readonly string[];
  /** In rule order (descending prefix length). */
  readonly snats: readonly Snat[];
  readonly dnats: readonly Dnat[];
  readonly fips: readonly Fip[];
  /** Shared SNAT of TCP and UDP only into these source ports: this replica's slice (NATGW_SNAT_PORT_SLICE). */
  readonly snatPorts?: PortRange;
  /** Drop what conntrack finds invalid in forward and input, and on input a new UDP packet no socket takes: an active-active replica never answers a flow it holds no state of yet. */
  readonly dropInvalid?: boolean;
  /**
   * With dropInvalid: the peers (sync addresses) that get a copy of an invalid packet arriving
   * on the VPC or an external interface before it is dropped here. ECMP may send a packet of a
   * flow to this replica before conntrackd brought the flow's state (a SYN-ACK, the client's
   * first ACK; for UDP, whose early reply is a new flow, not an invalid one: a new UDP packet to
   * the replica that no socket takes); the replica that holds the state carries it. Never
   * packets from elsewhere (a copy from a peer is not copied on). At most `rate` packets per
   * second go to each peer.
   */
  readonly handOff?: { readonly peers: readonly string[]; readonly rate: number };
  /** Secondary uplinks (model/uplinks.ts): SNAT leaves by each too. Absent with one external interface. */
  readonly uplinks?: readonly string[];
  /** EIPs on a secondary uplink, by address: their SNAT rules match that interface. */
  readonly eipIf?: ReadonlyMap<string, string>;
}

export interface PortRange {
  readonly lo: number;
  readonly hi: number;
}

/** What a replica adds to the state's rules (from its configuration, the same at every sync). */
export type ReplicaRules = Pick<NatTables, 'snatPorts' | 'dropInvalid' | 'handOff'>;

/** `want` with a replica's rules; `want` itself where there are none. */
export const withReplicaRules = (want: NatTables, rules: ReplicaRules | undefined): NatTables => (rules ? { ...want, ...rules } : want);

/** The NAT part of the desired state, as it stands. */
export function natTablesOf(s: DesiredState): NatTables {
  return {
    vpcIf: s.interfaces.vpc,
    extIf: s.interfaces.ext,
    eips: s.eips.map((e) => e.address),
    snats: s.snats,
    dnats: s.dnats,
    fips: s.fips,
    ...uplinksOf(s),
  };
}

function uplinksOf(s: DesiredState): Pick<NatTables, 'uplinks' | 'eipIf'> {
  if (!hasSecondaryUplinks(s.interfaces)) return {};
  const eipIf = new Map(
    s.eips.flatMap((e) => (e.interface !== undefined && eipInterface(s.interfaces, e) !== s.interfaces.ext ? [[e.address, e.interface]] : [])),
  );
  return { uplinks: uplinkNames(s.interfaces).slice(1), eipIf };
}

/**
 * The IPv4/IPv6 split of both backends: the objects of one address family (an object's family
 * is its EIP's), each family's table rendered on its own (`ip`/`ip6` natgw; iptables/ip6tables).
 */
export function ofFamily(want: NatTables, family: Family): NatTables {
  const mine = (ip: string): boolean => familyOfValid(ip) === family;
  return {
    ...want,
    eips: want.eips.filter(mine),
    snats: want.snats.filter((s) => mine(s.eip)),
    dnats: want.dnats.filter((d) => mine(d.eip)),
    fips: want.fips.filter((f) => mine(f.eip)),
    ...(want.handOff ? { handOff: { ...want.handOff, peers: want.handOff.peers.filter(mine) } } : {}),
  };
}

/** The interfaces packets handed off to the peers may arrive on: the VPC's and every uplink. */
export const handOffInterfaces = (want: NatTables): string[] => [...new Set([want.vpcIf, want.extIf, ...(want.uplinks ?? [])])].sort();

/** Whether `want` holds an object of `family` (ofFamily without building it). */
export function hasFamily(want: NatTables, family: Family): boolean {
  const mine = (ip: string): boolean => familyOfValid(ip) === family;
  return want.eips.some(mine) || want.snats.some((s) => mine(s.eip)) || want.dnats.some((d) => mine(d.eip)) || want.fips.some((f) => mine(f.eip));
}

/**
 * The inverse, for adoption: each family's objects as read back, as one NatTables; null when no
 * family holds anything of natgw's. SNATs are merged longest prefix first (the state's order),
 * by Array#sort, which is stable: each family's kernel order stays among equal lengths. An
 * interface no rule names is '' (the adopter falls back to its configuration).
 */
export function joinFamilies(v4: NatTables | null, v6: NatTables | null): NatTables | null {
  const parts = [v4, v6].filter((p): p is NatTables => p !== null);
  if (parts.length === 0) return null;
  return {
    vpcIf: parts.find((p) => p.vpcIf)?.vpcIf ?? '',
    extIf: parts.find((p) => p.extIf)?.extIf ?? '',
    eips: parts.flatMap((p) => p.eips),
    snats: parts.flatMap((p) => p.snats).sort((a, b) => prefixOf(b.cidr) - prefixOf(a.cidr)),
    dnats: parts.flatMap((p) => p.dnats),
    fips: parts.flatMap((p) => p.fips),
  };
}

/**
 * Rules whose identities cannot overlap are put in a canonical order, so the kernel ends up
 * byte-identical whatever order the controller's redo sends them in. SNAT keeps its
 * semantic order (longest prefix first, then first come). Floating IPs sharing an internal IP
 * resolve to the lowest EIP for outbound traffic, again independent of arrival order.
 */
export function canonicalOrder(t: NatTables): NatTables {
  return {
    ...t,
    eips: sortedByAddress(t.eips, (e) => e),
    dnats: sortedByAddress(t.dnats, (d) => d.eip, byPortProto),
    fips: sortedByAddress(t.fips, (f) => f.eip),
  };
}

const byPortProto = (a: Dnat, b: Dnat): number => a.port - b.port || cmp(a.protocol, b.protocol);

/**
 * `list` in the order of its address keys (each computed once, not once per comparison), then
 * of `tie`: the order Array#sort gives with the composed comparator (both are stable).
 */
function sortedByKey<T>(list: readonly T[], keyOf: (t: T) => string, tie?: (a: T, b: T) => number): T[] {
  const keys = list.map(keyOf);
  const at = Array.from(list.keys());
  at.sort((i, j) => cmp(keys[i] as string, keys[j] as string) || (tie ? tie(list[i] as T, list[j] as T) : 0));
  return at.map((i) => list[i] as T);
}

/**
 * sortedByKey by address: when every address is IPv4, by its number (one per object, no key
 * string; the same order as the keys', IPv4 keys being the octets in order).
 */
function sortedByAddress<T>(list: readonly T[], addrOf: (t: T) => string, tie?: (a: T, b: T) => number): T[] {
  const nums = new Float64Array(list.length);
  for (let i = 0; i < list.length; i++) {
    const a = addrOf(list[i] as T);
    if (a.includes(':')) return sortedByKey(list, (t) => ipSortKey(addrOf(t)), tie);
    nums[i] = v4Number(a);
  }
  const at: number[] = [];
  for (let i = 0; i < list.length; i++) at.push(i);
  at.sort((i, j) => (nums[i] as number) - (nums[j] as number) || (tie ? tie(list[i] as T, list[j] as T) : 0));
  const out: T[] = [];
  for (let i = 0; i < at.length; i++) out.push(list[at[i] as number] as T);
  return out;
}

const cmp = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

/** Numeric address order (IPv4 before IPv6). */
export function compareIp(a: string, b: string): number {
  const ka = ipSortKey(a);
  const kb = ipSortKey(b);
  return ka < kb ? -1 : ka > kb ? 1 : 0;
}

function ipSortKey(ip: string): string {
  if (!ip.includes(':')) return v4SortKey(ip);
  return (
    '6' +
    ipaddr.IPv6.parse(ip)
      .toNormalizedString()
      .split(':')
      .map((h) => h.padStart(4, '0'))
      .join(':')
  );
}

export interface SyncReport {
  /** Objects added or removed to make the kernel match (0: it already matched). */
  readonly changes: number;
  /** The script that was (or, in a dry run, would be) applied; empty when nothing changed. */
  readonly script: string;
  /** SyncOptions.append ran in this sync's transaction. */
  readonly appended?: boolean;
}

/**
 * How a part of the dataplane learns what the kernel holds before it plans a change
 * (kube-proxy's model, DESIGN.md): `full` reads back what natgw owns, diffs and repairs;
 * `partial` trusts the view the part kept from its last successful apply or read-back and
 * renders only the change, reading nothing. A part with no trusted view reads, whatever the
 * mode. After a failed apply a part forgets its view, so the next sync is a full one.
 */
export type SyncMode = 'full' | 'partial';

export interface SyncOptions {
  readonly dryRun?: boolean;
  /** Default `full`. */
  readonly mode?: SyncMode;
  /**
   * Operations on another natgw table to run in the same transaction (the accounting sets):
   * honoured by the nftables backend, which then reports `appended`. A promise is awaited
   * beside the backend's own read-back (it may list the other table); undefined: nothing to append.
   */
  readonly append?: NftTransaction | PromiseLike<NftTransaction | undefined>;
  /** What the change did to the desired state since the last sync (change.ts): what a partial sync plans. */
  readonly change?: StateChange;
}

/**
 * A netfilter backend: renders NatTables for its kernel interface and applies the difference
 * to what it reads back, in one atomic transaction per table. It owns only its own objects.
 */
export interface NetfilterBackend {
  readonly kind: 'iptables' | 'nftables';
  /** The init guard's evidence (SPEC §2): the skeleton is in the kernel. */
  isInitialized(): Promise<boolean>;
  /** Make natgw's objects hold exactly `want`, skeleton included; repairs whatever drifted. */
  sync(want: NatTables, opts?: SyncOptions): Promise<SyncReport>;
  /** What natgw's objects hold now (adoption after a lost state file); null when it owns nothing. */
  readBack(): Promise<NatTables | null>;
  /** Drop the view kept from the last apply: the next sync reads the kernel back. */
  forget(): void;
  /**
   * Read what natgw owns without changing it, and keep a view when it owns nothing (a full sync
   * of a gateway not yet initialised): the first change after it then plans against that
   * instead of reading back.
   */
  observe?(): Promise<void>;
  /** Remove every object this backend owns (backend switch). */
  removeAll(): Promise<void>;
  /** The line get-iptables-version prints, e.g. `iptables v1.8.9 (legacy)`. */
  versionLine(): Promise<string>;
}

/**
 * An IPv4 address as a number ordered as its v4SortKey (octet by octet), nothing allocated.
 * Base 1000, not 256: an octet of three digits above 255 (tests build such addresses) still
 * orders as its key's character does.
 */
function v4Number(ip: string): number {
  let n = 0;
  let o = 0;
  let k = 0;
  for (let i = 0; i < ip.length; i++) {
    const c = ip.charCodeAt(i);
    if (c !== 46) o = o * 10 + c - 48;
    else if (++k === 4) break;
    else {
      n = n * 1000 + o;
      o = 0;
    }
  }
  n = n * 1000 + o;
  for (; k < 3; k++) n *= 1000;
  return n;
}

/**
 * '4' and the four octets as one character each: ordered as the addresses are, and built
 * without splitting, padding and joining (twenty thousand addresses at a full sync).
 */
function v4SortKey(ip: string): string {
  const o = [0, 0, 0, 0];
  let k = 0;
  for (let i = 0; i < ip.length && k < 4; i++) {
    const c = ip.charCodeAt(i);
    if (c === 46) k++;
    else o[k] = (o[k] as number) * 10 + c - 48;
  }
  return String.fromCharCode(52, o[0] as number, o[1] as number, o[2] as number, o[3] as number);
}
