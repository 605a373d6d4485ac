import { canonicalIp, isIp } from './net.js';

/**
 * PURE: one entry line of `conntrack` text output → a typed record. The same line shape comes
 * from the event follower (`conntrack -E -o timestamp,extended,id`), listings (`conntrack -L`,
 * with or without `-o extended,id`) and the kernel's /proc/net/nf_conntrack:
 *
 *   [1796044351.519127]	    [NEW] ipv4     2 tcp      6 120 SYN_SENT src=… dst=… sport=… dport=… [UNREPLIED] src=… … id=4219329350
 *   [1796044351.681118]	[DESTROY] ipv4     2 udp      17 29 src=… dst=… sport=… dport=… packets=1 bytes=29 [UNREPLIED] src=… packets=0 bytes=0 delta-time=0 id=…
 *   tcp      6 431999 ESTABLISHED src=… dst=… sport=… dport=… src=… dst=… sport=… dport=… [ASSURED] mark=0 use=1
 *
 * The first src/dst/sport/dport (and packets/bytes, present only with nf_conntrack_acct=1)
 * belong to the original direction, the second to the reply direction.
 */

type FlowEventType = 'new' | 'destroy';

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
  /** Undefined for a listing's line. */
  readonly event?: FlowEventType;
  /** Seconds since the epoch, from `-o timestamp`; undefined without it. */
  readonly time?: number;
  readonly family: 4 | 6;
  readonly protocol: string;
  /** The layer-4 protocol number conntrack prints after the name (6 for tcp). */
  readonly protocolNumber: number;
  /** The conntrack zone, printed only when not 0. */
  readonly zone?: number;
  readonly original: Tuple;
  readonly reply: Tuple;
  /** ICMP and ICMPv6: the original direction's type, code and echo id (what `conntrack -D` needs to name it). */
  readonly icmp?: { readonly type: number; readonly code: number; readonly id: number };
  /** Both present only when conntrack accounting (nf_conntrack_acct) is on. */
  readonly originalCounters?: Counters;
  readonly replyCounters?: Counters;
  /** Seconds the connection lived (nf_conntrack_timestamp=1), on a DESTROY. */
  readonly durationS?: number;
  /** The kernel's id of the entry (`-o id`): pairs a DESTROY with its NEW. */
  readonly id?: number;
}

const EVENTS: Record<string, 'new' | 'destroy' | 'skip'> = { '[NEW]': 'new', '[DESTROY]': 'destroy', '[UPDATE]': 'skip' };
const TUPLE_KEYS = new Set(['src', 'dst', 'sport', 'dport', 'packets', 'bytes', 'type', 'code']);
const num = (s: string | undefined): number | undefined => (s !== undefined && /^\d+$/.test(s) ? Number(s) : undefined);
const address = (s: string | undefined): string | undefined => (s !== undefined && isIp(s) ? canonicalIp(s) : undefined);

function tupleOf(t: Record<string, string>): Tuple | undefined {
  const src = address(t.src);
  const dst = address(t.dst);
  if (src === undefined || dst === undefined) return undefined;
  const sport = num(t.sport);
  const dport = num(t.dport);
  return { src, dst, ...(sport !== undefined ? { sport } : {}), ...(dport !== undefined ? { dport } : {}) };
}

/**
 * PURE: one line → an entry, or undefined for anything else (summary lines, UPDATE events,
 * garbage, a line without both tuples). Numbers are decimal digits only; addresses are canonicalised.
 */
export function parseConntrackLine(line: string): ConntrackEntry | undefined {
  const words = line.trim().split(/\s+/);
  let i = 0;
  const stamp = /^\[(\d+(?:\.\d+)?)\]$/.exec(words[0] ?? '');
  const time = stamp ? Number(stamp[1]) : undefined;
  if (stamp) i++;
  const event = EVENTS[words[i] ?? ''];
  if (event === 'skip') return undefined;
  if (event) i++;
  let v6 = false;
  if (words[i] === 'ipv4' || words[i] === 'ipv6') {
    v6 = words[i] === 'ipv6';
    if (num(words[i + 1]) === undefined) return undefined;
    i += 2;
  }
  const protocol = words[i] ?? '';
  const protocolNumber = num(words[i + 1]);
  if (!/^[a-z0-9]+$/.test(protocol) || protocolNumber === undefined) return undefined;
  const dirs: Record<string, string>[] = [{}, {}];
  let dir = 0;
  let id: number | undefined;
  let durationS: number | undefined;
  let zone: number | undefined;
  for (const w of words.slice(i + 2)) {
    const eq = w.indexOf('=');
    if (eq <= 0) continue;
    const k = w.slice(0, eq);
    const v = w.slice(eq + 1);
    // Each tuple starts with src=; a third one (a helper's master tuple) is not read.
    if (k === 'src' && dirs[0]!.src !== undefined) dir = 1;
    const t = dirs[dir]!;
    if (TUPLE_KEYS.has(k)) t[k] ??= v;
    else if (k === 'delta-time') durationS = num(v);
    else if (k === 'zone') zone = num(v);
    // An ICMP tuple's echo id follows its type under the same name as the entry's id, printed last.
    else if (k === 'id' && t.type !== undefined && t.id === undefined) t.id = v;
    else if (k === 'id') id = num(v);
  }
  const [o, r] = dirs as [Record<string, string>, Record<string, string>];
  const original = tupleOf(o);
  const reply = tupleOf(r);
  if (!original || !reply) return undefined;
  const [op, ob, rp, rb] = [num(o.packets), num(o.bytes), num(r.packets), num(r.bytes)];
  const counted = op !== undefined && ob !== undefined && rp !== undefined && rb !== undefined;
  const [type, code, echo] = [num(o.type), num(o.code), num(o.id)];
  return {
    ...(event ? { event } : {}),
    ...(time !== undefined ? { time } : {}),
    family: v6 || original.src.includes(':') ? 6 : 4,
    protocol,
    protocolNumber,
    ...(zone !== undefined ? { zone } : {}),
    original,
    reply,
    ...(type !== undefined && code !== undefined && echo !== undefined ? { icmp: { type, code, id: echo } } : {}),
    ...(counted ? { originalCounters: { packets: op, bytes: ob }, replyCounters: { packets: rp, bytes: rb } } : {}),
    ...(durationS !== undefined ? { durationS } : {}),
    ...(id !== undefined ? { id } : {}),
  };
}

/** PURE: conntrack's output → the entry of each line that is one (summary lines and the like are skipped). */
export function parseConntrackLines(text: string): ConntrackEntry[] {
  const entries: ConntrackEntry[] = [];
  for (const line of text.split('\n')) {
    const e = parseConntrackLine(line);
    if (e) entries.push(e);
  }
  return entries;
}
