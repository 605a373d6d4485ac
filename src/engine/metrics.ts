import type { EipTraffic } from '../dataplane/eipCounters.js';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { SyncEvent } from './engine.js';
import type { DesiredState } from '../state/state.js';
import { COLLECTIONS } from '../state/change.js';

/**
 * Prometheus metrics of one agent, in a registry of its own (so several agents, e.g. in
 * tests, never collide in prom-client's global registry).
 */
export class Metrics {
  readonly registry = new Registry();
  readonly syncs: Counter<'kind' | 'outcome'>;
  readonly syncFailures: Counter;
  readonly syncDuration: Histogram;
  readonly objects: Gauge<'kind'>;
  readonly driftRepairs: Counter;
  readonly ready: Gauge;
  readonly conntrackFlushes: Counter<'outcome'>;

  constructor(opts: { processMetrics?: boolean; eipTraffic?: () => Promise<readonly EipTraffic[]> } = {}) {
    const registers = [this.registry];
    const traffic = opts.eipTraffic;
    if (traffic) {
      // Read from the kernel at scrape time: the sets' per-element counters (EipCounters).
      const perEip = (name: string, help: string, pick: (t: EipTraffic, rx: boolean) => number) =>
        new Gauge({
          name,
          help,
          labelNames: ['eip', 'direction'],
          registers,
          async collect() {
            this.reset();
            for (const t of await traffic().catch(() => [])) {
              this.set({ eip: t.eip, direction: 'rx' }, pick(t, true));
              this.set({ eip: t.eip, direction: 'tx' }, pick(t, false));
            }
          },
        });
      perEip('natgw_eip_packets', 'Packets to (rx, before DNAT) and from (tx, after SNAT) each EIP; a kernel counter', (t, rx) =>
        rx ? t.rxPackets : t.txPackets,
      );
      perEip('natgw_eip_bytes', 'Bytes to (rx, before DNAT) and from (tx, after SNAT) each EIP; a kernel counter', (t, rx) => (rx ? t.rxBytes : t.txBytes));
    }
    this.syncs = new Counter({
      name: 'natgw_syncs_total',
      help: 'Applies of the desired state to the kernel: kind="full" read back and repaired everything natgw owns, kind="partial" applied only a change against what natgw applied last',
      labelNames: ['kind', 'outcome'],
      registers,
    });
    this.syncFailures = new Counter({ name: 'natgw_sync_failures_total', help: 'Applies that failed (nothing was changed)', registers });
    this.syncDuration = new Histogram({
      name: 'natgw_sync_duration_seconds',
      help: 'Time to reconcile the kernel with the desired state and persist it',
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers,
    });
    this.objects = new Gauge({ name: 'natgw_objects', help: 'Objects in the desired state, by kind', labelNames: ['kind'], registers });
    this.driftRepairs = new Counter({
      name: 'natgw_drift_repairs_total',
      help: 'Resyncs that found the kernel differing from the desired state and repaired it',
      registers,
    });
    this.ready = new Gauge({ name: 'natgw_ready', help: '1 when interfaces are present and the last sync succeeded', registers });
    this.conntrackFlushes = new Counter({
      name: 'natgw_conntrack_flushes_total',
      help: 'Conntrack flushes owed by deleted DNATs, floating IPs and share DNATs: outcome="ran" (conntrack -D ran), "skipped_no_entries" (the kernel\'s conntrack table held no entry it could delete)',
      labelNames: ['outcome'],
      registers,
    });
    for (const outcome of ['ran', 'skipped_no_entries']) this.conntrackFlushes.inc({ outcome }, 0);
    for (const kind of COLLECTIONS) this.objects.set({ kind }, 0);
    for (const kind of ['full', 'partial']) for (const outcome of ['success', 'failure']) this.syncs.inc({ kind, outcome }, 0);
    this.ready.set(0);
    if (opts.processMetrics) collectDefaultMetrics({ register: this.registry, prefix: 'natgw_' });
  }

  /** Feed from Engine.onSync. */
  observeSync(e: SyncEvent): void {
    this.syncDuration.observe(e.ms / 1000);
    if (e.ok) {
      this.syncs.inc({ kind: e.kind, outcome: 'success' });
      this.setObjects(e.state);
      if (e.flushes) {
        this.conntrackFlushes.inc({ outcome: 'ran' }, e.flushes.ran);
        this.conntrackFlushes.inc({ outcome: 'skipped_no_entries' }, e.flushes.noEntries);
      }
    } else {
      this.syncs.inc({ kind: e.kind, outcome: 'failure' });
      this.syncFailures.inc();
    }
  }

  setObjects(s: DesiredState): void {
    for (const kind of COLLECTIONS) this.objects.set({ kind }, s[kind].length);
  }

  async render(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }
}
