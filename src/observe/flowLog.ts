import { createWriteStream } from 'node:fs';
import type { ConntrackEntry, Counters, Tuple } from './conntrackEvents.js';
import { translatedOf, type FlowClass, type FlowKind } from './classify.js';
import { TokenBucket } from './rateLimit.js';
import { RotatingFile } from './rotate.js';

/** One flow-log line (JSON). `type: "flow"` tells it apart from the daemon's own log on stdout. */
export interface FlowRecord {
  readonly type: 'flow';
  readonly msg: 'flow';
  readonly event: 'start' | 'end';
  /** ISO 8601, from conntrack's event timestamp when present. */
  readonly time: string;
  readonly id?: number;
  readonly kind: FlowKind;
  readonly eip: string;
  readonly protocol: string;
  /** As the connection left its sender. */
  readonly original: Tuple;
  /** The same direction after natgw's translation. */
  readonly translated: Tuple;
  /** At the end, when conntrack accounting is on: original (sender → receiver) and reply direction. */
  readonly packets?: { readonly original: number; readonly reply: number };
  readonly bytes?: { readonly original: number; readonly reply: number };
  readonly durationS?: number;
}

const pair = (o: Counters | undefined, r: Counters | undefined, k: keyof Counters) => (o && r ? { original: o[k], reply: r[k] } : undefined);

/** PURE: a classified conntrack event → its flow line. */
export function flowRecord(e: ConntrackEntry, c: FlowClass, nowS: number): FlowRecord {
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

export function fileSink(path: string, maxBytes: number, onError?: (e: unknown) => void): FlowSink & { drained(): Promise<void> } {
  const f = new RotatingFile({ path, maxBytes, onError });
  return { write: (l) => f.write(l), close: () => f.close(), drained: () => f.drained() };
}

export interface FlowLogOptions {
  readonly sink: FlowSink;
  readonly ratePerS: number;
  readonly burst: number;
  /** Called for every line not written: rate limit or a full output. */
  readonly onDrop?: (reason: 'rate' | 'backlog') => void;
  readonly onWrite?: () => void;
}

/** Rate-limited flow lines to one sink. */
export class FlowLog {
  private readonly bucket: TokenBucket;

  constructor(private readonly opts: FlowLogOptions) {
    this.bucket = new TokenBucket(opts.ratePerS, opts.burst);
  }

  log(r: FlowRecord): void {
    if (this.take()) this.write(r);
  }

  /** A token for one line, or false (the line is dropped and counted): ask before building it. */
  take(): boolean {
    if (this.bucket.take()) return true;
    this.opts.onDrop?.('rate');
    return false;
  }

  /** Write one line a token was taken for. */
  write(r: FlowRecord): void {
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
