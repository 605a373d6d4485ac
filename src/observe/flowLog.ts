import { createWriteStream } from 'node:fs';
import type { ConntrackEntry, Counters, Tuple } from '../model/conntrackLine.js';
import { translatedOf, type FlowClass } from './classify.js';

const pair = (o: Counters | undefined, r: Counters | undefined, k: keyof Counters) => (o && r ? { original: o[k], reply: r[k] } : undefined);

/**
 * PURE: a classified conntrack event → its flow line (JSON; `type: "flow"` tells it apart from
 * the daemon's own log on stdout). `original` is the connection as it left its sender,
 * `translated` the same direction after natgw's translation; an end line carries packets and
 * bytes (original: sender → receiver, and reply) when conntrack accounting is on.
 */
export function flowRecord(e: ConntrackEntry, c: FlowClass, nowS: number) {
  const end = e.event === 'destroy';
  const packets = end ? pair(e.originalCounters, e.replyCounters, 'packets') : undefined;
  const bytes = end ? pair(e.originalCounters, e.replyCounters, 'bytes') : undefined;
  return {
    type: 'flow',
    msg: 'flow',
    event: end ? 'end' : 'start',
    time: new Date((e.time ?? nowS) * 1000).toISOString(),
    ...(e.id !== undefined ? { id: e.id } : {}),
    kind: c.kind,
    eip: c.eip,
    protocol: e.protocol,
    original: e.original,
    translated: translatedOf(e.reply),
    ...(packets ? { packets } : {}),
    ...(bytes ? { bytes } : {}),
    ...(end && e.durationS !== undefined ? { durationS: e.durationS } : {}),
  };
}

export interface FlowIdentity {
  readonly namespace: string;
  readonly name: string;
  readonly pod: string;
  readonly node: string;
}

const KUBE_OVN_PROTOCOLS: Record<string, string> = { tcp: 'tcp', udp: 'udp', sctp: 'sctp', icmp: 'icmp', icmpv6: 'icmpv6' };

// A port of 0 is left out, as Go's omitempty does for the observer's uint16.
const kubeOvnTuple = (t: Tuple) => ({
  sourceIP: t.src,
  ...(t.sport ? { sourcePort: t.sport } : {}),
  destinationIP: t.dst,
  ...(t.dport ? { destinationPort: t.dport } : {}),
});

/**
 * PURE: a classified conntrack event → its line in the `kube-ovn` schema: a line as Kube-OVN's VPC egress gateway observer writes it (Kube-OVN
 * #7116, `pkg/vegobserver/flow.go`, schemaVersion v1), field for field, so a pipeline built for
 * that observer reads natgw's lines unchanged. Names and types follow its JSON: ports are
 * omitted when 0 (ICMP), `counters` only when the kernel accounts bytes (an end line with
 * nf_conntrack_acct=1), `natType` the sorted translations seen in the tuples.
 */
export function kubeOvnFlowRecord(e: ConntrackEntry, id: FlowIdentity, nowS: number) {
  const original = e.original;
  const translated = translatedOf(e.reply);
  const natType: ('dnat' | 'snat')[] = [];
  if (original.dst !== translated.dst || original.dport !== translated.dport) natType.push('dnat');
  if (original.src !== translated.src || original.sport !== translated.sport) natType.push('snat');
  const o = e.originalCounters;
  const r = e.replyCounters;
  // The observer writes counters when any is non-zero (accounting on), which only an end line carries.
  const counted = o && r && (o.packets || o.bytes || r.packets || r.bytes);
  return {
    schemaVersion: 'v1',
    timestamp: new Date((e.time ?? nowS) * 1000).toISOString(),
    event: e.event === 'destroy' ? 'end' : 'start',
    conntrackID: e.id ?? 0,
    zone: e.zone ?? 0,
    namespace: id.namespace,
    name: id.name,
    pod: id.pod,
    node: id.node,
    addressFamily: e.family === 6 ? 'ipv6' : 'ipv4',
    protocol: KUBE_OVN_PROTOCOLS[e.protocol] ?? 'other',
    protocolNumber: e.protocolNumber,
    natType,
    original: kubeOvnTuple(original),
    translated: kubeOvnTuple(translated),
    ...(counted ? { counters: { originalPackets: o.packets, originalBytes: o.bytes, replyPackets: r.packets, replyBytes: r.bytes } } : {}),
  };
}

export interface FlowSink {
  /** False when the line was dropped (the output cannot keep up). */
  write(line: string): boolean;
  close(): Promise<void>;
}

/**
 * stdout through a stream of its own on fd 1: its writes run off the event loop (process.stdout
 * writes to a pipe synchronously and would stall commands behind a slow reader), and lines
 * beyond what the pipe has taken (`maxPendingBytes`) are dropped, never buffered without bound.
 */
export function stdoutSink(maxPendingBytes = 4 * 1024 * 1024): FlowSink {
  const out = createWriteStream('', { fd: 1, autoClose: false });
  out.on('error', () => undefined);
  return {
    write(line) {
      if (out.writableLength > maxPendingBytes) return false;
      out.write(`${line}\n`);
      return true;
    },
    close: () => new Promise<void>((resolve) => out.end(() => resolve())),
  };
}

export interface FlowLogOptions {
  readonly sink: FlowSink;
  readonly ratePerS: number;
  readonly burst: number;
  /** Called for every line not written: rate limit or a full output. */
  readonly onDrop?: (reason: 'rate' | 'backlog') => void;
  readonly onWrite?: () => void;
  /** Lines in the fields of Kube-OVN's egress gateway observer, with this identity; natgw's own fields unless set. */
  readonly kubeOvn?: FlowIdentity;
  /** The clock of the rate limit, in milliseconds (tests). */
  readonly now?: () => number;
}

/**
 * Rate-limited flow lines to one sink. The limit is a token bucket: `burst` lines at once,
 * refilled at `ratePerS` per second; lines above it are dropped and counted rather than queued,
 * so a connection storm costs no memory.
 */
export class FlowLog {
  private tokens: number;
  private last: number;
  private readonly now: () => number;

  constructor(private readonly opts: FlowLogOptions) {
    this.now = opts.now ?? (() => performance.now());
    this.tokens = opts.burst;
    this.last = this.now();
  }

  /** Write the line of one classified event a token was taken for, in the configured schema. */
  writeEvent(e: ConntrackEntry, c: FlowClass): void {
    const nowS = Date.now() / 1000;
    this.write(this.opts.kubeOvn ? kubeOvnFlowRecord(e, this.opts.kubeOvn, nowS) : flowRecord(e, c, nowS));
  }

  /** A token for one line, or false (the line is dropped and counted): ask before building it. */
  take(): boolean {
    const t = this.now();
    this.tokens = Math.min(this.opts.burst, this.tokens + ((t - this.last) / 1000) * this.opts.ratePerS);
    this.last = t;
    if (this.tokens >= 1) {
      this.tokens -= 1;
      return true;
    }
    this.opts.onDrop?.('rate');
    return false;
  }

  /** Write one line a token was taken for. */
  write(r: object): void {
    if (!this.opts.sink.write(JSON.stringify(r))) {
      this.opts.onDrop?.('backlog');
      return;
    }
    this.opts.onWrite?.();
  }

  close(): Promise<void> {
    return this.opts.sink.close();
  }
}
