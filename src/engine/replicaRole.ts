import type { Logger } from 'pino';
import type { Config } from '../config/config.js';

export type RoleName = 'active' | 'standby';

/**
 * Whether this replica may tell the external segment that the EIPs live here. In the takeover
 * mode (NATGW_HA_PEERS set) both replicas hold the same EIPs on one segment: a gratuitous ARP
 * from the standby pulls the upstream's traffic to it and resets every flow through the active
 * one. So a replica starts as NATGW_HA_INITIAL_ROLE (standby unless configured otherwise: a
 * restarted replica never announces on its own) and becomes active only by a takeover. Without
 * replicas the gateway is always active. Every announcement (eip-add, init, the start's and a
 * link's) asks here first. In the active-active mode every replica forwards and the EIPs are
 * routed to each (announced by a routing daemon), so none of them sends gratuitous ARP.
 */
export class ReplicaRole {
  readonly mode: 'single' | 'takeover' | 'active-active';
  /** The EIPs are routed (BGP, src/routing): the peers learn where they live from BGP, never from ARP. */
  readonly routed: boolean;
  private current: RoleName;
  private since: string;

  constructor(
    config: Partial<Pick<Config, 'ha' | 'bgp'>>,
    private readonly log?: Logger,
  ) {
    this.mode = config.ha?.peers.length ? (config.ha.mode ?? 'takeover') : 'single';
    this.routed = config.bgp !== undefined;
    this.current = this.mode === 'takeover' ? (config.ha?.initialRole ?? 'standby') : 'active';
    this.since = new Date().toISOString();
  }

  get name(): RoleName {
    return this.current;
  }

  /** A takeover: from now on this replica announces. */
  activate(reason: string): void {
    if (this.current === 'active') return;
    this.current = 'active';
    this.since = new Date().toISOString();
    this.log?.info({ reason }, 'replica role: active (announces the EIPs from now on)');
  }

  status(): { mode: ReplicaRole['mode']; role: RoleName; since: string } {
    return { mode: this.mode, role: this.current, since: this.since };
  }

  /** Whether `ips` may be announced now; a standby says at debug level what it kept quiet. */
  mayAnnounce(why: string, ips: readonly string[]): boolean {
    if (this.routed || this.mode === 'active-active') {
      const how = this.routed ? 'EIPs are routed (BGP)' : 'active-active replica (EIPs are routed)';
      if (ips.length > 0) this.log?.debug({ why, ips: ips.slice(0, 20), count: ips.length }, `${how}: no gratuitous ARP`);
      return false;
    }
    if (this.current === 'active') return true;
    if (ips.length > 0) this.log?.debug({ why, ips: ips.slice(0, 20), count: ips.length }, 'standby replica: not announced');
    return false;
  }
}
