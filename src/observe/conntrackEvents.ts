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

const num = (s: string | undefined): number | undefined => {
  if (s === undefined || !/^\d+$/.test(s)) return undefined;
  return Number(s);
};

/** PURE: one line → an entry, or undefined for anything else (summary lines, other events, garbage). */
export function parseConntrackLine(line: string): ConntrackEntry | undefined {
  let rest = line.trim();
  let time: number | undefined;
  const ts = /^\[(\d+)\.(\d+)\]\s*/.exec(rest);
  if (ts) {
    time = Number(`${ts[1]}.${ts[2]}`);
    rest = rest.slice(ts[0].length);
  }
  let event: FlowEventType | undefined;
  const ev = /^\[(NEW|DESTROY|UPDATE)\]\s*/.exec(rest);
  if (ev) {
    if (ev[1] === 'UPDATE') return undefined;
    event = ev[1] === 'NEW' ? 'new' : 'destroy';
    rest = rest.slice(ev[0].length);
  }
  // `-o extended` prefixes the layer-3 name and number; a plain `-L` line starts with the protocol.
  const head = /^(?:(ipv4|ipv6)\s+\d+\s+)?([a-z0-9]+)\s+\d+\s/.exec(rest);
  if (!head) return undefined;
  const protocol = head[2]!;
  const tuples: Record<string, string>[] = [{}, {}];
  let dir = 0;
  let id: number | undefined;
  let durationS: number | undefined;
  for (const tok of rest.slice(head[0].length).split(/\s+/)) {
    const eq = tok.indexOf('=');
    if (eq <= 0) continue;
    const k = tok.slice(0, eq);
    const v = tok.slice(eq + 1);
    if (k === 'src' && tuples[dir]!.src !== undefined) dir = 1;
    if (k === 'delta-time') durationS = num(v);
    else if (['src', 'dst', 'sport', 'dport', 'packets', 'bytes'].includes(k) && tuples[dir]![k] === undefined) tuples[dir]![k] = v;
    // The entry's id is the last `id=`: an ICMP tuple carries the echo id under the same name.
    else if (k === 'id') id = num(v);
  }
  const [o, r] = tuples as [Record<string, string>, Record<string, string>];
  if (!o.src || !o.dst || !r.src || !r.dst || !isIp(o.src) || !isIp(o.dst) || !isIp(r.src) || !isIp(r.dst)) return undefined;
  const tuple = (t: Record<string, string>): Tuple => {
    const sport = num(t.sport);
    const dport = num(t.dport);
    return { src: canonicalIp(t.src!), dst: canonicalIp(t.dst!), ...(sport !== undefined ? { sport } : {}), ...(dport !== undefined ? { dport } : {}) };
  };
  const counters = (t: Record<string, string>): Counters | undefined => {
    const packets = num(t.packets);
    const bytes = num(t.bytes);
    return packets !== undefined && bytes !== undefined ? { packets, bytes } : undefined;
  };
  const oc = counters(o);
  const rc = counters(r);
  const family = head[1] === 'ipv6' || o.src.includes(':') ? 6 : 4;
  return {
    ...(event ? { event } : {}),
    ...(time !== undefined ? { time } : {}),
    family,
    protocol,
    original: tuple(o),
    reply: tuple(r),
    ...(oc && rc ? { originalCounters: oc, replyCounters: rc } : {}),
    ...(durationS !== undefined ? { durationS } : {}),
    ...(id !== undefined ? { id } : {}),
  };
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
