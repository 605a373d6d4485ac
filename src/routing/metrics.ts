import { Counter, Gauge, type Registry } from 'prom-client';

/** BGP metrics (what Kube-OVN #6137 asks for: each session, each EIP's advertisement), in the agent's registry. */
export class RoutingMetrics {
  readonly enabled: Gauge;
  readonly daemonUp: Gauge;
  readonly restarts: Counter;
  readonly announcing: Gauge;
  readonly withdrawals: Counter<'reason'>;
  readonly sessionUp: Gauge<'peer'>;
  readonly sessionsUp: Gauge;
  readonly eipAdvertised: Gauge<'eip'>;
  readonly eipsAdvertised: Gauge;

  constructor(registry: Registry) {
    const registers = [registry];
    this.enabled = new Gauge({ name: 'natgw_bgp_enabled', help: '1 when NATGW_BGP_PEERS is set and BIRD is installed', registers });
    this.daemonUp = new Gauge({ name: 'natgw_bgp_daemon_up', help: '1 while the supervised BIRD process runs', registers });
    this.restarts = new Counter({ name: 'natgw_bgp_daemon_restarts_total', help: 'Times BIRD exited and natgw started it again', registers });
    this.announcing = new Gauge({
      name: 'natgw_bgp_announcing',
      help: "1 while this replica's data plane is ready and its EIPs are offered to the peers; 0 while they are withdrawn",
      registers,
    });
    this.withdrawals = new Counter({
      name: 'natgw_bgp_withdrawals_total',
      help: 'Times the EIPs were withdrawn because the data plane stopped being ready (reason: not-ready, external-down, standby)',
      labelNames: ['reason'],
      registers,
    });
    this.sessionUp = new Gauge({ name: 'natgw_bgp_session_up', help: '1 while the BGP session with the peer is established', labelNames: ['peer'], registers });
    this.sessionsUp = new Gauge({ name: 'natgw_bgp_sessions_up', help: 'BGP sessions established', registers });
    this.eipAdvertised = new Gauge({
      name: 'natgw_bgp_eip_advertised',
      help: 'Peers the EIP is advertised to now (BIRD exports it on that many established sessions)',
      labelNames: ['eip'],
      registers,
    });
    this.eipsAdvertised = new Gauge({ name: 'natgw_bgp_eips_advertised', help: 'EIPs advertised to at least one peer', registers });
  }
}
