import { setPriority } from 'node:os';
import type { Logger } from 'pino';
import { Supervised } from '../system/supervised.js';
import type { Executor } from '../system/exec.js';
import type { DesiredState } from '../state/state.js';
import { parseConntrackLine, type ConntrackEntry } from '../model/conntrackLine.js';
import { FlowIndex, type FlowClass } from './classify.js';
import type { FlowLog } from './flowLog.js';
import { PortUsage, type EipPortUsage, type PortRange, type PortRow } from './portUsage.js';

/**
 * The event stream: NEW and DESTROY only, with the event time and the entry id pairing the two,
 * and only translated entries (`--any-nat`): conntrack drops the others in its own process
 * before printing them, so untranslated traffic through or to the gateway never reaches Node.js.
 * (conntrack 1.4.7 filters events in user space, one address per option, options ANDed: a
 * follower per EIP would receive every event once per follower. natgw's rules are the only NAT
 * in the pod, so "translated" is "natgw's"; the classifier sorts out EIP and kind.)
 * `--any-nat` goes last: it takes an optional address from the next argument.
 */
export const EVENT_ARGS = ['-E', '-e', 'NEW,DESTROY', '-o', 'timestamp,extended,id', '-b', String(8 << 20), '--any-nat'] as const;
/** The table of one family, translated entries only (the same filter as the events). */
const listArgs = (family: 'ipv4' | 'ipv6'): string[] => ['-L', '-f', family, '-o', 'extended,id', '--any-nat'];
/**
 * The event child's nice value: following is best effort, so in a burst the conntrack process
 * gives the CPU up to the daemon's commands and the datapath, and loses events (ENOBUFS) first.
 */
export const FOLLOWER_NICE = 10;
/** Listing lines parsed between two yields while the table is re-read. */
const SEED_CHUNK_LINES = 2048;
/**
 * The shortest time between two re-reads of the table after lost events: a burst that overruns
 * the event socket again and again must not cause listing after listing. Connections that ended
 * unseen stay counted until the next re-read, at most this long.
 */
const RESEED_MIN_INTERVAL_MS = 30_000;
/** Longest line kept; conntrack's lines are a few hundred bytes, anything longer is garbage. */
const MAX_LINE = 4096;
/** Connections remembered (id → EIP and kind); beyond this, new ones are neither remembered nor counted. */
const MAX_TRACKED = 1 << 20;
/** A child that lived this long is considered healthy again: the backoff restarts from the minimum. */
const HEALTHY_AFTER_MS = 60_000;

export interface ConntrackMonitorOptions {
  readonly exec: Executor;
  readonly log: Logger;
  readonly flowLog?: FlowLog;
  /** Each classified NEW event (feeds natgw_flow_starts_total). */
  readonly onStart?: (c: FlowClass) => void;
  readonly onRestart?: () => void;
  /** Each report of lost events (ENOBUFS) from the event child. */
  readonly onOverrun?: () => void;
  /** The conntrack binary (tests may point elsewhere). */
  readonly tool?: string;
  /** RESEED_MIN_INTERVAL_MS unless set (tests). */
  readonly reseedMinIntervalMs?: number;
  /** The port range SNAT translates into (the denominator of the port-usage share); the kernel's default unless set. */
  readonly snatPorts?: PortRange;
}

const labelKey = (c: FlowClass): string => `${c.eip}|${c.kind}`;

/** Open connections of one EIP and kind. */
interface LabelRow {
  readonly c: FlowClass;
  n: number;
}

/**
 * What the monitor remembers of one connection: its label row, or for a SNAT connection with
 * ports the row of its destination (tagged with the label row), so no object is made per connection.
 */
type Tracked = LabelRow | PortRow<LabelRow>;

const labelOf = (t: Tracked): LabelRow => ('tag' in t ? t.tag : t);

/** A SNAT connection's destination: the reply's source, toward which its EIP's source port is unique. */
interface Destination {
  readonly ip: string;
  readonly port: number;
  readonly protocol: string;
}

/** The destination of a SNAT connection with ports (TCP, UDP, SCTP…; not ICMP). */
function destinationOf(e: Pick<ConntrackEntry, 'protocol' | 'reply'>, c: FlowClass): Destination | undefined {
  if (c.kind !== 'snat' || e.reply.sport === undefined || e.reply.dport === undefined) return undefined;
  return { ip: e.reply.src, port: e.reply.sport, protocol: e.protocol };
}

/**
 * Follows the kernel's conntrack events in the daemon's network namespace through a supervised
 * `conntrack -E` child: writes flow lines and keeps the count of open connections per EIP and
 * kind. The child is read as a stream and never waited on, so nothing here can hold up a
 * command; when it dies it is restarted with backoff, and the table is read once more
 * (`conntrack -L`) because events were lost in between.
 */
export class ConntrackMonitor {
  /** The rules classified against, and their index, built on first use after they change. */
  private rules: Pick<DesiredState, 'eips' | 'snats' | 'dnats' | 'fips' | 'shareDnats'> | undefined;
  private built: FlowIndex | undefined;
  private readonly active = new Map<number, Tracked>();
  private readonly counts = new Map<string, LabelRow>();
  private readonly ports: PortUsage<LabelRow>;
  private follower: Supervised | undefined;
  private stopped = true;
  /** While a seed listing runs: ids destroyed meanwhile, which the listing may still show. */
  private destroyedWhileSeeding: Set<number> | undefined;
  /** While a seed listing runs: ids that started meanwhile, which the listing may miss. */
  private startedWhileSeeding: Set<number> | undefined;
  private seeding: Promise<void> | undefined;
  /** Events were lost while a listing ran: another one follows, after the interval. */
  private seedAgain = false;
  private seedTimer: NodeJS.Timeout | undefined;
  /** When the last listing ended (performance.now()). */
  private lastSeedAt = Number.NEGATIVE_INFINITY;

  constructor(private readonly opts: ConntrackMonitorOptions) {
    this.ports = new PortUsage(opts.snatPorts);
  }

  /** Whether the event child is running. */
  get up(): boolean {
    return this.follower?.state === 'running';
  }

  /**
   * The rules of every applied state. The index is built when the next event needs it, not
   * here: this runs on the command path, and an unchanged rule set (the same arrays, as a
   * command that touched other kinds leaves them) keeps the index it has.
   */
  setState(s: Pick<DesiredState, 'eips' | 'snats' | 'dnats' | 'fips' | 'shareDnats'>): void {
    const r = this.rules;
    if (r && r.eips === s.eips && r.snats === s.snats && r.dnats === s.dnats && r.fips === s.fips && r.shareDnats === s.shareDnats) return;
    this.rules = s;
    this.built = undefined;
  }

  private get index(): FlowIndex {
    this.built ??= new FlowIndex(this.rules);
    return this.built;
  }

  /** Open connections per EIP and kind (only those with at least one ever seen). */
  connections(): { eip: string; kind: string; n: number }[] {
    return [...this.counts.values()].map(({ c, n }) => ({ eip: c.eip, kind: c.kind, n }));
  }

  /** SNAT source ports in use per EIP: the busiest destination of each, and with `top` the busiest few. */
  portUsage(opts: { top?: number } = {}): EipPortUsage[] {
    return this.ports.report(opts.top ?? 0);
  }

  start(): void {
    if (!this.stopped) return;
    this.stopped = false;
    let spawned = 0;
    this.follower = new Supervised({
      file: this.opts.tool ?? 'conntrack',
      args: EVENT_ARGS,
      name: 'conntrack events follower',
      log: this.opts.log,
      stableMs: HEALTHY_AFTER_MS,
      graceMs: 2000,
      onSpawn: (pid) => {
        try {
          setPriority(pid, FOLLOWER_NICE);
        } catch (e) {
          this.opts.log.debug({ err: e }, 'conntrack events: cannot lower the priority of conntrack');
        }
        // The listing after the subscription: an entry created in between shows up in both, which
        // the id map absorbs; one destroyed in between is remembered and not counted again.
        this.requestSeed(spawned++ === 0 ? undefined : 'conntrack restarted');
      },
      onLine: (line) => {
        if (line.length <= MAX_LINE) this.onLine(line);
      },
      // The socket overran and events were lost (conntrack keeps running): counts are re-read.
      onStderr: (line) => {
        if (!line.includes('ENOBUFS')) return;
        this.opts.onOverrun?.();
        this.requestSeed('events lost (ENOBUFS)');
      },
      onExit: () => this.opts.onRestart?.(),
    });
    this.follower.start();
  }

  /** Kill the child and wait until it is gone. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.seedTimer);
    this.seedTimer = undefined;
    await this.follower?.stop();
    this.follower = undefined;
    await this.seeding?.catch(() => undefined);
    await this.opts.flowLog?.close();
  }

  /**
   * Re-read the table now, or when RESEED_MIN_INTERVAL_MS has passed since the last listing;
   * requests meanwhile fold into that one. `why` is logged once per listing it leads to.
   */
  private requestSeed(why?: string): void {
    if (this.stopped) return;
    if (this.seeding) {
      this.seedAgain = true;
      return;
    }
    if (this.seedTimer) return;
    const wait = this.lastSeedAt + (this.opts.reseedMinIntervalMs ?? RESEED_MIN_INTERVAL_MS) - performance.now();
    if (why) this.opts.log.warn({ inMs: Math.max(0, Math.round(wait)) }, `conntrack events: ${why}; re-reading the table`);
    if (wait > 0) {
      this.seedTimer = setTimeout(() => {
        this.seedTimer = undefined;
        this.requestSeed();
      }, wait);
      this.seedTimer.unref();
      return;
    }
    this.seeding = this.seed().finally(() => {
      this.seeding = undefined;
      this.lastSeedAt = performance.now();
      if (this.seedAgain) {
        this.seedAgain = false;
        this.requestSeed();
      }
    });
  }

  private async seed(): Promise<void> {
    this.destroyedWhileSeeding = new Set();
    this.startedWhileSeeding = new Set();
    try {
      // Ids and classes only: a full table must not be held as parsed entries.
      const listed = new Set<number>();
      const classified: [number, FlowClass, Destination | undefined][] = [];
      for (const family of ['ipv4', 'ipv6'] as const) {
        const r = await this.opts.exec.run({ file: this.opts.tool ?? 'conntrack', args: listArgs(family), timeoutMs: 60_000 });
        if (r.exitCode !== 0 && r.stdout.trim() === '') continue;
        const text = r.stdout;
        let n = 0;
        for (let from = 0; from < text.length; ) {
          let to = text.indexOf('\n', from);
          if (to === -1) to = text.length;
          const e = parseConntrackLine(text.slice(from, to));
          from = to + 1;
          if (e?.id !== undefined) {
            listed.add(e.id);
            const c = this.index.classify(e);
            if (c) classified.push([e.id, c, destinationOf(e, c)]);
          }
          // A table of a few hundred thousand entries takes a while: commands go in between.
          if (++n % SEED_CHUNK_LINES === 0) await new Promise<void>((resolve) => setImmediate(resolve));
          if (this.stopped) return;
        }
      }
      const destroyed = this.destroyedWhileSeeding!;
      const started = this.startedWhileSeeding!;
      // Events were lost before this listing (a restart): it replaces what was remembered.
      for (const id of [...this.active.keys()]) if (!listed.has(id) && !started.has(id)) this.forget(id);
      for (const [id, c, d] of classified) if (!destroyed.has(id)) this.remember(id, c, d);
    } catch (e) {
      this.opts.log.warn({ err: e }, 'conntrack events: listing the table failed; counts start from the events');
    } finally {
      this.destroyedWhileSeeding = undefined;
      this.startedWhileSeeding = undefined;
    }
  }

  private remember(id: number, c: FlowClass, dest?: Destination): void {
    if (this.active.has(id) || this.active.size >= MAX_TRACKED) return;
    const k = labelKey(c);
    let label = this.counts.get(k);
    if (!label) {
      label = { c, n: 0 };
      this.counts.set(k, label);
    }
    label.n++;
    if (!dest) {
      this.active.set(id, label);
      return;
    }
    this.active.set(id, this.ports.add(c.eip, dest.ip, dest.port, dest.protocol, label));
  }

  private forget(id: number): FlowClass | undefined {
    const t = this.active.get(id);
    if (!t) return undefined;
    this.active.delete(id);
    const label = labelOf(t);
    label.n = Math.max(0, label.n - 1);
    if ('tag' in t) this.ports.remove(t);
    return label.c;
  }

  /** One line of the event stream. */
  onLine(line: string): void {
    const e = parseConntrackLine(line);
    if (!e?.event) return;
    if (e.event === 'new') {
      const c = this.index.classify(e);
      if (!c) return;
      if (e.id !== undefined) {
        this.remember(e.id, c, destinationOf(e, c));
        this.startedWhileSeeding?.add(e.id);
      }
      this.opts.onStart?.(c);
      // The line is built only with a token in hand: a burst is mostly dropped, and cheaply.
      if (this.opts.flowLog?.take()) this.opts.flowLog.writeEvent(e, c);
      return;
    }
    if (e.id !== undefined) this.destroyedWhileSeeding?.add(e.id);
    // The class it had at its start: its rule may be gone by now (a flush after a delete).
    const c = (e.id !== undefined ? this.forget(e.id) : undefined) ?? this.index.classify(e);
    if (c && this.opts.flowLog?.take()) this.opts.flowLog.writeEvent(e, c);
  }
}
