import { promises as fs } from 'node:fs';
import type { Logger } from 'pino';
import type { Config, HaConfig } from '../config/config.js';
import type { Executor } from '../system/exec.js';
import type { DesiredState } from '../state/state.js';
import { isInterfaceName, isIpv6 } from '../model/net.js';
import { conntrackdPaths, renderConntrackdConf, type ConntrackdPaths } from './render.js';
import { parseConntrackdStats, type ConntrackdStats } from './stats.js';
import { killOrphan, Supervised } from '../system/supervised.js';
import { PeerCompare, requestResend } from './peer.js';
import type { HaMetrics } from './metrics.js';
import type { ReplicaRole } from '../engine/replicaRole.js';
import { eipInterface } from '../model/uplinks.js';

export interface HaDeps {
  readonly config: Config;
  readonly exec: Executor;
  readonly log: Logger;
  readonly metrics: HaMetrics;
  readonly loadState: () => Promise<DesiredState>;
  readonly digest: () => Promise<string>;
  /** Gratuitous ARP for one address (LinkManager.announce). */
  readonly announce: (ifname: string, ip: string) => void;
  /** Whether this replica announces; a takeover makes it active. */
  readonly role: ReplicaRole;
  /** Holds readiness with a reason, or releases it (null): an active-active replica joining. */
  readonly holdReady?: (reason: string | null) => void;
  /** Called once a takeover made this replica active (in the takeover mode that opens BGP's gate too). */
  readonly tookOver?: () => void;
}

/** A (re)joining active-active replica: the peer's flows asked for, and how many arrived. */
export interface JoinState {
  readonly state: 'waiting' | 'done' | 'gave-up';
  readonly since: string;
  /** Flows the peer said it resent. */
  readonly expected: number | null;
  /** Flows written into this kernel since the resend (conntrackd's external inject counters). */
  readonly received: number;
  readonly error: string | null;
  readonly ms: number | null;
}

export interface TakeoverResult {
  readonly reason: string;
  readonly at: string;
  /** The peer's flows were written into the kernel (conntrackd -c). */
  readonly committed: boolean;
  readonly commitError?: string;
  /** EIPs announced by gratuitous ARP, after the commit. */
  readonly announced: readonly string[];
  readonly interface: string;
  readonly ms: number;
}

const COMMIT_TIMEOUT_MS = 1000;
const STATS_TIMEOUT_MS = 2000;

/**
 * Replica sync: renders conntrackd's configuration, supervises conntrackd, reads its
 * statistics into metrics and health, compares the desired state with the peer's, and performs
 * a takeover. Off (and quiet after one log line) without NATGW_HA_PEERS or without conntrackd:
 * then natgw runs exactly as without this part. Nothing here can stop NAT: every failure is
 * logged, counted and retried.
 */
export class HaManager {
  private readonly ha: HaConfig | undefined;
  private readonly paths: ConntrackdPaths;
  private supervisor: Supervised | undefined;
  /** One digest comparison per peer API. */
  private peers: PeerCompare[] = [];
  private offReason: string | null = null;
  private timer: NodeJS.Timeout | undefined;
  private ticking: Promise<void> | undefined;
  private localAddress: string | undefined;
  private stats: ConntrackdStats | null = null;
  private statsError: string | null = null;
  private lastExchange: number | null = null;
  private lastReceived: { pid: number; packets: number } | null = null;
  private needsResync = false;
  private lastTakeover: TakeoverResult | null = null;
  private stopped = false;
  private join: JoinState | null = null;

  constructor(private readonly d: HaDeps) {
    this.ha = d.config.ha;
    this.paths = conntrackdPaths(d.config.stateDir);
  }

  private get enabled(): boolean {
    return this.supervisor !== undefined;
  }

  private get activeActive(): boolean {
    return (this.ha?.peers.length ?? 0) > 0 && this.ha?.mode === 'active-active';
  }

  /** Start sync (where configured and installed) and the peer comparison (where configured). */
  async start(): Promise<void> {
    const ha = this.ha;
    this.peers = (ha?.peerApis ?? []).map(
      (api) =>
        new PeerCompare({
          api,
          tokenFile: ha?.peerTokenFile,
          periodMs: this.d.config.resyncMs,
          log: this.d.log,
          own: this.d.digest,
          onResult: () => this.observePeers(),
        }),
    );
    for (const p of this.peers) p.start();
    const peer = ha?.peers[0];
    if (!ha || peer === undefined) {
      this.offReason = 'NATGW_HA_PEERS is not set';
      this.d.log.info('replica sync off: NATGW_HA_PEERS is not set (natgw runs as a single gateway)');
      return;
    }
    const probe = await this.d.exec.run({ file: ha.conntrackd, args: ['-v'], timeoutMs: 5000 });
    if (probe.failedToStart) {
      this.offReason = `${ha.conntrackd} is not installed`;
      this.d.log.warn(
        { conntrackd: ha.conntrackd },
        'replica sync off: conntrackd is not installed (install conntrackd, or set NATGW_CONNTRACKD); NAT runs as without replicas',
      );
      return;
    }
    if (this.stopped) return;
    if (this.activeActive) {
      this.d.holdReady?.("replica sync: waiting for the peer's flows (active-active join)");
      // Bounded: a conntrackd that never comes up (no sync interface yet) must not keep the
      // replica out of service for good; its health says why.
      setTimeout(() => {
        if (this.join !== null && this.join.state !== 'waiting') return;
        this.d.log.warn({ join: this.join }, "active-active join did not finish in 3x NATGW_HA_SYNC_TIMEOUT; ready without the peer's flows");
        this.d.holdReady?.(null);
      }, 3 * ha.syncTimeoutMs).unref();
      await this.tcpTracking();
      if (!ha.snatPortSlice) {
        this.d.log.warn('active-active without NATGW_SNAT_PORT_SLICE: two replicas may give one EIP port to two flows (give each replica its own slice)');
      }
    }
    this.d.metrics.enabled.set(1);
    this.supervisor = new Supervised({
      file: ha.conntrackd,
      args: ['-C', this.paths.config],
      log: this.d.log,
      beforeStart: () => this.prepare(),
      onSpawn: (pid) => {
        this.needsResync = true;
        void fs.writeFile(this.paths.pid, `${pid}\n`).catch(() => undefined);
      },
      onState: (s) => {
        this.d.metrics.conntrackdUp.set(s === 'running' ? 1 : 0);
        if (s === 'backoff') this.d.metrics.restarts.inc();
        this.updateHealth();
      },
      // conntrackd marks its own severity: keep its errors visible, its chatter at debug.
      onLine: (line) => {
        if (/\[(ERROR|WARNING)\]/.test(line)) this.d.log.warn({ line }, 'conntrackd says');
        else this.d.log.debug({ line }, 'conntrackd says');
      },
    });
    this.d.log.info(
      { peers: ha.peers, group: ha.syncGroup, port: ha.port, interface: ha.syncInterface, config: this.paths.config },
      `replica sync on: supervising conntrackd (${ha.syncGroup ? `NOTRACK over multicast to ${ha.syncGroup}` : 'FTFW over UDP'})`,
    );
    this.supervisor.start();
    const period = Math.max(250, Math.min(2000, Math.floor(ha.syncTimeoutMs / 4)));
    const tick = (): void => {
      this.ticking = this.poll().finally(() => {
        this.ticking = undefined;
        if (!this.stopped) this.timer = setTimeout(tick, period).unref();
      });
    };
    this.timer = setTimeout(tick, period).unref();
  }

  /**
   * Active-active TCP tracking in this pod's network namespace:
   * - nf_conntrack_tcp_be_liberal=1: ECMP may send a flow's two directions through two
   *   replicas, and move either at any time: a replica then sees acknowledgements of data that
   *   went through the other, which window tracking marks invalid (and the forward chain drops).
   *   Entries conntrackd writes are liberal already; the replica's own are not.
   * - nf_conntrack_tcp_loose=0: a packet of an established flow that reaches a replica before
   *   the flow's state has must stay invalid (dropped, then retransmitted once the state is
   *   there). Picked up mid-stream it would become an untranslated entry of its own: the reply
   *   to an EIP then meets no socket and is answered with a reset, and the synchronised state
   *   clashes with it.
   */
  private async tcpTracking(): Promise<void> {
    for (const [name, value, why] of [
      ['nf_conntrack_tcp_be_liberal', '1', 'a flow may take two replicas, one per direction'],
      ['nf_conntrack_tcp_loose', '0', 'a flow is never picked up mid-stream before its state arrives'],
    ] as const) {
      const file = `/proc/sys/net/netfilter/${name}`;
      try {
        if ((await fs.readFile(file, 'utf8')).trim() === value) continue;
        await fs.writeFile(file, `${value}\n`);
        this.d.log.info(`active-active: ${name}=${value} (${why})`);
      } catch (e) {
        this.d.log.warn({ err: e instanceof Error ? e.message : String(e) }, `active-active: cannot set ${name}=${value}; without it ${why} is not assured`);
      }
    }
  }

  /**
   * Packets a peer hands off (NatTables.handOff) arrive on the sync interface from sources
   * routed elsewhere (the VPC's clients, the servers outside): strict reverse-path filtering
   * there would drop every one. Loose (2) keeps the check that the source is routable at all.
   */
  private async looseReversePath(links: readonly LinkAddresses[] | undefined, local: string): Promise<void> {
    const ifname = links?.find((l) => (l.addr_info ?? []).some((a) => a.local === local))?.ifname;
    if (ifname === undefined || !isInterfaceName(ifname) || isIpv6(local)) return;
    const file = (dev: string) => `/proc/sys/net/ipv4/conf/${dev}/rp_filter`;
    try {
      const [all, own] = await Promise.all([fs.readFile(file('all'), 'utf8'), fs.readFile(file(ifname), 'utf8')]);
      if (Math.max(Number(all), Number(own)) !== 1) return;
      await fs.writeFile(file(ifname), '2\n');
      this.d.log.info(`active-active: ${ifname} rp_filter=2 (packets the peers hand off arrive there from sources routed elsewhere)`);
    } catch (e) {
      this.d.log.warn(
        { err: e instanceof Error ? e.message : String(e) },
        `active-active: cannot loosen rp_filter on ${ifname}; packets the peers hand off may be dropped there`,
      );
    }
  }

  /** Before each conntrackd start: the address to sync from, the config, no leftovers of a dead instance. */
  private async prepare(): Promise<void> {
    const ha = this.ha as HaConfig;
    const peer = ha.peers[0] as string;
    const links = await this.links();
    const local = ha.syncAddress ?? addressOf(links, ha.syncInterface, peer);
    this.localAddress = local;
    if (this.activeActive && ha.handOff !== false) await this.looseReversePath(links, local);
    await fs.mkdir(this.paths.dir, { recursive: true, mode: 0o700 });
    const text = renderConntrackdConf({
      localAddress: local,
      peerAddress: peer,
      peerAddresses: ha.peers,
      ...(ha.syncGroup ? { multicastGroup: ha.syncGroup } : {}),
      syncInterface: ha.syncInterface,
      port: ha.port,
      paths: this.paths,
      mode: ha.mode ?? 'takeover',
      ownAddresses: (links ?? []).flatMap((l) => l.addr_info ?? []).flatMap((a) => (a.scope === 'global' && a.local ? [a.local] : [])),
    });
    await fs.writeFile(this.paths.config, text, { mode: 0o600 });
    await killOrphan(this.paths.pid, this.paths.config, 'conntrackd', this.d.log);
    // conntrackd refuses to start while its lock file exists; only a dead instance of ours can have left it.
    await fs.unlink(this.paths.lock).catch(() => undefined);
  }

  /** Every interface with its addresses (`ip -j addr show`); undefined where unreadable. */
  private async links(): Promise<LinkAddresses[] | undefined> {
    const r = await this.d.exec.run({ file: 'ip', args: ['-j', 'addr', 'show'], timeoutMs: 5000 });
    return r.exitCode === 0 ? (JSON.parse(r.stdout || '[]') as LinkAddresses[]) : undefined;
  }

  private conntrackd(args: readonly string[], timeoutMs: number) {
    return this.d.exec.run({ file: (this.ha as HaConfig).conntrackd, args: ['-C', this.paths.config, ...args], timeoutMs });
  }

  /** Read conntrackd's statistics; after each (re)start, ask the peer for its flows and send ours. */
  private async poll(): Promise<void> {
    const sup = this.supervisor;
    const pid = sup?.pid;
    if (!sup || pid === undefined) {
      this.stats = null;
      this.updateHealth();
      return;
    }
    const r = await this.conntrackd(['-s'], STATS_TIMEOUT_MS).catch((e: unknown) => ({ exitCode: -1, stdout: '', stderr: String(e) }));
    if (r.exitCode !== 0) {
      this.statsError = `conntrackd does not answer on ${this.paths.socket}: ${(r.stderr || r.stdout).trim().split('\n').pop() ?? ''}`;
      this.updateHealth();
      return;
    }
    try {
      const s = parseConntrackdStats(r.stdout);
      this.stats = s;
      this.statsError = null;
      this.d.metrics.observeStats(s);
      const prev = this.lastReceived;
      if (prev === null || prev.pid !== pid ? s.channel.packetsReceived > 0 : s.channel.packetsReceived > prev.packets) {
        this.lastExchange = Date.now();
        this.d.metrics.lastExchange.set(this.lastExchange / 1000);
      }
      this.lastReceived = { pid, packets: s.channel.packetsReceived };
    } catch (e) {
      this.statsError = e instanceof Error ? e.message : String(e);
    }
    if (this.needsResync) {
      this.needsResync = false;
      if (this.activeActive) await this.joinPeer();
      else {
        // A fresh conntrackd has an empty external cache and the peer does not know it restarted.
        await this.conntrackd(['-n'], STATS_TIMEOUT_MS).catch(() => undefined);
        await this.conntrackd(['-B'], STATS_TIMEOUT_MS).catch(() => undefined);
      }
    }
    this.updateHealth();
  }

  /** Flows conntrackd wrote into this kernel from the peer so far (active-active). */
  private injected(): number {
    const e = this.stats?.external;
    return e ? e.created + e.updated + e.createFailed + e.updateFailed : 0;
  }

  /**
   * Active-active (re)join: send this kernel's flows to the peers, and have each peer resend its
   * whole kernel table (conntrackd -R then -B, POST /v1/ha/resend): flows it received from
   * others never enter its conntrackd's internal cache, so its conntrackd alone would not resend
   * them. Readiness is held until they arrived (or no peer can be asked, or the sync timeout
   * passed): a replica that ECMP sends traffic to before it holds the established flows would
   * drop them. A peer that cannot be asked is down or joining itself: it has nothing to give.
   */
  private async joinPeer(): Promise<void> {
    const ha = this.ha as HaConfig;
    const apis = ha.peerApis;
    const started = Date.now();
    const base = this.injected();
    const set = (state: JoinState['state'], expected: number | null, error: string | null): void => {
      this.join = {
        state,
        since: new Date(started).toISOString(),
        expected,
        received: this.injected() - base,
        error,
        ms: state === 'waiting' ? null : Date.now() - started,
      };
    };
    set('waiting', null, null);
    await this.conntrackd(['-B'], STATS_TIMEOUT_MS).catch(() => undefined);
    const asked = await Promise.allSettled(apis.map((api) => requestResend(api, ha.peerTokenFile, ha.syncTimeoutMs)));
    const errors = asked.flatMap((r, i) => (r.status === 'rejected' ? [`${apis[i]}: ${r.reason instanceof Error ? r.reason.message : String(r.reason)}`] : []));
    // Every peer holds every flow: the first to answer fills the kernel, the others' copies
    // count as updates, so the sum is what arrives.
    const expected = asked.reduce((n, r) => n + (r.status === 'fulfilled' ? r.value : 0), 0);
    if (errors.length > 0) this.d.log.warn({ errors }, 'active-active join: some peers could not resend their flows (down or joining themselves)');
    if (errors.length === apis.length) {
      const msg =
        apis.length === 0
          ? 'NATGW_HA_PEER_API is not set: asked conntrackd for a resync instead (flows the peer received from others are not resent)'
          : errors.join('; ');
      if (apis.length === 0) await this.conntrackd(['-n'], STATS_TIMEOUT_MS).catch(() => undefined);
      set('gave-up', null, msg);
      this.d.log.warn({ err: msg }, 'active-active join: no peer could resend its flows; ready without them (a peer that is down has none to give)');
      this.d.holdReady?.(null);
      return;
    }
    set('waiting', expected, null);
    const deadline = Date.now() + ha.syncTimeoutMs;
    while (!this.stopped && Date.now() < deadline && this.injected() - base < expected) {
      await new Promise((r) => setTimeout(r, 50));
      const r = await this.conntrackd(['-s'], STATS_TIMEOUT_MS).catch(() => undefined);
      if (r?.exitCode === 0) {
        try {
          this.stats = parseConntrackdStats(r.stdout);
        } catch {
          // read again at the next turn
        }
      }
    }
    const complete = this.injected() - base >= expected;
    set(complete ? 'done' : 'gave-up', expected, complete ? null : `only ${this.injected() - base} of ${expected} flows arrived in ${ha.syncTimeoutMs} ms`);
    if (complete) this.d.log.info({ flows: expected, ms: Date.now() - started }, "active-active join: the peer's flows are in the kernel");
    else this.d.log.warn({ join: this.join }, "active-active join: not all of the peer's flows arrived; ready anyway (NATGW_HA_SYNC_TIMEOUT)");
    this.d.holdReady?.(null);
  }

  /**
   * The peer (re)joined (POST /v1/ha/resend): refill conntrackd's internal cache from the whole
   * kernel table, the flows received from others included, and send it in bulk.
   */
  async resend(): Promise<{ resent: boolean; flows: number; reason?: string }> {
    if (this.supervisor?.state !== 'running') {
      return { resent: false, flows: 0, reason: this.enabled ? 'conntrackd is not running' : `replica sync off: ${this.offReason ?? 'not started'}` };
    }
    const fail = (e: unknown) => ({ exitCode: -1, stdout: '', stderr: String(e) });
    const r = await this.conntrackd(['-R'], STATS_TIMEOUT_MS).catch(fail);
    if (r.exitCode !== 0) return { resent: false, flows: 0, reason: `conntrackd -R: ${(r.stderr || r.stdout).trim()}` };
    const s = await this.conntrackd(['-s'], STATS_TIMEOUT_MS).catch(fail);
    let flows = 0;
    try {
      flows = parseConntrackdStats(s.stdout).internal.active;
    } catch {
      // counted as none: the peer then waits for nothing
    }
    const b = await this.conntrackd(['-B'], STATS_TIMEOUT_MS).catch(fail);
    if (b.exitCode !== 0) return { resent: false, flows: 0, reason: `conntrackd -B: ${(b.stderr || b.stdout).trim()}` };
    this.d.log.info({ flows }, 'the peer (re)joined: resent the kernel table to it');
    return { resent: true, flows };
  }

  /** The gauges say it of all peers: reachable while every one answers, divergent while any one differs. */
  private observePeers(): void {
    const views = this.peers.map((p) => p.last);
    this.d.metrics.peerReachable.set(views.every((v) => v.error === null) ? 1 : 0);
    if (views.some((v) => v.divergent === true)) this.d.metrics.peerDivergent.set(1);
    else if (views.every((v) => v.divergent === false)) this.d.metrics.peerDivergent.set(0);
  }

  health(): { enabled: boolean; healthy: boolean; reasons: string[] } {
    if (!this.enabled) return { enabled: false, healthy: false, reasons: [`replica sync off: ${this.offReason ?? 'not started'}`] };
    const reasons: string[] = [];
    const sup = this.supervisor as Supervised;
    const ha = this.ha as HaConfig;
    if (sup.state !== 'running') {
      const last = sup.lastExit;
      const why = last ? (last.error ?? (last.signal ? `killed by ${last.signal}` : `exit ${last.code}`)) : 'starting';
      reasons.push(`conntrackd is not running (${sup.state}; last: ${why}; restarts: ${sup.restarts})`);
    } else if (this.statsError) {
      reasons.push(this.statsError);
    } else if (this.lastExchange === null || Date.now() - this.lastExchange > ha.syncTimeoutMs) {
      reasons.push(
        `nothing received from ${ha.peers.length > 1 ? `the peers ${ha.peers.join(', ')}` : `the peer ${ha.peers[0]}`} for ${this.lastExchange === null ? 'ever' : `${Math.round((Date.now() - this.lastExchange) / 1000)}s`} (NATGW_HA_SYNC_TIMEOUT ${ha.syncTimeoutMs}ms)`,
      );
    }
    return { enabled: true, healthy: reasons.length === 0, reasons };
  }

  private wasHealthy: boolean | null = null;

  /**
   * Health is computed from the clock as well as from polls, so whoever reads it (GET /v1/ha)
   * also records it: the metric and the log line never lag behind what the API just answered.
   */
  private updateHealth(): ReturnType<HaManager['health']> {
    const h = this.health();
    this.d.metrics.healthy.set(h.healthy ? 1 : 0);
    if (!h.enabled || h.healthy === this.wasHealthy) return h;
    // Only changes are logged: an operator sees when sync was lost and when it came back.
    if (h.healthy) this.d.log.info({ peer: this.ha?.peers[0] }, 'replica sync healthy');
    else if (this.wasHealthy) this.d.log.warn({ reasons: h.reasons }, 'replica sync unhealthy (NAT is not affected)');
    this.wasHealthy = h.healthy;
    return h;
  }

  async status(): Promise<{ digest: string } & Record<string, unknown>> {
    const sup = this.supervisor;
    return {
      enabled: this.enabled,
      ...this.d.role.status(),
      snatPortSlice: this.ha?.snatPortSlice ?? null,
      join: this.join,
      digest: await this.d.digest(),
      health: this.updateHealth(),
      conntrackd: sup
        ? { state: sup.state, pid: sup.pid ?? null, restarts: sup.restarts, lastExit: sup.lastExit, config: this.paths.config, socket: this.paths.socket }
        : null,
      sync: this.ha?.peers.length
        ? {
            peer: this.ha.peers[0],
            peers: this.ha.peers,
            group: this.ha.syncGroup ?? null,
            localAddress: this.localAddress ?? null,
            port: this.ha.port,
            lastExchange: this.lastExchange === null ? null : new Date(this.lastExchange).toISOString(),
            stats: this.stats,
          }
        : null,
      peerApi: this.peers[0]?.last ?? null,
      peerApis: this.peers.map((p) => p.last),
      lastTakeover: this.lastTakeover,
    };
  }

  /**
   * This replica becomes the active path: first the peer's flows into the kernel (so the
   * first packet of every moved flow finds its NAT mapping), then gratuitous ARP for every
   * IPv4 EIP (so the external segment sends to this replica). Without sync it still announces.
   */
  async takeover(reason: string): Promise<TakeoverResult> {
    const started = Date.now();
    if (this.activeActive) {
      // Every replica forwards already and holds every flow; the EIPs are routed, not ARPed.
      const state = await this.d.loadState();
      return {
        reason,
        at: new Date(started).toISOString(),
        committed: false,
        commitError: 'active-active: nothing to take over',
        announced: [],
        interface: state.interfaces.ext,
        ms: Date.now() - started,
      };
    }
    let committed = false;
    let commitError: string | undefined;
    if (this.supervisor?.state === 'running') {
      const r = await this.conntrackd(['-c'], COMMIT_TIMEOUT_MS).catch((e: unknown) => ({ exitCode: -1, stdout: '', stderr: String(e), timedOut: false }));
      committed = r.exitCode === 0;
      if (!committed) commitError = (r.stderr || r.stdout).trim() || `exit ${r.exitCode}`;
    } else {
      commitError = this.enabled ? 'conntrackd is not running' : `replica sync off: ${this.offReason ?? 'not started'}`;
    }
    this.d.role.activate(reason);
    this.d.tookOver?.();
    const state = await this.d.loadState();
    const announced = state.eips.map((e) => e.address);
    for (const e of state.eips) this.d.announce(eipInterface(state.interfaces, e), e.address);
    const result: TakeoverResult = {
      reason,
      at: new Date(started).toISOString(),
      committed,
      commitError,
      announced,
      interface: state.interfaces.ext,
      ms: Date.now() - started,
    };
    this.lastTakeover = result;
    this.d.metrics.takeovers.inc({ outcome: committed ? 'committed' : 'announced-only' });
    this.d.log.info({ ...result, announced: announced.length }, 'takeover: this replica is the active path');
    return result;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.ticking;
    await Promise.all(this.peers.map((p) => p.stop()));
    await this.supervisor?.stop();
    await fs.unlink(this.paths.pid).catch(() => undefined);
  }
}

interface LinkAddresses {
  readonly ifname?: string;
  readonly addr_info?: ReadonlyArray<{ readonly family?: string; readonly local?: string; readonly scope?: string }>;
}

/** The local end of the sync channel: the sync interface's address of the peer's family. */
function addressOf(links: readonly LinkAddresses[] | undefined, ifname: string | undefined, peer: string): string {
  if (!ifname) throw new Error('set NATGW_HA_SYNC_INTERFACE or NATGW_HA_SYNC_ADDRESS: conntrackd needs the local end of the sync channel');
  const link = links?.find((l) => l.ifname === ifname);
  if (!link) throw new Error(`sync interface ${ifname} not found (yet)`);
  const want = isIpv6(peer) ? 'inet6' : 'inet';
  const a = (link.addr_info ?? []).find((x) => x.family === want && x.local && (want === 'inet' || x.scope === 'global'));
  if (!a?.local) throw new Error(`sync interface ${ifname} has no ${want === 'inet' ? 'IPv4' : 'IPv6'} address (yet)`);
  return a.local;
}
