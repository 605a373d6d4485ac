import { Counter, Gauge, type Registry } from 'prom-client';
import type { ConntrackdStats } from './stats.js';

/**
 * Replica metrics, registered in the agent's own registry (Metrics.registry). conntrackd's
 * figures are gauges: they are conntrackd's counters, which restart from zero with it.
 */
export class HaMetrics {
  readonly enabled: Gauge;
  readonly healthy: Gauge;
  readonly conntrackdUp: Gauge;
  readonly restarts: Counter;
  readonly entries: Gauge<'direction'>;
  readonly cacheEntries: Gauge<'cache'>;
  readonly packets: Gauge<'direction'>;
  readonly errors: Gauge<'kind'>;
  readonly lastExchange: Gauge;
  readonly peerDivergent: Gauge;
  readonly peerReachable: Gauge;
  readonly takeovers: Counter<'outcome'>;

  constructor(registry: Registry, digest: () => Promise<string>) {
    const registers = [registry];
    new Gauge({
      name: 'natgw_state_info',
      help: 'Always 1; the digest label is the sha256 of the canonical desired state (equal on replicas that agree)',
      labelNames: ['digest'],
      registers,
      async collect() {
        const d = await digest().catch(() => undefined);
        this.reset();
        if (d !== undefined) this.set({ digest: d }, 1);
      },
    });
    this.enabled = new Gauge({
      name: 'natgw_ha_sync_enabled',
      help: '1 when replica sync with conntrackd is configured and conntrackd is installed',
      registers,
    });
    this.healthy = new Gauge({
      name: 'natgw_ha_sync_healthy',
      help: '1 when conntrackd runs, answers, and heard from the peer within NATGW_HA_SYNC_TIMEOUT',
      registers,
    });
    this.conntrackdUp = new Gauge({ name: 'natgw_ha_conntrackd_up', help: '1 while the supervised conntrackd process runs', registers });
    this.restarts = new Counter({ name: 'natgw_ha_conntrackd_restarts_total', help: 'Times conntrackd exited and natgw started it again', registers });
    this.entries = new Gauge({
      name: 'natgw_ha_sync_entries',
      help: 'Flows conntrackd has sent to the peer (direction="sent": created in the internal cache) and received from it (direction="received": created in the external cache) since it started',
      labelNames: ['direction'],
      registers,
    });
    this.cacheEntries = new Gauge({
      name: 'natgw_ha_sync_cache_entries',
      help: "Flows now in conntrackd's internal (own) and external (peer's) cache",
      labelNames: ['cache'],
      registers,
    });
    this.packets = new Gauge({
      name: 'natgw_ha_sync_packets',
      help: 'Packets on the sync channel since conntrackd started',
      labelNames: ['direction'],
      registers,
    });
    this.errors = new Gauge({
      name: 'natgw_ha_sync_errors',
      help: 'Sync errors since conntrackd started: send and receive errors on the channel, malformed and lost messages, failed cache operations',
      labelNames: ['kind'],
      registers,
    });
    this.lastExchange = new Gauge({
      name: 'natgw_ha_sync_last_exchange_timestamp_seconds',
      help: 'When conntrackd last received anything from the peer (Unix time; 0: never)',
      registers,
    });
    this.peerDivergent = new Gauge({
      name: 'natgw_ha_peer_divergent',
      help: "1 when the peer's desired-state digest differs from this replica's (NATGW_HA_PEER_API)",
      registers,
    });
    this.peerReachable = new Gauge({ name: 'natgw_ha_peer_reachable', help: "1 when the last read of the peer's digest succeeded", registers });
    this.takeovers = new Counter({
      name: 'natgw_ha_takeovers_total',
      help: 'Takeovers (commit of the external cache, gratuitous ARP for every EIP)',
      labelNames: ['outcome'],
      registers,
    });
    for (const g of [this.enabled, this.healthy, this.conntrackdUp, this.lastExchange, this.peerDivergent, this.peerReachable]) g.set(0);
  }

  observeStats(s: ConntrackdStats): void {
    this.entries.set({ direction: 'sent' }, s.internal.created);
    this.entries.set({ direction: 'received' }, s.external.created);
    this.cacheEntries.set({ cache: 'internal' }, s.internal.active);
    this.cacheEntries.set({ cache: 'external' }, s.external.active);
    this.packets.set({ direction: 'sent' }, s.channel.packetsSent);
    this.packets.set({ direction: 'received' }, s.channel.packetsReceived);
    this.errors.set({ kind: 'send' }, s.channel.sendErrors);
    this.errors.set({ kind: 'receive' }, s.channel.receiveErrors);
    this.errors.set({ kind: 'malformed' }, s.malformed);
    this.errors.set({ kind: 'lost' }, s.lost);
    const failed = (c: ConntrackdStats['internal']) => c.createFailed + c.updateFailed + c.destroyFailed;
    this.errors.set({ kind: 'cache' }, failed(s.internal) + failed(s.external));
  }
}
