import { canonicalIp, isIp } from '../model/net.js';

/**
 * PURE: `conntrack` text output → typed records. The daemon reads
 * `conntrack -E -e NEW,DESTROY -o timestamp,extended,id` (events) and
 * `conntrack -L -o extended,id` (the table at start); both print one entry per line:
 *
 *   [1796044351.519127]	    [NEW] ipv4     2 tcp      6 120 SYN_SENT src=… dst=… sport=… dport=… [UNREPLIED] src=… … id=4219329350
 *   [1796044351.681118]	[DESTROY] ipv4     2 udp      17 29 src=… dst=… sport=… dport=… packets=1 bytes=29 [UNREPLIED] src=… packets=0 bytes=0 delta-time=0 id=…
 *
 * The first src/dst/sport/dport (and packets/bytes, present only with nf_conntrack_acct=1)
 * belong to the original direction, the second to the reply direction.
 */

export type FlowEventType = 'new' | 'destroy';

export interface Tuple {
  readonly src: string;
  readonly dst: string;
  /** Absent for protocols without ports (ICMP). */
  readonly sport?: number;
  readonly dport?: number;
}

export interface Counters {
  readonly packets: number;
  readonly bytes: number;
}

export interface ConntrackEntry {
  /** Undefined for a `conntrack -L` line. */
  readonly event?: FlowEventType;
  /** Seconds since the epoch, from `-o timestamp`; undefined without it. */
  readonly time?: number;
  readonly family: 4 | 6;
  readonly protocol: string;
  /** The layer-4 protocol number conntrack prints after the name (6 for tcp). */
  readonly protocolNumber?: number;
  /** The conntrack zone, printed only when not 0. */
  readonly zone?: number;
  readonly original: Tuple;
  readonly reply: Tuple;
  /** Both present only when conntrack accounting (nf_conntrack_acct) is on. */
  readonly originalCounters?: Counters;
  readonly replyCounters?: Counters;
  /** Seconds the connection lived (nf_conntrack_timestamp=1), on a DESTROY. */
  readonly durationS?: number;
  /** The kernel's id of the entry (`-o id`): pairs a DESTROY with its NEW. */
  readonly id?: number;
}

/** Decimal digits in s[from, to), or undefined: no regex, no slice. */
function digitsIn(s: string, from: number, to: number): number | undefined {
  if (from >= to) return undefined;
  let v = 0;
  for (let j = from; j < to; j++) {
    const c = s.charCodeAt(j) - 48;
    if (c < 0 || c > 9) return undefined;
    v = v * 10 + c;
  }
  return v;
}

/** Strict dotted quad (as isIpv4, without a regex): conntrack prints IPv4 no other way. */
function dottedQuad(s: string): boolean {
  let parts = 0;
  let len = 0;
  let v = 0;
  for (let j = 0; j <= s.length; j++) {
    const c = j === s.length ? 46 : s.charCodeAt(j);
    if (c === 46) {
      if (len === 0 || v > 255 || (len > 1 && s.charCodeAt(j - len) === 48)) return false;
      parts++;
      len = 0;
      v = 0;
    } else {
      const d = c - 48;
      if (d < 0 || d > 9 || ++len > 3) return false;
      v = v * 10 + d;
    }
  }
  return parts === 4;
}

/** The canonical text of an address from conntrack, or undefined when it is none. */
function address(s: string | undefined): string | undefined {
  if (s === undefined) return undefined;
  if (dottedQuad(s)) return s;
  return s.includes(':') && isIp(s) ? canonicalIp(s) : undefined;
}

/** Whether s[from, to) equals `word`. */
function is(s: string, from: number, to: number, word: string): boolean {
  return to - from === word.length && s.startsWith(word, from);
}

/** The keys natgw reads in each tuple direction. */
const SRC = 0;
const DST = 1;
const SPORT = 2;
const DPORT = 3;
const PACKETS = 4;
const BYTES = 5;

/** Which key (SRC … BYTES, or -1) the token s[from, eq) names: a length and first-letter switch, no slice. */
function keyOf(s: string, from: number, eq: number): number {
  switch (eq - from) {
    case 3:
      return s.startsWith('src', from) ? SRC : s.startsWith('dst', from) ? DST : -1;
    case 5:
      return s.startsWith('sport', from) ? SPORT : s.startsWith('dport', from) ? DPORT : s.startsWith('bytes', from) ? BYTES : -1;
    case 7:
      return s.startsWith('packets', from) ? PACKETS : -1;
    default:
      return -1;
  }
}

/**
 * PURE: one line → an entry, or undefined for anything else (summary lines, other events, garbage).
 * Called for every event of a connection burst, so it is one scan of the line by index: no
 * regex, no split, a slice only for the four addresses and the protocol.
 */
export function parseConntrackLine(line: string): ConntrackEntry | undefined {
  const len = line.length;
  let p = 0;
  // The current token is line[ts, te); nextToken() moves to the next one, false at the end.
  let ts = 0;
  let te = 0;
  const nextToken = (): boolean => {
    p = te;
    while (p < len && (line.charCodeAt(p) === 32 || line.charCodeAt(p) === 9)) p++;
    if (p >= len) return false;
    ts = p;
    while (p < len && line.charCodeAt(p) !== 32 && line.charCodeAt(p) !== 9) p++;
    te = p;
    return true;
  };
  if (!nextToken()) return undefined;
  let time: number | undefined;
  // `[1796044351.519127]`: from `-o timestamp`.
  if (line.charCodeAt(ts) === 91 && line.charCodeAt(te - 1) === 93 && te - ts > 2) {
    const c = line.charCodeAt(ts + 1) - 48;
    if (c >= 0 && c <= 9) {
      const v = Number(line.slice(ts + 1, te - 1));
      if (Number.isFinite(v)) {
        time = v;
        if (!nextToken()) return undefined;
      }
    }
  }
  let event: FlowEventType | undefined;
  if (is(line, ts, te, '[NEW]')) event = 'new';
  else if (is(line, ts, te, '[DESTROY]')) event = 'destroy';
  else if (is(line, ts, te, '[UPDATE]')) return undefined;
  if (event && !nextToken()) return undefined;
  // `-o extended` prefixes the layer-3 name and number; a plain `-L` line starts with the protocol.
  let v6 = false;
  if (is(line, ts, te, 'ipv4') || is(line, ts, te, 'ipv6')) {
    v6 = line.charCodeAt(te - 1) === 54;
    if (!nextToken() || digitsIn(line, ts, te) === undefined || !nextToken()) return undefined;
  }
  for (let j = ts; j < te; j++) {
    const c = line.charCodeAt(j);
    if (!((c >= 97 && c <= 122) || (c >= 48 && c <= 57))) return undefined;
  }
  const protocol = line.slice(ts, te);
  if (!nextToken()) return undefined;
  const protocolNumber = digitsIn(line, ts, te);
  if (protocolNumber === undefined || te >= len) return undefined;

  // [original, reply] × the keys above: the first value of each key per direction.
  const strs: (string | undefined)[] = [undefined, undefined, undefined, undefined];
  const nums: (number | undefined)[] = [undefined, undefined, undefined, undefined, undefined, undefined, undefined, undefined];
  let id: number | undefined;
  let durationS: number | undefined;
  let zone: number | undefined;
  let dir = 0;
  while (nextToken()) {
    const eq = line.indexOf('=', ts);
    if (eq <= ts || eq >= te) continue;
    const k = keyOf(line, ts, eq);
    if (k === SRC || k === DST) {
      if (k === SRC && dir === 0 && strs[0] !== undefined) dir = 1;
      const at = dir * 2 + k;
      strs[at] ??= line.slice(eq + 1, te);
    } else if (k > DST) {
      const at = dir * 4 + k - SPORT;
      nums[at] ??= digitsIn(line, eq + 1, te);
    } else if (is(line, ts, eq, 'delta-time')) {
      durationS = digitsIn(line, eq + 1, te);
    } else if (is(line, ts, eq, 'zone')) {
      zone = digitsIn(line, eq + 1, te);
    } else if (is(line, ts, eq, 'id')) {
      // The entry's id is the last `id=`: an ICMP tuple carries the echo id under the same name.
      id = digitsIn(line, eq + 1, te);
    }
  }
  const os = address(strs[0]);
  const od = address(strs[1]);
  const rs = address(strs[2]);
  const rd = address(strs[3]);
  if (os === undefined || od === undefined || rs === undefined || rd === undefined) return undefined;
  const original: { src: string; dst: string; sport?: number; dport?: number } = { src: os, dst: od };
  if (nums[0] !== undefined) original.sport = nums[0];
  if (nums[1] !== undefined) original.dport = nums[1];
  const reply: { src: string; dst: string; sport?: number; dport?: number } = { src: rs, dst: rd };
  if (nums[4] !== undefined) reply.sport = nums[4];
  if (nums[5] !== undefined) reply.dport = nums[5];
  const e: { -readonly [K in keyof ConntrackEntry]: ConntrackEntry[K] } = {
    family: v6 || os.includes(':') ? 6 : 4,
    protocol,
    protocolNumber,
    original,
    reply,
  };
  if (zone !== undefined) e.zone = zone;
  if (event) e.event = event;
  if (time !== undefined) e.time = time;
  const [op, ob, rp, rb] = [nums[2], nums[3], nums[6], nums[7]];
  if (op !== undefined && ob !== undefined && rp !== undefined && rb !== undefined) {
    e.originalCounters = { packets: op, bytes: ob };
    e.replyCounters = { packets: rp, bytes: rb };
  }
  if (durationS !== undefined) e.durationS = durationS;
  if (id !== undefined) e.id = id;
  return e;
}

/** Kernel conntrack statistics natgw exports (`conntrack -S`, summed over CPUs). */
export const CONNTRACK_STATS = [
  'found',
  'invalid',
  'insert',
  'insert_failed',
  'drop',
  'early_drop',
  'error',
  'search_restart',
  'clash_resolve',
  'chaintoolong',
] as const;
export type ConntrackStat = (typeof CONNTRACK_STATS)[number];

/** PURE: `conntrack -S` output (one `cpu=N key=value …` line per CPU) → each statistic summed over CPUs. */
export function parseConntrackStats(text: string): Map<ConntrackStat, number> {
  const sums = new Map<ConntrackStat, number>();
  for (const line of text.split('\n')) {
    if (!/^\s*cpu=\d+/.test(line)) continue;
    for (const m of line.matchAll(/\b([a-z_]+)=(\d+)\b/g)) {
      const k = m[1] as ConntrackStat;
      if ((CONNTRACK_STATS as readonly string[]).includes(k)) sums.set(k, (sums.get(k) ?? 0) + Number(m[2]));
    }
  }
  return sums;
}
