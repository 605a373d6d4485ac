import {
  type Direction,
  type EipQos,
  type GwQos,
  CATCH_ALL_HANDLE,
  DEFAULT_CLASS,
  MAX_BURST_MB,
  burstBytes,
  burstSchema,
  canonicalDecimal,
  classRangeOf,
  eipQosKey,
  gwQosKey,
  qosDevice,
  rateBytesPerSecond,
  rateSchema,
} from '../../model/qos.js';
import { SystemError } from '../../model/errors.js';

/**
 * Pure parsers for what the kernel holds, from tc's text, whose layout has been stable for
 * years: iproute2 6.1 prints htb classes as text even under `-j`, and its u32 JSON repeats the
 * `match` key once per key, so a JSON parser would see only the last key of a filter. A device
 * is listed with `-d -raw`, which adds the raw buffer (burst) in scheduler ticks to a class.
 */

export interface TcQdisc {
  readonly dev: string;
  readonly kind: string;
  /** `1:`, `ffff:`, `8001:`, `0:`. */
  readonly handle: string;
  /** `root`, or the parent class id as tc prints it (`1:4495`, `ffff:fff1`). */
  readonly parent: string;
  /** htb only: the default class minor. */
  readonly defaultMinor?: number;
}

export interface TcClass {
  /** Major of the class id (1 for `1:4495`). */
  readonly major: number;
  readonly minor: number;
  /** `root` or the parent class id. */
  readonly parent: string;
  /** Bits per second, as tc printed them. */
  readonly rateBits?: number;
  readonly ceilBits?: number;
  /** Raw buffer in psched ticks (`-raw`): the exact burst, given the rate. */
  readonly bufferTicks?: number;
  readonly cbufferTicks?: number;
}

export interface U32Key {
  readonly value: number;
  readonly mask: number;
  readonly off: number;
}

export interface TcFilter {
  readonly parent?: string;
  readonly protocol: string;
  readonly pref: number;
  readonly kind: string;
  /** u32: the full handle as printed (`800::5`, a hash table `800:`); matchall: `0x…`. Absent on a priority's header line. */
  readonly fh?: string;
  /** u32: the node id of fh (absent on a hash table's line); matchall: its handle. */
  readonly node?: number;
  /** Target class, when the filter classifies. */
  readonly flowid?: { readonly major: number; readonly minor: number };
  readonly keys: readonly U32Key[];
  /** `mirred (Egress Redirect to device X)`. */
  readonly redirectTo?: string;
}

/** `ip -j link show` → whether each link is up, by name. */
export function parseLinks(json: string): Map<string, boolean> {
  let data: unknown;
  try {
    data = JSON.parse(json || '[]');
  } catch {
    return new Map();
  }
  if (!Array.isArray(data)) return new Map();
  return new Map(
    data.flatMap((l: { ifname?: unknown; flags?: unknown }) =>
      typeof l.ifname === 'string' ? [[l.ifname, Array.isArray(l.flags) && l.flags.includes('UP')] as const] : [],
    ),
  );
}

// ---------------------------------------------------------------------------------
// Qdiscs (`tc qdisc show`: every device, each line naming its `dev`)
// ---------------------------------------------------------------------------------

const QDISC_LINE = /^qdisc (\S+) ([0-9a-fA-F]+:)(?:\[[0-9a-fA-F]+\])? dev (\S+) (root|parent (\S+))/;

/** Throws on a qdisc line it cannot read: reading "no qdiscs" by mistake would make natgw replace roots it owns. */
export function parseQdiscs(text: string): TcQdisc[] {
  const out: TcQdisc[] = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith('qdisc ')) continue;
    const m = QDISC_LINE.exec(line);
    if (!m) throw new SystemError(`Error: tc qdisc show printed what natgw cannot read (unreadable qdisc line: ${line.trim()})`);
    const kind = m[1] ?? '';
    const def = kind === 'htb' ? /\sdefault (?:0x)?([0-9a-fA-F]+)\b/.exec(line)?.[1] : undefined;
    out.push({
      dev: m[3] ?? '',
      kind,
      handle: m[2] ?? '',
      parent: m[4] === 'root' ? 'root' : (m[5] ?? ''),
      ...(def !== undefined ? { defaultMinor: parseInt(def, 16) } : {}),
    });
  }
  return out;
}

// ---------------------------------------------------------------------------------
// Classes (`tc -d -raw class show dev D`)
// ---------------------------------------------------------------------------------

/** The units tc's sprint_rate prints (without `-iec`). */
const RATE_UNITS: Readonly<Record<string, number>> = { bit: 1, kbit: 1e3, mbit: 1e6, gbit: 1e9, tbit: 1e12 };

/** `500Kbit` → 500000 (bits per second). */
export function parseRate(s: string): number | undefined {
  const m = /^(\d+(?:\.\d+)?)([A-Za-z]+)$/.exec(s);
  if (!m) return undefined;
  const unit = RATE_UNITS[(m[2] ?? '').toLowerCase()];
  return unit === undefined ? undefined : Number(m[1]) * unit;
}

function parseClassId(s: string): { major: number; minor: number } | undefined {
  const m = /^([0-9a-fA-F]*):([0-9a-fA-F]*)$/.exec(s);
  if (!m) return undefined;
  return { major: parseInt(m[1] || '0', 16), minor: parseInt(m[2] || '0', 16) };
}

/** `-raw` appends raw values in brackets (`buffer [0fa00000]`); the words are read without them. */
const stripRaw = (s: string): string => s.replace(/\[[0-9a-fA-F]+\]/g, '');

export function parseClasses(text: string): TcClass[] {
  const out: TcClass[] = [];
  for (const raw of text.split('\n')) {
    const line = stripRaw(raw);
    const m = /^class \S+ (\S+) (root|parent (\S+))/.exec(line);
    if (!m) continue;
    const id = parseClassId(m[1] ?? '');
    if (!id) continue;
    const word = (k: string): string | undefined => new RegExp(`(?:^|\\s)${k} (\\S+)`).exec(line)?.[1];
    // `-raw` prints the buffers as `buffer [0fa00000] cbuffer [0fa00000]`.
    const ticks = (k: string): number | undefined => {
      const t = new RegExp(`(?:^|\\s)${k} \\[([0-9a-fA-F]+)\\]`).exec(raw)?.[1];
      return t === undefined ? undefined : parseInt(t, 16);
    };
    out.push({
      major: id.major,
      minor: id.minor,
      parent: m[2] === 'root' ? 'root' : (m[3] ?? ''),
      rateBits: parseRate(word('rate') ?? ''),
      ceilBits: parseRate(word('ceil') ?? ''),
      bufferTicks: ticks('buffer'),
      cbufferTicks: ticks('cbuffer'),
    });
  }
  return out;
}

// ---------------------------------------------------------------------------------
// Filters (`tc filter show dev D parent P`)
// ---------------------------------------------------------------------------------

type MutableFilter = { -readonly [K in keyof TcFilter]: TcFilter[K] } & { keys: U32Key[] };

function parseFilterLine(line: string): MutableFilter | undefined {
  // tc_filter.c print_filter names the parent unless `show` was given that same parent: `parent X`,
  // or `root`/`ingress`/`egress` for the special ones (clsact's hooks are ffff:fff2 and ffff:fff3).
  const m = /^filter (?:(?:parent (\S+)|(root|ingress|egress)) )?protocol (\S+) pref (\d+) (\S+)/.exec(line);
  if (!m) return undefined;
  const f: MutableFilter = { protocol: m[3] ?? '', pref: Number(m[4]), kind: m[5] ?? '', keys: [] };
  const parent = m[1] ?? { root: 'root', ingress: 'ffff:fff2', egress: 'ffff:fff3' }[m[2] ?? ''];
  if (parent) f.parent = parent;
  const fh = /\bfh ([0-9a-f]+:[0-9a-f]*:?[0-9a-f]*)/.exec(line)?.[1];
  if (fh) {
    f.fh = fh;
    const node = fh.split(':')[2];
    if (node) f.node = parseInt(node, 16);
  }
  const handle = /\bhandle (0x[0-9a-fA-F]+|\d+)\b/.exec(line)?.[1];
  if (handle && f.kind !== 'u32') {
    f.fh = handle;
    f.node = Number(handle);
  }
  const flow = /\bflowid ([0-9a-fA-F]*:[0-9a-fA-F]*)/.exec(line)?.[1] ?? /\bclassid ([0-9a-fA-F]*:[0-9a-fA-F]*)/.exec(line)?.[1];
  const id = flow ? parseClassId(flow) : undefined;
  if (id) f.flowid = id;
  return f;
}

export function parseFilters(text: string): TcFilter[] {
  const out: MutableFilter[] = [];
  let cur: MutableFilter | undefined;
  for (const line of text.split('\n')) {
    if (line.startsWith('filter ')) {
      cur = parseFilterLine(line);
      if (cur) out.push(cur);
      continue;
    }
    // A filter's own lines are indented; anything else (a qdisc or class of a batch listing) ends it.
    if (!/^\s/.test(line)) cur = undefined;
    if (!cur) continue;
    const key = /^\s+match ([0-9a-fA-F]{1,8})\/([0-9a-fA-F]{1,8}) at (-?\d+)/.exec(line);
    if (key) {
      cur.keys.push({ value: parseInt(key[1] ?? '0', 16) >>> 0, mask: parseInt(key[2] ?? '0', 16) >>> 0, off: Number(key[3]) });
      continue;
    }
    const redirect = /Redirect to device (\S+?)\)/.exec(line);
    if (redirect?.[1]) cur.redirectTo = redirect[1];
  }
  return out;
}

// ---------------------------------------------------------------------------------
// One device's listing (`tc -d -raw -batch -`)
// ---------------------------------------------------------------------------------

export interface DeviceListing extends DeviceTc {
  /** Filters under the ingress qdisc (`parent ffff:`). */
  readonly ingress: readonly TcFilter[];
}

/**
 * The lines of one `tc -d -raw -batch -` that lists a device: its classes and root filters, then
 * (`ingress`) its ingress filters. The listings are told apart by their lines, not by where they
 * stand: each line starts with its kind (`class`, `filter`); the root filters are listed without
 * a parent, so tc names each one's parent (`filter parent 1: …`), and the ingress listing, given
 * `parent ffff:`, is the only one whose lines name none (or a clsact hook).
 */
export function deviceListingScript(dev: string, ingress: boolean): string {
  const lines = [`class show dev ${dev}`, `filter show dev ${dev}`];
  if (ingress) lines.push(`filter show dev ${dev} parent ffff:`);
  return `${lines.join('\n')}\n`;
}

export function parseDeviceListing(text: string): DeviceListing {
  const filters = parseFilters(text);
  return {
    classes: parseClasses(text),
    filters: filters.filter((f) => f.parent === '1:'),
    ingress: filters.filter((f) => f.parent === undefined || f.parent.startsWith('ffff:')),
  };
}

/** The filters that classify (not a priority's header or a u32 hash-table line). */
export const classifyingFilters = (fs: readonly TcFilter[]): TcFilter[] => fs.filter((f) => f.node !== undefined);

// ---------------------------------------------------------------------------------
// Matches: u32 keys → natgw's match forms (render.ts matchText writes them)
// ---------------------------------------------------------------------------------

const IP_SRC_OFF = 12;
const IP_DST_OFF = 16;

export type FilterMatch = { readonly kind: 'ip'; readonly dir: 'src' | 'dst'; readonly cidr: string } | { readonly kind: 'all' };

function prefixMask(len: number): number {
  return len === 0 ? 0 : (0xffffffff << (32 - len)) >>> 0;
}

const intToIp = (n: number): string => [24, 16, 8, 0].map((s) => (n >>> s) & 0xff).join('.');

/** The match a filter's keys express, if it is one natgw writes. */
export function keysToMatch(keys: readonly U32Key[]): FilterMatch | undefined {
  if (keys.length !== 1) return undefined;
  const k = keys[0]!;
  if (k.off === 0 && k.mask === 0 && k.value === 0) return { kind: 'all' };
  if (k.off !== IP_SRC_OFF && k.off !== IP_DST_OFF) return undefined;
  // A prefix mask is its leading ones and nothing else.
  const len = Math.clz32(~k.mask);
  if (prefixMask(len) !== k.mask) return undefined;
  return { kind: 'ip', dir: k.off === IP_SRC_OFF ? 'src' : 'dst', cidr: `${intToIp(k.value & k.mask)}/${len}` };
}

/** A classifying filter in natgw's terms, the terms render.ts writes filters in (filterWords). */
export interface FilterSpec {
  readonly kind: 'u32' | 'matchall';
  /** The u32 node id or the matchall handle. */
  readonly handle: number;
  readonly match: FilterMatch;
  /** The class it sends to, under `1:`. */
  readonly minor: number;
}

/** A filter read back in natgw's terms, where it is one natgw could have written. */
export function filterSpec(f: TcFilter): FilterSpec | undefined {
  const match: FilterMatch | undefined = f.kind === 'matchall' ? { kind: 'all' } : f.kind === 'u32' ? keysToMatch(f.keys) : undefined;
  if (match === undefined || f.node === undefined || f.flowid?.major !== 1) return undefined;
  return { kind: f.kind === 'matchall' ? 'matchall' : 'u32', handle: f.node, match, minor: f.flowid.minor };
}

// ---------------------------------------------------------------------------------
// Rates and bursts: the kernel's numbers ⇄ natgw's decimals
// ---------------------------------------------------------------------------------

/**
 * Scheduler ticks per microsecond, from /proc/net/psched (t2us/us2t = 1000/64 since
 * Linux 2.6.24). tc stores a burst as the time the class's rate needs to send it.
 */
export const TICKS_PER_USEC = 1000 / 64;

/** The buffer tc computes for a burst at a rate (tc_calc_xmittime: µs truncated to u32, then ticks). */
export function expectedTicks(rateBytes: number, burst: number): number {
  const usec = Math.floor((1e6 * burst) / rateBytes);
  return Math.floor(usec * TICKS_PER_USEC);
}

/**
 * The longest buffer tc can program: it turns µs into ticks in 32 bits (tc_core_time2tick),
 * so a longer one wraps around to an arbitrary value (0.5 Mbit/s with a 4095 MB burst came
 * out as a 9 MB burst).
 */
export const MAX_BUFFER_USEC = Math.floor(0xffffffff / TICKS_PER_USEC);

/** The largest burst in bytes whose buffer at `rateBytes` still fits in those 32 bits. */
export function maxBurstBytes(rateBytes: number): number {
  let b = Math.floor((MAX_BUFFER_USEC * rateBytes) / 1e6);
  while (b > 1 && Math.floor((1e6 * b) / rateBytes) > MAX_BUFFER_USEC) b--;
  return Math.max(b, 1);
}

/**
 * The burst in bytes natgw gives tc for a class: round(burst MB × 1048576) (SPEC §2 QoS),
 * capped at what the kernel can hold at the class's rate (see MAX_BUFFER_USEC).
 */
export function programmedBurstBytes(mbit: string, mb: string): number {
  return Math.min(burstBytes(mb), maxBurstBytes(rateBytesPerSecond(mbit)));
}

/** A positive decimal with at most `sig` significant digits, never in exponent form. */
export function formatDecimal(n: number, sig = 6): string {
  if (!(n > 0)) return '0';
  const digits = Math.max(0, sig - 1 - Math.floor(Math.log10(n)));
  return canonicalDecimal(n.toFixed(Math.min(digits, 20)));
}

/**
 * The kernel class's rate in Mbit/s and burst in MB, as natgw's decimals (adoption). The
 * burst is the shortest decimal that, at the adopted rate, programs exactly the buffer the
 * kernel holds, so that syncing the adopted rule changes nothing (a rounded reading such as
 * 0.99882 for 1 MB at 9999 Mbit/s would be one µs short, and the class rewritten).
 */
export function classShaping(c: TcClass): { rate: string; burst: string } | undefined {
  if (c.rateBits === undefined || c.rateBits <= 0) return undefined;
  const rate = formatDecimal(c.rateBits / 1e6, 9);
  const rateBytes = rateBytesPerSecond(rate);
  // Only values the rule schema accepts: an adopted state is validated as a whole.
  if (!rateSchema.safeParse(rate).success) return undefined;
  const burst = c.bufferTicks === undefined ? undefined : burstForTicks(c.bufferTicks, rateBytes);
  if (burst === undefined || !burstSchema.safeParse(burst).success) return undefined;
  return { rate, burst };
}

function burstForTicks(ticks: number, rateBytes: number): string {
  const programs = (mb: string): boolean =>
    burstSchema.safeParse(mb).success && expectedTicks(rateBytes, Math.min(burstBytes(mb), maxBurstBytes(rateBytes))) === ticks;
  // tc truncates to whole µs, then ticks: the buffer names one µs, and the bytes lie within it.
  const usec = Math.ceil(ticks / TICKS_PER_USEC);
  const mid = Math.max(1, ((usec + 0.5) * rateBytes) / 1e6) / 1048576;
  for (let sig = 1; sig <= 12; sig++) {
    const mb = formatDecimal(Math.min(mid, MAX_BURST_MB), sig);
    if (programs(mb)) return mb;
  }
  // Not a buffer natgw would program (another tool's, or one wrapped by an older tc call): its nearest reading.
  return formatDecimal(Math.max(((ticks / TICKS_PER_USEC) * rateBytes) / 1e6, 1) / 1048576, 5);
}

// ---------------------------------------------------------------------------------
// Adoption: rules back from the kernel (the state file is gone)
// ---------------------------------------------------------------------------------

export interface DeviceTc {
  readonly classes: readonly TcClass[];
  /** Filters under parent `1:`. */
  readonly filters: readonly TcFilter[];
}

/**
 * Rebuild natgw's rules from what the kernel holds. EIP rules: a /32 u32 match into an
 * EIP-range class on one of the `uplinks` (src) or on its IFB (dst). Gateway rules: a match
 * into a gateway-range class (u32) or a catch-all into a matchall-range class, on an uplink or
 * one of `devs` (egress) or its IFB (ingress). Anything else on those devices is not natgw's pattern
 * and is left out (sync removes it from natgw's own qdisc).
 */
export function rulesFromKernel(uplinks: readonly string[], devs: readonly string[], tc: ReadonlyMap<string, DeviceTc>): { eipQos: EipQos[]; qos: GwQos[] } {
  const eipQos = new Map<string, EipQos>();
  const qos = new Map<string, GwQos>();
  for (const dev of new Set([...uplinks, ...devs])) {
    for (const direction of ['egress', 'ingress'] as const) {
      const d = tc.get(qosDevice(direction, dev));
      const classes = new Map((d?.classes ?? []).filter((c) => c.major === 1).map((c) => [c.minor, c]));
      for (const f of classifyingFilters(d?.filters ?? [])) {
        const spec = filterSpec(f);
        const cls = spec && classes.get(spec.minor);
        const shaping = cls && classShaping(cls);
        const rule = spec && shaping && ruleOf(direction, dev, uplinks.includes(dev), f.pref, spec, shaping);
        // The first filter of an identity names it (a state holds each identity once).
        if (rule && 'ip' in rule) eipQos.set(eipQosKey(rule), eipQos.get(eipQosKey(rule)) ?? rule);
        else if (rule) qos.set(gwQosKey(rule), qos.get(gwQosKey(rule)) ?? rule);
      }
    }
  }
  return { eipQos: [...eipQos.values()], qos: [...qos.values()] };
}

/** The rule a filter into a class with `shaping` expresses on `dev` (or its IFB), if it is natgw's pattern. */
function ruleOf(
  direction: Direction,
  dev: string,
  onUplink: boolean,
  priority: number,
  spec: FilterSpec,
  shaping: { rate: string; burst: string },
): EipQos | GwQos | undefined {
  const { match } = spec;
  const ids = { classId: spec.minor, ...(spec.handle >= 1 && spec.handle <= CATCH_ALL_HANDLE ? { handle: spec.handle } : {}) };
  const range = classRangeOf(spec.minor);
  if (range === 'eip') {
    const own = match.kind === 'ip' && match.dir === (direction === 'egress' ? 'src' : 'dst') && match.cidr.endsWith('/32');
    return onUplink && spec.kind === 'u32' && own ? { direction, ip: match.cidr.slice(0, -3), priority, ...shaping, ...ids } : undefined;
  }
  const base = { direction, dev, priority, ...shaping, ...ids };
  if (range === 'matchall' && match.kind === 'all') return { ...base, classifier: 'matchall', matchType: '', matchDirection: '', cidr: '' };
  if (range === 'gw' && match.kind === 'ip') return { ...base, classifier: 'u32', matchType: 'ip', matchDirection: match.dir, cidr: match.cidr };
  return undefined;
}

/** Devices natgw (or the script before it) shapes: a root htb `1:` whose default class is 0x9999, the signature of this layout. */
export const shapedDevices = (qdiscs: readonly TcQdisc[]): string[] =>
  qdiscs.filter((q) => q.parent === 'root' && q.kind === 'htb' && q.handle === '1:' && q.defaultMinor === DEFAULT_CLASS).map((q) => q.dev);
