import type { Logger } from 'pino';
import { deletedNeighbourOf, isNeighbourLine } from '../dataplane/neighboursPlan.js';
import { PROBE_DEVICE_PREFIX } from '../dataplane/qos/probe.js';
import { Supervised } from '../system/supervised.js';

export interface LinkMonitorOptions {
  readonly log: Logger;
  /** Called once per burst of events, DEBOUNCE_MS after the last one. */
  readonly onChange: (why: string) => void;
  /** The monitor command (default `ip -o monitor link address neigh`). */
  readonly argv?: readonly string[];
  /**
   * Whether natgw holds the static neighbour entry a deletion names: only those deletions are
   * drift (ARP churn and natgw's own removals are not).
   */
  readonly ownsNeighbour: (address: string, dev: string) => boolean;
  /**
   * A link that came up: brought up, or created (recreated) up; undebounced. Not a flag change
   * of a link that was up already (promiscuous mode, as tcpdump sets it, is no reason to
   * announce the EIPs again).
   */
  readonly onLinkUp: (ifname: string) => void;
  /** The links as `ip -o link show` prints them, read once the monitor runs: what was up before the first event. */
  readonly links: () => Promise<string>;
}

/** A burst of events (an interface recreated with its addresses) is reported once, this long after its last line. */
const DEBOUNCE_MS = 200;

/** A line about the QoS probe's throwaway device (probe.ts names it). */
const PROBE_LINE = new RegExp(`^(?:Deleted )?\\d+: ${PROBE_DEVICE_PREFIX}[0-9a-f]+[:@\\s]`);

/** PURE: the link an `ip -o link show` or `ip -o monitor link` line reports, and whether it is up (flags with UP). */
export function linkStateOf(line: string): { readonly index: number; readonly name: string; readonly up: boolean; readonly deleted: boolean } | undefined {
  const m = /^(Deleted )?(\d+): ([^:@\s]+)(?:@\S+)?: <([^>]*)>/.exec(line);
  if (!m) return undefined;
  return { index: Number(m[2]), name: m[3] as string, up: (m[4] ?? '').split(',').includes('UP'), deleted: m[1] !== undefined };
}

/**
 * Which links came up, from the lines that report them: a link (by name and index, so a
 * recreated one is new) counts once when it goes from not up (or absent) to up.
 */
export class LinkUpTracker {
  private readonly up = new Map<string, number>();

  /** Take the links' current state (`ip -o link show`) without reporting any. */
  seed(listing: string): void {
    this.up.clear();
    for (const line of listing.split('\n')) this.observe(line);
  }

  /** The name of the link this line shows coming up, else undefined. */
  observe(line: string): string | undefined {
    const l = linkStateOf(line);
    if (!l) return undefined;
    const wasUp = this.up.get(l.name) === l.index;
    if (l.deleted || !l.up) {
      this.up.delete(l.name);
      return undefined;
    }
    this.up.set(l.name, l.index);
    return wasUp ? undefined : l.name;
  }
}

/**
 * Whether an `ip -o monitor link address` line may mean that something natgw applied is gone:
 * an address deleted, or a link that changed (recreated, down, renamed). A new address is not:
 * natgw's own eip-add makes one, and a resync for each would put a full read-back behind every
 * EIP a controller sends.
 */
export function mayLoseState(line: string): boolean {
  // Neighbour events are judged by their entry (LinkMonitor's ownsNeighbour), never wholesale.
  if (isNeighbourLine(line)) return false;
  // The QoS probe's own throwaway device: its events touch nothing natgw applied, and a full
  // resync for each would put a read-back behind the first QoS command.
  if (PROBE_LINE.test(line)) return false;
  if (line.startsWith('Deleted ')) return true;
  return !/^\d+: \S+\s+inet6? /.test(line);
}

/**
 * Watches link and address events in this network namespace (`ip -o monitor link address neigh`)
 * and reports them, debounced: an interface recreated or an address flushed triggers a
 * resync at once instead of at the next period. A monitor that dies is restarted (Supervised,
 * with a backoff), and a restart reports a change too, since events may have been missed meanwhile.
 */
export class LinkMonitor {
  private monitor: Supervised | undefined;
  private timer: NodeJS.Timeout | undefined;
  private lastLine = '';
  private readonly links = new LinkUpTracker();
  /** Lines are not reported as links coming up until the links' state is read (options.links). */
  private seeded = false;

  constructor(private readonly opts: LinkMonitorOptions) {}

  start(): void {
    if (this.monitor) return;
    const [tool = 'ip', ...args] = this.opts.argv ?? ['ip', '-o', 'monitor', 'link', 'address', 'neigh'];
    let spawned = 0;
    this.monitor = new Supervised({
      file: tool,
      args,
      name: 'link monitor',
      log: this.opts.log,
      minBackoffMs: 500,
      stableMs: 10_000,
      graceMs: 2000,
      onLine: (line) => {
        if (line.trim() !== '') this.event(line);
      },
      onStderr: () => undefined,
      // Events may have been missed while no monitor ran.
      onSpawn: () => {
        if (spawned++ > 0) this.opts.onChange('link monitor restarted');
      },
    });
    this.monitor.start();
    // Read once the monitor runs, so that no change falls between the two.
    this.opts
      .links()
      .then(
        (text) => this.links.seed(text),
        (err: unknown) => this.opts.log.warn({ err }, 'links unreadable: a link seen up first counts as come up'),
      )
      .finally(() => {
        this.seeded = true;
      });
  }

  private event(line: string): void {
    const up = this.links.observe(line);
    if (up !== undefined && this.seeded) this.opts.onLinkUp(up);
    const gone = deletedNeighbourOf(line);
    const ownLoss = gone !== undefined && this.opts.ownsNeighbour(gone.address, gone.dev);
    if (!ownLoss && !mayLoseState(line)) return;
    this.lastLine = line;
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = undefined;
      if (!this.monitor) return;
      this.opts.log.debug({ event: this.lastLine }, 'link event');
      this.opts.onChange(`link event: ${this.lastLine.slice(0, 200)}`);
    }, DEBOUNCE_MS);
  }

  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    void this.monitor?.stop();
    this.monitor = undefined;
  }
}
