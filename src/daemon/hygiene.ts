import type { Logger } from 'pino';
import type { Config } from '../config/config.js';
import type { Conntrack } from '../dataplane/conntrack.js';
import { targetsOf } from '../dataplane/conntrackStale.js';
import type { LinkManager } from '../dataplane/link.js';
import type { DesiredState } from '../state/state.js';
import type { ReplicaRole } from '../engine/replicaRole.js';
import { eipInterface } from '../model/uplinks.js';

/** Announcements of every EIP are at least this far apart; a burst of link events makes one more at the end. */
const ANNOUNCE_MIN_GAP_MS = 1000;

export interface HygieneDeps {
  readonly config: Pick<Config, 'conntrackCleanup'>;
  readonly conntrack: Pick<Conntrack, 'deleteUntranslated'>;
  readonly link: Pick<LinkManager, 'announce'>;
  /** A standby replica announces nothing (src/ha/role.ts). */
  readonly role?: Pick<ReplicaRole, 'mayAnnounce'>;
  readonly log: Logger;
}

/**
 * Restart hygiene (issue 9): after the first full apply following a start, delete the
 * conntrack entries committed untranslated while natgw's rules were absent, and announce
 * every EIP (upstream routers may keep a stale MAC after a reschedule, Kube-OVN #4690); the
 * announcement is repeated when the external interface comes up or is recreated. ARP is
 * queued (LinkManager.announce): it never holds a command.
 */
export class RestartHygiene {
  private lastAnnounce = 0;
  private trailing: NodeJS.Timeout | undefined;
  private latest: DesiredState | undefined;

  constructor(private readonly deps: HygieneDeps) {}

  async afterFirstSync(state: DesiredState): Promise<void> {
    const { log } = this.deps;
    if (this.deps.config.conntrackCleanup) {
      // Nothing natgw translates (targetsOf is empty): no entry can be stale, no listing needed.
      const none = state.eips.length + state.snats.length + state.dnats.length + state.fips.length + state.shareDnats.length === 0;
      const deleted = none ? [] : await this.deps.conntrack.deleteUntranslated(targetsOf(state));
      const shown = deleted.slice(0, 20).map((e) => `${e.protocol} ${e.original.src}:${e.original.sport ?? ''} -> ${e.original.dst}:${e.original.dport ?? ''}`);
      log.info({ deleted: deleted.length, entries: shown }, 'restart hygiene: deleted conntrack entries committed untranslated while natgw was away');
    } else {
      log.info('restart hygiene: NATGW_CONNTRACK_CLEANUP=false, untranslated conntrack entries kept');
    }
    this.announce(state, 'first apply after start');
  }

  /** Gratuitous ARP for every IPv4 EIP, at most once per ANNOUNCE_MIN_GAP_MS. */
  announce(state: DesiredState, why: string): void {
    const ips = state.eips.map((e) => e.address);
    if (this.deps.role && !this.deps.role.mayAnnounce(why, ips)) return;
    this.latest = state;
    const wait = this.lastAnnounce + ANNOUNCE_MIN_GAP_MS - Date.now();
    if (wait > 0) {
      this.trailing ??= setTimeout(() => {
        this.trailing = undefined;
        if (this.latest) this.announce(this.latest, why);
      }, wait).unref();
      return;
    }
    this.lastAnnounce = Date.now();
    for (const e of state.eips) this.deps.link.announce(eipInterface(state.interfaces, e), e.address);
    this.deps.log.info({ why, eips: state.eips.length, ext: state.interfaces.ext }, 'gratuitous ARP / unsolicited NA queued for every EIP');
  }

  stop(): void {
    if (this.trailing) clearTimeout(this.trailing);
    this.trailing = undefined;
  }
}
