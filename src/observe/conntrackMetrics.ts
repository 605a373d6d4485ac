import { promises as fs } from 'node:fs';
import { Counter, Gauge, type Registry } from 'prom-client';
import type { Executor } from '../system/exec.js';
import { CONNTRACK_STATS, parseConntrackStats } from './conntrackEvents.js';
import type { ConntrackMonitor } from './conntrackMonitor.js';
import type { FlowClass } from './classify.js';

const PROC = '/proc/sys/net/netfilter';

async function readNumber(path: string): Promise<number | undefined> {
  try {
    const n = Number((await fs.readFile(path, 'utf8')).trim());
    return Number.isFinite(n) ? n : undefined;
  } catch {
    return undefined;
  }
}

export interface ConntrackMetricsOptions {
  readonly exec: Executor;
  /** Absent when event following is off: the per-EIP series are then not exported. */
  readonly monitor?: () => ConntrackMonitor | undefined;
  /** Where nf_conntrack_count/max are read (tests). */
  readonly procDir?: string;
}

/**
 * Conntrack and flow metrics, in the agent's registry. Labels are bounded: EIP and kind, a
 * fixed statistic name, a drop reason; never ports or inner addresses. The kernel's numbers are
 * read at scrape time from the daemon's network namespace.
 */
export class ConntrackMetrics {
  readonly flowStarts: Counter<'eip' | 'kind'>;
  readonly flowLogLines: Counter;
  readonly flowLogDropped: Counter<'reason'>;
  readonly monitorRestarts: Counter;
  readonly monitorOverruns: Counter;

  constructor(registry: Registry, opts: ConntrackMetricsOptions) {
    const registers = [registry];
    const proc = opts.procDir ?? PROC;
    new Gauge({
      name: 'natgw_conntrack_entries',
      help: 'Entries in the conntrack table of the gateway namespace (nf_conntrack_count)',
      registers,
      async collect() {
        const n = await readNumber(`${proc}/nf_conntrack_count`);
        if (n !== undefined) this.set(n);
      },
    });
    new Gauge({
      name: 'natgw_conntrack_max',
      help: 'Size limit of the conntrack table (nf_conntrack_max); new connections are dropped at the limit',
      registers,
      async collect() {
        const n = await readNumber(`${proc}/nf_conntrack_max`);
        if (n !== undefined) this.set(n);
      },
    });
    new Gauge({
      name: 'natgw_conntrack_stat',
      help: 'Kernel conntrack statistics summed over CPUs (conntrack -S), e.g. insert_failed, drop, early_drop; kernel counters since boot of the namespace',
      labelNames: ['stat'],
      registers,
      async collect() {
        const r = await opts.exec.run({ file: 'conntrack', args: ['-S'], timeoutMs: 5000 }).catch(() => undefined);
        if (r?.exitCode !== 0) return;
        const stats = parseConntrackStats(r.stdout);
        for (const stat of CONNTRACK_STATS) {
          const v = stats.get(stat);
          if (v !== undefined) this.set({ stat }, v);
        }
      },
    });
    if (opts.monitor) {
      const monitor = opts.monitor;
      new Gauge({
        name: 'natgw_conntrack_connections',
        help: 'Open (tracked) connections translated by natgw, per EIP and kind (snat, dnat, fip, share-dnat)',
        labelNames: ['eip', 'kind'],
        registers,
        collect() {
          this.reset();
          for (const { eip, kind, n } of monitor()?.connections() ?? []) this.set({ eip, kind }, n);
        },
      });
      new Gauge({
        name: 'natgw_conntrack_events_up',
        help: '1 while natgw follows conntrack events (its conntrack -E child runs)',
        registers,
        collect() {
          this.set(monitor()?.up ? 1 : 0);
        },
      });
    }
    this.flowStarts = new Counter({
      name: 'natgw_flow_starts_total',
      help: 'Connections started through natgw, per EIP and kind',
      labelNames: ['eip', 'kind'],
      registers,
    });
    this.flowLogLines = new Counter({ name: 'natgw_flow_log_lines_total', help: 'Flow-log lines written', registers });
    this.flowLogDropped = new Counter({
      name: 'natgw_flow_log_dropped_total',
      help: 'Flow-log lines not written: reason="rate" above NATGW_FLOW_LOG_RATE, "backlog" when the output could not keep up',
      labelNames: ['reason'],
      registers,
    });
    this.monitorRestarts = new Counter({
      name: 'natgw_conntrack_events_restarts_total',
      help: 'Restarts of the conntrack -E child (events in between were lost; counts are re-read)',
      registers,
    });
    this.monitorOverruns = new Counter({
      name: 'natgw_conntrack_events_overruns_total',
      help: 'Times the conntrack event socket overran (ENOBUFS) and events were lost; the table is then re-read, at most once per 30 s',
      registers,
    });
    for (const reason of ['rate', 'backlog']) this.flowLogDropped.inc({ reason }, 0);
  }

  /** The counter of each EIP and kind: a burst increments it per event, without hashing labels each time. */
  private readonly starts = new Map<string, { inc(): void }>();

  flowStarted(c: FlowClass): void {
    const k = `${c.eip}|${c.kind}`;
    let child = this.starts.get(k);
    if (!child) {
      child = this.flowStarts.labels({ eip: c.eip, kind: c.kind });
      this.starts.set(k, child);
    }
    child.inc();
  }

  /** The drop counter of one reason, for a caller that counts per line. */
  dropped(reason: 'rate' | 'backlog'): { inc(): void } {
    return this.flowLogDropped.labels({ reason });
  }
}

/**
 * Turn on conntrack accounting (bytes and packets per connection) and timestamps (durations)
 * in the current network namespace: the pod's own, so no other workload is affected.
 */
export async function enableConntrackSysctls(procDir = PROC): Promise<{ acct: boolean; timestamp: boolean }> {
  const set = async (name: string) =>
    fs.writeFile(`${procDir}/${name}`, '1\n').then(
      () => true,
      () => false,
    );
  return { acct: await set('nf_conntrack_acct'), timestamp: await set('nf_conntrack_timestamp') };
}

/** Whether conntrack accounting is on (flow lines then carry bytes and packets at the end). */
export async function conntrackAcctOn(procDir = PROC): Promise<boolean> {
  return (await readNumber(`${procDir}/nf_conntrack_acct`)) === 1;
}
