/** One cache of `conntrackd -s` (internal: this replica's flows; external: the peer's). */
interface CacheStats {
  readonly active: number;
  readonly created: number;
  readonly createFailed: number;
  readonly updated: number;
  readonly updateFailed: number;
  readonly destroyed: number;
  readonly destroyFailed: number;
}

export interface ConntrackdStats {
  readonly internal: CacheStats;
  readonly external: CacheStats;
  /** The sync channel (the active one where several are configured). */
  readonly channel: {
    readonly device: string;
    readonly bytesSent: number;
    readonly bytesReceived: number;
    readonly packetsSent: number;
    readonly packetsReceived: number;
    readonly sendErrors: number;
    readonly receiveErrors: number;
  };
  readonly malformed: number;
  readonly lost: number;
}

export class StatsParseError extends Error {
  override readonly name = 'StatsParseError';
}

/** The lines of the block that starts with `heading` (up to the next blank line). */
function block(text: string, heading: RegExp): string[] | undefined {
  const lines = text.split('\n');
  const start = lines.findIndex((l) => heading.test(l));
  if (start < 0) return undefined;
  const out: string[] = [];
  for (const l of lines.slice(start)) {
    if (out.length > 0 && l.trim() === '') break;
    out.push(l);
  }
  return out;
}

function num(lines: readonly string[], re: RegExp, what: string): number {
  for (const l of lines) {
    const m = re.exec(l);
    if (m) return Number(m[1]);
  }
  throw new StatsParseError(`conntrackd -s: no ${what}`);
}

function cache(text: string, name: 'internal' | 'external'): CacheStats {
  // With the external cache disabled (active-active), the peer's flows are counted as they are
  // written into the kernel: `external inject`, the same counters without an active count.
  const b = block(text, new RegExp(`^cache ${name}:`)) ?? (name === 'external' ? block(text, /^external inject:/) : undefined);
  if (!b) throw new StatsParseError(`conntrackd -s: no 'cache ${name}' section`);
  const pair = (verb: string): [number, number] => {
    for (const l of b) {
      const m = new RegExp(`^connections ${verb}:\\s+(\\d+)\\s+failed:\\s+(\\d+)`).exec(l);
      if (m) return [Number(m[1]), Number(m[2])];
    }
    throw new StatsParseError(`conntrackd -s: no 'connections ${verb}' in cache ${name}`);
  };
  const [created, createFailed] = pair('created');
  const [updated, updateFailed] = pair('updated');
  const [destroyed, destroyFailed] = pair('destroyed');
  const injected = /^external inject:/.test(b[0] ?? '');
  return {
    active: injected ? 0 : num(b, /^current active connections:\s+(\d+)/, `active connections in cache ${name}`),
    created,
    createFailed,
    updated,
    updateFailed,
    destroyed,
    destroyFailed,
  };
}

/**
 * `conntrackd -s` (conntrackd 1.4, sync mode): the caches, the sync channel's traffic and the
 * message tracking counters. Counters restart from zero when conntrackd restarts.
 */
export function parseConntrackdStats(text: string): ConntrackdStats {
  // conntrackd 1.4 writes "UDP traffic" but "multicast traffic".
  const udp = block(text, /^(UDP|TCP|multicast) traffic/i);
  if (!udp) throw new StatsParseError('conntrackd -s: no sync channel traffic section (is conntrackd in sync mode?)');
  const device = /device=([^\s):]+)/.exec(udp[0] ?? '')?.[1] ?? '';
  const pairOf = (re: RegExp, what: string): [number, number] => {
    for (const l of udp) {
      const m = re.exec(l);
      if (m) return [Number(m[1]), Number(m[2])];
    }
    throw new StatsParseError(`conntrackd -s: no ${what} in the sync channel section`);
  };
  const [bytesSent, bytesReceived] = pairOf(/^\s*(\d+) Bytes sent\s+(\d+) Bytes recv/, 'byte counts');
  const [packetsSent, packetsReceived] = pairOf(/^\s*(\d+) Pckts sent\s+(\d+) Pckts recv/, 'packet counts');
  const [sendErrors, receiveErrors] = pairOf(/^\s*(\d+) Error send\s+(\d+) Error recv/, 'error counts');
  const tracking = block(text, /^message tracking:/) ?? [];
  const m = tracking.map((l) => /^\s*(\d+) Malformed msgs\s+(\d+) Lost msgs/.exec(l)).find((x) => x);
  return {
    internal: cache(text, 'internal'),
    external: cache(text, 'external'),
    channel: { device, bytesSent, bytesReceived, packetsSent, packetsReceived, sendErrors, receiveErrors },
    malformed: m ? Number(m[1]) : 0,
    lost: m ? Number(m[2]) : 0,
  };
}
