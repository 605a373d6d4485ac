import { promises as fs } from 'node:fs';
import { Counter, Gauge, type Registry } from 'prom-client';
import type { Executor } from '../system/exec.js';
import type { ConntrackMonitor } from './conntrackMonitor.js';
import { KERNEL_SNAT_PORTS, rangeSize } from './portUsage.js';

const PROC = '/proc/sys/net/netfilter';

/** Kernel conntrack statistics natgw exports (`conntrack -S`, summed over CPUs). */
const CONNTRACK_STATS = [
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
type ConntrackStat = (typeof CONNTRACK_STATS)[number];

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
  /** The size of the SNAT port range (natgw_snat_port_range_size); the kernel's default range unless set. */
  readonly snatPortRangeSize?: number;
}

/** How long one reading serves the scrape's collectors (they run at once). */
const SCRAPE_MS = 1000;

/** `read`, called at most once per SCRAPE_MS: its last answer serves the collectors in between. */
function forOneScrape<T>(read: () => T): () => T {
  let at = Number.NEGATIVE_INFINITY;
  let last: T | undefined;
  return () => {
    if (performance.now() - at >= SCRAPE_MS) {
      at = performance.now();
      last = read();
    }
    return last as T;
  };
}

/**
 * PURE: connections the kernel refused to translate for lack of a free port, from `conntrack -S`.
 * Measured on Linux 6.18 with a SNAT narrowed to ten ports (test/netns/snat-ports.test.ts): each
 * packet that opens a connection when no port is left is dropped at conntrack confirmation and
 * counted in `insert_failed` and `drop` alike (`clash_resolve`, `early_drop`, `error`, `invalid`
 * stay still). `drop` also counts entries refused on a full table, so `insert_failed` is the one:
 * without the refusals that `chaintoolong` counts (a hash chain too long, which counts both).
 * In the gateway's namespace natgw's rules are the only NAT, and only SNAT allocates ports (DNAT
 * keeps them), so these are SNAT's. Per packet: a UDP datagram once, a TCP connect once per SYN.
 */
export function portAllocationFailures(stats: ReadonlyMap<ConntrackStat, number>): number | undefined {
  const failed = stats.get('insert_failed');
  if (failed === undefined) return undefined;
  return Math.max(0, failed - (stats.get('chaintoolong') ?? 0));
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
    // One `conntrack -S` per scrape, shared by the collectors that read it.
    const kernelStats = forOneScrape(() =>
      opts.exec
        .run({ file: 'conntrack', args: ['-S'], timeoutMs: 5000 })
        .then((r) => (r.exitCode === 0 ? parseConntrackStats(r.stdout) : undefined))
        .catch(() => undefined),
    );
    for (const [name, file, help] of [
      ['natgw_conntrack_entries', 'nf_conntrack_count', 'Entries in the conntrack table of the gateway namespace (nf_conntrack_count)'],
      ['natgw_conntrack_max', 'nf_conntrack_max', 'Size limit of the conntrack table (nf_conntrack_max); new connections are dropped at the limit'],
    ] as const) {
      new Gauge({
        name,
        help,
        registers,
        async collect() {
          const n = await readNumber(`${proc}/${file}`);
          if (n !== undefined) this.set(n);
        },
      });
    }
    new Gauge({
      name: 'natgw_conntrack_stat',
      help: 'Kernel conntrack statistics summed over CPUs (conntrack -S), e.g. insert_failed, drop, early_drop; kernel counters since boot of the namespace',
      labelNames: ['stat'],
      registers,
      async collect() {
        const stats = await kernelStats();
        if (!stats) return;
        for (const stat of CONNTRACK_STATS) {
          const v = stats.get(stat);
          if (v !== undefined) this.set({ stat }, v);
        }
      },
    });
    // The kernel's count since the namespace was made, so a restart of natgw does not reset it.
    let failuresSeen = 0;
    new Counter({
      name: 'natgw_snat_port_allocation_failures_total',
      help: 'Packets opening a connection that SNAT could not translate for lack of a free source port (conntrack insert_failed without chaintoolong, in the gateway namespace): a UDP flow once, a TCP connect once per SYN',
      registers,
      async collect() {
        const stats = await kernelStats();
        const n = stats && portAllocationFailures(stats);
        if (n === undefined) return;
        if (n > failuresSeen) this.inc(n - failuresSeen);
        failuresSeen = Math.max(failuresSeen, n);
      },
    });
    new Gauge({
      name: 'natgw_snat_port_range_size',
      help: 'Source ports SNAT may give connections toward one destination (NATGW_SNAT_PORT_RANGE): the denominator of natgw_snat_port_usage_ratio',
      registers,
    }).set(opts.snatPortRangeSize ?? rangeSize(KERNEL_SNAT_PORTS));
    if (opts.monitor) {
      const monitor = opts.monitor;
      // The port-usage gauges share one pass over the destinations per scrape.
      const portUsage = forOneScrape(() => monitor()?.portUsage() ?? []);
      for (const [name, field, help] of [
        [
          'natgw_snat_port_usage_ratio',
          'maxShare',
          'Per EIP, the highest share of the SNAT port range that connections toward any one destination (ip, port, protocol) use; at 1 new connections to it fail',
        ],
        ['natgw_snat_ports_in_use_max', 'maxPorts', 'Per EIP, the most source ports in use toward any one destination (ip, port, protocol)'],
        ['natgw_snat_destinations', 'destinations', 'Per EIP, destinations (ip, port, protocol) with at least one open SNAT connection'],
      ] as const) {
        new Gauge({
          name,
          help,
          labelNames: ['eip'],
          registers,
          collect() {
            this.reset();
            for (const u of portUsage()) this.set({ eip: u.eip }, u[field]);
          },
        });
      }
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
