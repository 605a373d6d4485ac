import { countDraining } from '../dataplane/draining.js';
import { promises as fs } from 'node:fs';
import type http from 'node:http';
import type https from 'node:https';
import type { Config } from '../config/config.js';
import { daemonLogger } from '../system/logger.js';
import { SystemExecutor } from '../system/exec.js';
import { Engine } from '../engine/engine.js';
import { LibnftClient } from '../dataplane/netfilter/nft/libnft.js';
import { TOP_DESTINATIONS } from '../observe/portUsage.js';
import { Agent } from '../api/agent.js';
import { Reconciler } from './reconciler.js';
import { LinkMonitor } from './linkMonitor.js';
import { RestartHygiene } from './hygiene.js';
import { digestOf } from '../api/stateDoc.js';
import { StartupError, claimSingleton, closeServer, listenTcp, listenUnix, tcpSettings } from './listeners.js';
import { enableTimeline, timelineBegunAs, timelineEnd, timelineMark, timelineStart } from '../system/timeline.js';
import { uplinkNames } from '../model/uplinks.js';
import type { DesiredState } from '../state/state.js';

/**
 * `natgw serve` (SPEC §4.1): serve the API at once (Unix socket, and TCP where configured),
 * then wait for the interfaces, reconcile and report ready; keep reconciling on a timer and
 * on link events. SIGTERM/SIGINT: stop accepting, finish the running apply (and the ones
 * already accepted), exit 0.
 */
export async function serve(config: Config): Promise<number> {
  const log = daemonLogger(config.logLevel);
  // Debug level: the start's critical path up to its first sync's end (bench/restoreTimeline.ts).
  if (log.isLevelEnabled('debug')) {
    enableTimeline(true);
    timelineStart('serve');
  }
  let tcp: Awaited<ReturnType<typeof tcpSettings>>;
  try {
    tcp = await tcpSettings(config);
  } catch (e) {
    if (e instanceof StartupError) {
      process.stderr.write(`Error: ${e.message}\n`);
      log.fatal({ reason: e.message }, 'refusing to start');
      return 1;
    }
    throw e;
  }

  const singleton = await claimSingleton(config.socket);
  if (!singleton) {
    process.stderr.write(`Error: another natgw daemon is serving ${config.socket}\n`);
    return 1;
  }

  const exec = new SystemExecutor(log, { deadlineMs: config.toolTimeoutMs });
  // Only the daemon: its helper serves every change that follows; a one-shot run would pay its start.
  const nft = config.libnftables === 'auto' ? new LibnftClient(exec, log, config.toolTimeoutMs) : undefined;
  const engine = new Engine({ config, exec, log, ...(nft ? { nft } : {}) });

  // What the first sync does not need (the metrics and prom-client, the conntrack observer,
  // replica sync, BGP and the API's express) is imported, not loaded before this module: it
  // loads beside the first sync. The socket's claim (above) already makes this daemon the only
  // writer; one that then cannot listen stops syncing and exits.
  const parts = startParts();
  const hygiene = new RestartHygiene({ config, conntrack: engine.conntrack, link: engine.link, role: engine.role, log });
  const agent: Agent = new Agent({ engine, log, metrics: parts.then((p) => p.metrics), hygiene });

  /** The daemon's parts that load beside the first sync. */
  async function startParts() {
    const [{ Observer, daemonMetrics }, { HaManager }, { HaMetrics }, { RoutingManager }] = await Promise.all([
      import('../observe/observer.js'),
      import('../ha/manager.js'),
      import('../ha/metrics.js'),
      import('../routing/manager.js'),
    ]);
    const obs = new Observer({ config, exec, log });
    const { metrics, conntrack } = daemonMetrics({ config, exec, eipTraffic: () => engine.eipCounters.read(), monitor: obs.current });
    const digest = async () => digestOf(await engine.loadState());
    const ha = new HaManager({
      config,
      exec,
      log,
      metrics: new HaMetrics(metrics.registry, digest),
      loadState: () => engine.loadState(),
      digest,
      // Routed EIPs (BGP) get no gratuitous ARP, a takeover's included.
      announce: (ifname, ip) => {
        if (!engine.role.routed) engine.link.announce(ifname, ip);
      },
      role: engine.role,
      holdReady: (reason) => agent.hold('ha', reason),
      tookOver: () => routing.changed('takeover'),
    });
    // EIPs announced by BGP while the data plane is ready (off without NATGW_BGP_PEERS).
    const routing = new RoutingManager({
      config,
      exec,
      log,
      registry: metrics.registry,
      readiness: () => agent.readiness(),
      applied: () => engine.lastApplied,
      role: () => engine.role.name,
      requestSync: (why) => reconciler.request(why),
    });
    agent.onReadiness(() => routing.changed('readiness'));
    // Flow classification follows every applied state (after the agent's own listener).
    engine.onSync((e) => {
      if (e.ok) obs.setState(e.state);
      if (e.ok && e.kind === 'full') routing.synced();
      if (e.ok) routing.changed('applied');
    });
    return { observer: obs, metrics, conntrack, ha, routing };
  }

  let shuttingDown = false;
  let cannotListen = false;

  // The link monitor and the conntrack follower (three processes and their output) start once
  // the first resync is over, ready or not, or at once while an interface is missing (the link
  // monitor is what notices it): before, they would only compete with the first sync. The
  // follower's first listing counts the connections made in between.
  let watching = false;
  const watch = () => {
    if (watching || shuttingDown || cannotListen) return;
    watching = true;
    monitor.start();
    void Promise.all([parts, engine.loadState().catch(() => undefined)])
      .then(([p, s]) => p.observer.start(p.conntrack, engine.lastApplied ?? s))
      .catch((e: unknown) => log.warn({ err: e }, 'conntrack events: not started'));
  };
  const reconciler = new Reconciler({
    agent: {
      resync: (reason) =>
        agent.resync(reason).finally(() => {
          // A request's timeline begun meanwhile (a bulk PUT at debug level) replaced it: left to that request.
          if (reason === 'start' && timelineBegunAs() === 'serve') {
            const timeline = timelineEnd('first sync over');
            if (timeline) log.debug(timeline, 'start timeline (ms since serve began: wall, CPU)');
          }
          watch();
        }),
      setInterfaces: (missing) => {
        agent.setInterfaces(missing);
        if (missing.length > 0) watch();
      },
    },
    engine,
    log,
    periodMs: config.resyncMs,
    interfaceWaitMs: config.interfaceWaitMs,
  });
  // A link event may have taken addresses or routes with it: no command may plan against what
  // natgw applied before it, so the next transaction is a full sync even before the resync runs.
  const monitor = new LinkMonitor({
    log,
    onChange: (why) => {
      engine.distrust();
      reconciler.request(why);
      void parts.then((p) => p.routing.changed(why, { link: true }));
    },
    ownsNeighbour: (address, dev) => engine.neighbours.holds(address, dev),
    onLinkUp: (ifname) => {
      // Any external interface: with several uplinks each EIP is announced on its own.
      const applied = engine.lastApplied?.interfaces;
      if (applied && uplinkNames(applied).includes(ifname)) agent.requestAnnounce();
    },
    links: async () => (await exec.run({ file: 'ip', args: ['-o', 'link', 'show'] })).stdout,
  });

  // Start-up: the first resync waits for the interfaces (bounded), then resyncs run on a timer and on events.
  reconciler.start();
  let unixServer: http.Server;
  let tcpServer: http.Server | https.Server | undefined;
  let started: Awaited<typeof parts>;
  try {
    const [p, { createApp }] = await Promise.all([parts, import('../api/app.js')]);
    started = p;
    const common = {
      agent,
      log,
      bodyLimit: config.bodyLimit,
      shuttingDown: () => shuttingDown,
      ha: p.ha,
      routing: p.routing,
      portUsage: () => p.observer.current()?.portUsage({ top: TOP_DESTINATIONS }),
      draining: (s: DesiredState) => countDraining(exec, s.snats),
    };
    unixServer = await listenUnix(createApp(common), config.socket);
    if (tcp) tcpServer = await listenTcp(createApp({ ...common, auth: tcp.auth }), tcp);
  } catch (e) {
    const msg = e instanceof Error ? e.message : String(e);
    process.stderr.write(`Error: ${msg}\n`);
    log.fatal({ err: e }, 'cannot listen');
    cannotListen = true;
    monitor.stop();
    await reconciler.stop();
    singleton.close();
    // The first resync may still be polling for interfaces.
    setTimeout(() => process.exit(1), 200).unref();
    return 1;
  }
  const { ha, routing } = started;
  timelineMark('serving');
  log.info(
    {
      socket: config.socket,
      tcp: tcp ? `${tcp.host}:${tcp.port}` : undefined,
      tls: Boolean(tcp?.tls),
      pid: process.pid,
      resyncMs: config.resyncMs,
      // Where this log goes: the shim that autostarted the daemon says (src/cli/daemonLog.ts).
      logs: process.env.NATGW_LOG_TO || 'stdout',
    },
    'natgw serving',
  );

  // Replica sync runs beside NAT, never in its way: its start-up failures are logged and retried.
  const haStarted = ha.start().catch((e: unknown) => log.error({ err: e }, 'replica sync failed to start; NAT is not affected'));
  const routingStarted = routing.start().catch((e: unknown) => log.error({ err: e }, 'BGP failed to start; NAT is not affected'));

  const code = await new Promise<number>((resolve) => {
    const stop = (signal: string) => {
      if (shuttingDown) return;
      shuttingDown = true;
      log.info({ signal, queued: agent.queue.size }, 'shutting down: finishing accepted work');
      void shutdown().then(
        () => resolve(0),
        (e: unknown) => {
          log.error({ err: e }, 'unclean shutdown');
          resolve(1);
        },
      );
    };
    const shutdown = async () => {
      const closing = [closeServer(unixServer), tcpServer ? closeServer(tcpServer) : Promise.resolve()];
      // The peers first: BIRD tells them it is going, so no traffic is sent here while the rest stops.
      await routingStarted;
      await routing.stop();
      monitor.stop();
      hygiene.stop();
      await haStarted;
      await ha.stop();
      await reconciler.stop();
      await agent.close();
      nft?.close();
      await started.observer.stop();
      await Promise.all(closing);
      await fs.unlink(config.socket).catch(() => undefined);
      singleton.close();
    };
    // `on`, not `once`: execa's exit hook (signal-exit) re-raises a signal that no other
    // listener handles any more, which would kill the process in the middle of the drain.
    process.on('SIGTERM', () => stop('SIGTERM'));
    process.on('SIGINT', () => stop('SIGINT'));
    // Takeover from a BFD or keepalived hook without HTTP. Not SIGUSR1: Node starts its inspector on it.
    process.on('SIGUSR2', () => {
      if (!shuttingDown) void ha.takeover('SIGUSR2').catch((e: unknown) => log.error({ err: e }, 'takeover failed'));
    });
  });
  log.info({ code }, 'natgw stopped');
  // The first resync may still be waiting for interfaces; nothing else is left to finish.
  setTimeout(() => process.exit(code), 200).unref();
  return code;
}
