import type { Logger } from 'pino';
import type { Config } from '../config/config.js';
import type { Executor } from '../system/exec.js';
import type { DesiredState } from '../state/state.js';
import type { EipTraffic } from '../dataplane/eipCounters.js';
import { Metrics } from '../engine/metrics.js';
import { ConntrackMonitor } from './conntrackMonitor.js';
import { ConntrackMetrics, conntrackAcctOn, enableConntrackSysctls } from './conntrackMetrics.js';
import { FlowLog, stdoutSink } from './flowLog.js';
import { RotatingFile } from './rotate.js';
import { rangeSize } from './portUsage.js';

/**
 * The daemon's metrics registry: the agent's metrics plus the conntrack and flow metrics. The
 * daemon and the dashboard test both build it here, so the test checks what is really exported.
 */
export function daemonMetrics(opts: {
  readonly config: Pick<Config, 'flowLog' | 'conntrackMetrics' | 'snatPortRange'>;
  readonly exec: Executor;
  readonly eipTraffic?: () => Promise<readonly EipTraffic[]>;
  readonly monitor?: () => ConntrackMonitor | undefined;
}): { metrics: Metrics; conntrack: ConntrackMetrics } {
  const metrics = new Metrics({ processMetrics: true, eipTraffic: opts.eipTraffic });
  const follow = opts.config.conntrackMetrics || opts.config.flowLog !== 'off';
  const conntrack = new ConntrackMetrics(metrics.registry, {
    exec: opts.exec,
    monitor: follow ? (opts.monitor ?? (() => undefined)) : undefined,
    snatPortRangeSize: rangeSize(opts.config.snatPortRange),
  });
  return { metrics, conntrack };
}

/** Flow logs and connection counting for `natgw serve`; nothing runs unless configured. */
export class Observer {
  private monitor: ConntrackMonitor | undefined;
  /** The last applied state, kept for a monitor started after it. */
  private latest: DesiredState | undefined;
  private stopped = false;

  constructor(private readonly deps: { readonly config: Config; readonly exec: Executor; readonly log: Logger }) {}

  /** For daemonMetrics(): the monitor once started. */
  readonly current = (): ConntrackMonitor | undefined => this.monitor;

  async start(metrics: ConntrackMetrics, state: DesiredState | undefined): Promise<void> {
    const { config, exec, log } = this.deps;
    if (!config.conntrackMetrics && config.flowLog === 'off') return;
    if (config.conntrackSysctls) {
      const set = await enableConntrackSysctls();
      log.info(set, 'conntrack accounting and timestamps in this network namespace');
    }
    let flowLog: FlowLog | undefined;
    if (config.flowLog !== 'off') {
      const sink =
        config.flowLog === 'stdout'
          ? stdoutSink()
          : new RotatingFile({
              path: config.flowLogFile,
              maxBytes: config.flowLogMaxSize,
              onError: (e) => log.warn({ err: e, file: config.flowLogFile }, 'flow log: write failed'),
            });
      flowLog = new FlowLog({
        sink,
        ratePerS: config.flowLogRate,
        burst: config.flowLogBurst,
        onDrop: (reason) => metrics.flowLogDropped.inc({ reason }),
        onWrite: () => metrics.flowLogLines.inc(),
        ...(config.flowLogSchema === 'kube-ovn' ? { kubeOvn: config.flowLogIdentity } : {}),
      });
      if (!(await conntrackAcctOn())) {
        log.warn('flow log: conntrack accounting is off (nf_conntrack_acct=0): end lines carry no bytes or packets; NATGW_CONNTRACK_SYSCTLS=true turns it on');
      }
    }
    if (this.stopped) return;
    this.monitor = new ConntrackMonitor({
      exec,
      log,
      flowLog,
      onStart: (c) => metrics.flowStarts.inc({ eip: c.eip, kind: c.kind }),
      onRestart: () => metrics.monitorRestarts.inc(),
      onOverrun: () => metrics.monitorOverruns.inc(),
      snatPorts: config.snatPortRange,
    });
    const s = this.latest ?? state;
    if (s) this.monitor.setState(s);
    this.monitor.start();
    log.info({ flowLog: config.flowLog, file: config.flowLog === 'file' ? config.flowLogFile : undefined }, 'following conntrack events');
  }

  setState(s: DesiredState): void {
    this.latest = s;
    this.monitor?.setState(s);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.monitor?.stop();
  }
}
