import { promises as fs } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import type { BgpConfig, Config } from '../config/config.js';
import type { Executor } from '../system/exec.js';
import { canonicalIp } from '../model/net.js';
import { killOrphan, Supervised } from '../system/supervised.js';
import { errorOf, parseBfdSessions, parseProtocols, parseReplies, parseRoutePrefixes, type BfdRow, type ProtocolRow } from './birdc.js';
import { announceOf, gateOf, prefixOf, type Gate } from './plan.js';
import { renderBirdConf, routerIdOf, sessionsOf, type Session, type Skipped } from './render.js';
import { RoutingMetrics } from './metrics.js';

export interface RoutingDeps {
  readonly config: Config;
  readonly exec: Executor;
  readonly log: Logger;
  readonly registry: Registry;
  /** The agent's readiness now. */
  readonly readiness: () => { readonly ready: boolean; readonly reasons: readonly string[] };
  /** What the engine applied last (the EIPs and the external interface), undefined before the first apply. */
  readonly applied: () => { readonly eips: readonly { readonly address: string }[]; readonly interfaces: { readonly ext: string } } | undefined;
  /** The replica's role (takeover mode); 'active' without replicas. */
  readonly role: () => 'active' | 'standby';
  /** Ask for a full sync (the reconciler's); the EIPs wait for one after the external interface came back. */
  readonly requestSync?: (why: string) => void;
}

export interface BirdPaths {
  readonly dir: string;
  readonly config: string;
  readonly socket: string;
  readonly pid: string;
}

const birdPaths = (stateDir: string): BirdPaths => {
  const dir = join(stateDir, 'bird');
  return { dir, config: join(dir, 'bird.conf'), socket: join(dir, 'bird.ctl'), pid: join(dir, 'bird.pid') };
};

/** How often sessions and advertisements are read from BIRD, and the external link looked at without an event. */
const POLL_MS = 2000;
const BIRDC_TIMEOUT_MS = 3000;

interface LinkView {
  readonly up: boolean;
  /** The interface's addresses that are not EIPs, in the kernel's order. */
  readonly own: readonly string[];
}

interface SessionView {
  readonly name: string;
  readonly peer: string;
  readonly local: string;
  readonly state: string;
  readonly established: boolean;
  readonly since: string | null;
  readonly info: string;
  readonly bfd: string | null;
  readonly exported: readonly string[];
}

/**
 * EIPs announced by BGP (issue 30): natgw renders bird.conf from its configuration and what it
 * applied, supervises BIRD (one process, BFD built in, a control socket), and decides what BIRD
 * offers: every EIP as a host route, next hop this replica, while the data plane is ready
 * (readiness, external interface up and synced, active role); nothing otherwise. A change of
 * that decision rewrites the configuration and reloads it (`birdc configure`), which withdraws
 * in milliseconds. A dead natgw takes BIRD with it (setpriv --pdeathsig), which closes the
 * sessions; a dead link stops BFD, which makes the peers drop the routes within its detection
 * time. Off without NATGW_BGP_PEERS; nothing here can stop NAT.
 */
export class RoutingManager {
  private readonly bgp: BgpConfig | undefined;
  readonly paths: BirdPaths;
  private readonly metrics: RoutingMetrics | undefined;
  private supervisor: Supervised | undefined;
  private offReason: string | null = null;
  private link: LinkView | undefined;
  private linkError: string | null = null;
  private syncedSinceExtUp = true;
  private gate: Gate = { open: false, reasons: ['starting'] };
  private announced: readonly string[] = [];
  private sessions: readonly Session[] = [];
  private skipped: readonly Skipped[] = [];
  private routerId: string | undefined;
  private written: string | undefined;
  private reloadError: string | null = null;
  private lastChange: { at: string; announced: number; reason: string } | null = null;
  private views: readonly SessionView[] = [];
  private pollError: string | null = null;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  /** One evaluation at a time; a request during one runs once more after it. */
  private running: Promise<void> | undefined;
  private again: string | undefined;

  constructor(private readonly d: RoutingDeps) {
    this.bgp = d.config.bgp;
    this.paths = birdPaths(d.config.stateDir);
    if (this.bgp) this.metrics = new RoutingMetrics(d.registry);
  }

  get enabled(): boolean {
    return this.supervisor !== undefined;
  }

  /** Start BIRD (where configured and installed) and the poll of its sessions. */
  async start(): Promise<void> {
    const bgp = this.bgp;
    if (!bgp) {
      this.offReason = 'NATGW_BGP_PEERS is not set';
      return;
    }
    const probe = await this.d.exec.run({ file: bgp.bird, args: ['--version'], timeoutMs: 5000 });
    if (probe.failedToStart) {
      this.offReason = `${bgp.bird} is not installed`;
      this.d.log.warn(
        { bird: bgp.bird },
        'BGP off: BIRD is not installed (install bird2, or set NATGW_BIRD); the EIPs are not announced by BGP, and get no gratuitous ARP either',
      );
      return;
    }
    if (this.stopped) return;
    this.metrics?.enabled.set(1);
    this.supervisor = new Supervised({
      file: bgp.bird,
      args: ['-f', '-c', this.paths.config, '-s', this.paths.socket],
      log: this.d.log,
      beforeStart: () => this.prepare(),
      onSpawn: (pid) => void fs.writeFile(this.paths.pid, `${pid}\n`).catch(() => undefined),
      onState: (s) => {
        this.metrics?.daemonUp.set(s === 'running' ? 1 : 0);
        if (s === 'backoff') this.metrics?.restarts.inc();
        if (s !== 'running') this.observeSessions([]);
      },
      onLine: (line) => {
        // BIRD marks its severity: <ERR>, <WARN>, <RMT> (a peer's notification), <AUTH>, <BUG>, <FATAL>; <INFO> is chatter.
        if (/<(ERR|WARN|RMT|AUTH|BUG|FATAL)>/.test(line)) this.d.log.warn({ line }, 'bird says');
        else this.d.log.debug({ line }, 'bird says');
      },
    });
    this.d.log.info({ peers: bgp.peers, asn: bgp.asn, peerAsn: bgp.peerAsn, bfd: bgp.bfd, config: this.paths.config }, 'BGP on: supervising BIRD');
    this.supervisor.start();
    const tick = (): void => {
      void this.poll().finally(() => {
        if (!this.stopped) this.timer = setTimeout(tick, POLL_MS).unref();
      });
    };
    this.timer = setTimeout(tick, POLL_MS).unref();
  }

  /** Before each BIRD start: the configuration as of now, no BIRD left running by a killed natgw. */
  private async prepare(): Promise<void> {
    await fs.mkdir(this.paths.dir, { recursive: true, mode: 0o700 });
    await this.refreshLink();
    this.decide();
    const text = this.render();
    await this.write(text);
    await killOrphan(this.paths.pid, this.paths.config, 'BIRD', this.d.log);
  }

  /**
   * Something that may change the decision happened (readiness, an apply, a link event): decide
   * again, and reload BIRD when the configuration changes. Merged with a run in progress.
   */
  changed(why: string, opts: { link?: boolean } = {}): void {
    if (!this.enabled || this.stopped) return;
    if (opts.link) this.linkStale = true;
    if (this.running) {
      this.again ??= why;
      return;
    }
    this.running = this.loop(why).finally(() => {
      this.running = undefined;
    });
  }

  private linkStale = false;
  private applyError: string | null = null;

  /** A full sync succeeded: the external interface's addresses and routes are back if it went down. */
  synced(): void {
    if (this.syncedSinceExtUp) return;
    this.syncedSinceExtUp = true;
    this.changed('synced after the external interface came up');
  }

  private async loop(first: string): Promise<void> {
    let why: string | undefined = first;
    while (why !== undefined && !this.stopped) {
      try {
        if (this.linkStale) {
          this.linkStale = false;
          await this.refreshLink();
        }
        this.decide();
        await this.apply(why);
        this.applyError = null;
      } catch (e) {
        const msg = e instanceof Error ? e.message : String(e);
        // Retried at every poll: said once per distinct failure, and in the status meanwhile.
        if (msg !== this.applyError) this.d.log.warn({ err: e, why }, 'BGP: could not update BIRD (retried at the next change or poll)');
        this.applyError = msg;
      }
      why = this.again;
      this.again = undefined;
    }
  }

  /** The external interface: up with carrier, and its own (non-EIP) addresses. */
  private async refreshLink(): Promise<void> {
    const applied = this.d.applied();
    const ext = applied?.interfaces.ext ?? this.d.config.extInterface;
    const r = await this.d.exec.run({ file: 'ip', args: ['-j', 'addr', 'show', 'dev', ext], timeoutMs: 5000 });
    const wasUp = this.link?.up;
    if (r.exitCode !== 0) {
      this.linkError = `external interface ${ext} not found`;
      this.link = { up: false, own: [] };
    } else {
      const links = JSON.parse(r.stdout || '[]') as Array<{
        flags?: string[];
        addr_info?: Array<{ family?: string; local?: string; scope?: string }>;
      }>;
      const l = links[0];
      const eips = new Set((applied?.eips ?? []).map((e) => canonicalIp(e.address)));
      const own = (l?.addr_info ?? [])
        .filter((a) => a.local !== undefined && a.scope === 'global' && (a.family === 'inet' || a.family === 'inet6'))
        .map((a) => canonicalIp(a.local as string))
        .filter((a) => !eips.has(a));
      const flags = l?.flags ?? [];
      this.linkError = null;
      this.link = { up: flags.includes('UP') && flags.includes('LOWER_UP'), own };
    }
    // Down and back up: addresses and routes may be gone until a full sync restores them. The
    // sync is asked for here, after the up was seen, so one that ended before does not count.
    if (wasUp === false && this.link.up) {
      this.syncedSinceExtUp = false;
      this.d.requestSync?.('external interface up: BGP waits for a full sync before announcing');
    }
  }

  private decide(): void {
    const r = this.d.readiness();
    const gate = gateOf({
      ready: r.ready,
      readyReasons: r.reasons,
      extUp: this.link?.up,
      syncedSinceExtUp: this.syncedSinceExtUp,
      role: this.d.role(),
    });
    if (this.gate.open && !gate.open && this.announced.length > 0) {
      this.metrics?.withdrawals.inc({ reason: gate.why ?? 'not-ready' });
      this.d.log.warn({ reasons: gate.reasons, eips: this.announced.length }, 'BGP: withdrawing the EIPs (data plane not ready)');
    } else if (!this.gate.open && gate.open) {
      this.d.log.info('BGP: data plane ready, announcing the EIPs');
    }
    this.gate = gate;
    this.metrics?.announcing.set(gate.open ? 1 : 0);
    this.announced = announceOf(
      gate,
      (this.d.applied()?.eips ?? []).map((e) => e.address),
    );
  }

  private render(): string {
    const bgp = this.bgp as BgpConfig;
    const own = this.link?.own ?? [];
    const { sessions, skipped } = sessionsOf(bgp.peers, own);
    this.sessions = sessions;
    this.skipped = skipped;
    this.routerId = routerIdOf(bgp.routerId, own);
    if (this.routerId === undefined)
      throw new Error(
        `no BGP router ID: set NATGW_BGP_ROUTER_ID, or give the external interface ${this.d.config.extInterface} an IPv4 address of this replica's own`,
      );
    return renderBirdConf({
      routerId: this.routerId,
      asn: bgp.asn,
      peerAsn: bgp.peerAsn,
      extInterface: this.d.applied()?.interfaces.ext ?? this.d.config.extInterface,
      bfd: bgp.bfd,
      sessions,
      announce: this.announced,
    });
  }

  private async write(text: string): Promise<void> {
    const tmp = `${this.paths.config}.tmp`;
    await fs.writeFile(tmp, text, { mode: 0o600 });
    await fs.rename(tmp, this.paths.config);
    this.written = text;
  }

  /** Rewrite and reload where the configuration changed. */
  private async apply(why: string): Promise<void> {
    const text = this.render();
    if (text === this.written && this.reloadError === null) return;
    await this.write(text);
    if (this.supervisor?.state !== 'running') return;
    const r = await this.birdc(['configure']);
    const err = r.error ?? null;
    this.reloadError = err;
    if (err) {
      this.d.log.error({ error: err, config: this.paths.config }, 'BGP: BIRD refused its new configuration');
      return;
    }
    this.lastChange = { at: new Date().toISOString(), announced: this.announced.length, reason: why };
    this.d.log.debug({ why, announced: this.announced.length, sessions: this.sessions.length }, 'BGP: BIRD reconfigured');
    void this.poll();
  }

  private async birdc(args: readonly string[]): Promise<{ replies: ReturnType<typeof parseReplies>; error?: string }> {
    const bgp = this.bgp as BgpConfig;
    const r = await this.d.exec.run({ file: bgp.birdc, args: ['-v', '-s', this.paths.socket, ...args], timeoutMs: BIRDC_TIMEOUT_MS });
    const replies = parseReplies(r.stdout);
    const bad = errorOf(replies);
    if (bad) return { replies, error: `${bad.code} ${bad.text}` };
    if (r.exitCode !== 0 && replies.length === 0) return { replies, error: (r.stderr || r.stdout).trim() || `exit ${r.exitCode}` };
    return { replies };
  }

  /** Sessions, BFD and what each established session exports, read from BIRD; the link looked at again. */
  private async poll(): Promise<void> {
    if (this.stopped) return;
    this.changed('poll', { link: true });
    if (this.supervisor?.state !== 'running') return;
    try {
      const protocols = await this.birdc(['show', 'protocols']);
      if (protocols.error) throw new Error(`BIRD does not answer on ${this.paths.socket}: ${protocols.error}`);
      const rows = parseProtocols(protocols.replies);
      const bfd = this.bgp?.bfd ? parseBfdSessions((await this.birdc(['show', 'bfd', 'sessions'])).replies) : [];
      const views: SessionView[] = [];
      for (const s of this.sessions) {
        const row = rows.find((p) => p.name === s.name);
        const established = row?.state === 'up' && /^Established/.test(row.info);
        const exported = established ? parseRoutePrefixes((await this.birdc(['show', 'route', 'export', s.name])).replies) : [];
        views.push(viewOf(s, row, bfd, exported));
      }
      this.pollError = null;
      this.observeSessions(views);
    } catch (e) {
      this.pollError = e instanceof Error ? e.message : String(e);
      this.observeSessions([]);
    }
  }

  private observeSessions(views: readonly SessionView[]): void {
    const before = new Map(this.views.map((v) => [v.peer, v.established]));
    for (const v of views) {
      if (before.get(v.peer) !== v.established && (v.established || before.get(v.peer)))
        this.d.log.info({ peer: v.peer, state: v.state, info: v.info }, v.established ? 'BGP session established' : 'BGP session down');
    }
    this.views = views;
    const m = this.metrics;
    if (!m) return;
    for (const peer of this.bgp?.peers ?? []) m.sessionUp.set({ peer }, views.find((v) => v.peer === peer)?.established ? 1 : 0);
    m.sessionsUp.set(views.filter((v) => v.established).length);
    m.eipAdvertised.reset();
    let advertised = 0;
    for (const e of this.eipViews()) {
      m.eipAdvertised.set({ eip: e.address }, e.peers.length);
      if (e.peers.length > 0) advertised++;
    }
    m.eipsAdvertised.set(advertised);
  }

  private eipViews(): { address: string; prefix: string; offered: boolean; advertised: boolean; peers: string[] }[] {
    const offered = new Set(this.announced);
    const all = [...new Set((this.d.applied()?.eips ?? []).map((e) => canonicalIp(e.address)))].sort();
    return all.map((address) => {
      const prefix = prefixOf(address);
      const peers = this.views.filter((v) => v.exported.includes(prefix)).map((v) => v.peer);
      return { address, prefix, offered: offered.has(address), advertised: peers.length > 0, peers };
    });
  }

  health(): { enabled: boolean; healthy: boolean; reasons: string[] } {
    if (!this.enabled) return { enabled: false, healthy: false, reasons: [`BGP off: ${this.offReason ?? 'not started'}`] };
    const reasons: string[] = [];
    const sup = this.supervisor as Supervised;
    if (sup.state !== 'running') {
      const last = sup.lastExit;
      const why = last ? (last.error ?? (last.signal ? `killed by ${last.signal}` : `exit ${last.code}`)) : 'starting';
      reasons.push(`BIRD is not running (${sup.state}; last: ${why}; restarts: ${sup.restarts})`);
    }
    if (this.pollError) reasons.push(this.pollError);
    if (this.reloadError) reasons.push(`BIRD refused its configuration: ${this.reloadError}`);
    if (this.applyError) reasons.push(this.applyError);
    if (this.linkError) reasons.push(this.linkError);
    for (const s of this.skipped) reasons.push(`peer ${s.peer}: ${s.reason}`);
    for (const v of this.views) if (!v.established) reasons.push(`session with ${v.peer} is ${v.info || v.state}`);
    return { enabled: true, healthy: reasons.length === 0, reasons };
  }

  /** GET /v1/bgp: the daemon, the decision and its reasons, each session, each EIP's advertisement (read from BIRD now). */
  async status(): Promise<Record<string, unknown>> {
    if (this.enabled) {
      await this.running;
      await this.poll();
    }
    const sup = this.supervisor;
    const bgp = this.bgp;
    return {
      enabled: this.enabled,
      ...(this.enabled ? {} : { off: this.offReason ?? 'not started' }),
      asn: bgp?.asn ?? null,
      peerAsn: bgp?.peerAsn ?? null,
      routerId: this.routerId ?? null,
      bfd: bgp?.bfd ?? null,
      bird: sup
        ? { state: sup.state, pid: sup.pid ?? null, restarts: sup.restarts, lastExit: sup.lastExit, config: this.paths.config, socket: this.paths.socket }
        : null,
      announcing: this.gate.open,
      reasons: this.gate.reasons,
      lastChange: this.lastChange,
      health: this.health(),
      sessions: [
        ...this.views.map((v) => ({ ...v, exported: v.exported.length })),
        ...this.skipped.map((s) => ({ peer: s.peer, state: 'not configured', established: false, info: s.reason })),
      ],
      eips: this.eipViews(),
    };
  }

  /** Stop BIRD (SIGTERM: it tells each peer it is going, and the peers drop its routes at once). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.running?.catch(() => undefined);
    await this.supervisor?.stop();
    await fs.unlink(this.paths.pid).catch(() => undefined);
  }
}

function viewOf(s: Session, row: ProtocolRow | undefined, bfd: readonly BfdRow[], exported: readonly string[]): SessionView {
  const established = row?.state === 'up' && /^Established/.test(row.info);
  return {
    name: s.name,
    peer: s.peer,
    local: s.local,
    state: row?.state ?? 'unknown',
    established,
    since: row?.since ?? null,
    info: row?.info ?? '',
    bfd: bfd.find((b) => canonicalIp(b.peer) === s.peer)?.state ?? null,
    exported,
  };
}
