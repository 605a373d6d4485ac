/**
 * One gateway under test: a fresh topology, a command timer in its gw namespace and (unless
 * `bare`) a running `natgw serve` for one backend. Everything it creates goes with cleanup().
 */
import { REPO_ROOT, createTopology, type Topology } from '../test/helpers/netns.js';
import { existsSync, readFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { Daemon, JsonText, api, must } from './daemon.js';
import { NsRunner } from './runner.js';
import { note, progress } from './progress.js';
import { timed } from './stats.js';

// Namespaces and daemons outlive a killed process; the topology helper sweeps them in its exit
// hook, which a signal's default action would skip. Every bench tool that builds gateways imports this module.
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.once(sig, () => process.exit(130));

export type BackendName = 'iptables' | 'nftables';
export const SHIM = join(REPO_ROOT, 'image', 'nat-gateway.sh');

export interface BackendInfo {
  readonly kind: string;
  readonly variant?: string;
}

export interface GatewayOptions {
  readonly backend: BackendName;
  readonly resync: string;
}

/**
 * The default body limit is kept on purpose (SPEC §4.3 says it must admit the largest
 * benchmarked state); when it refuses a state document the run says so and goes on with this.
 */
const FALLBACK_BODY_LIMIT = '512mb';
let bodyLimitOverride: string | undefined;
/** The daemons' NATGW_LIBNFTABLES for the whole run (`--libnft`). */
let libnft: 'auto' | 'off' = 'auto';
export function setLibnft(v: 'auto' | 'off'): void {
  libnft = v;
}

export class Gateway {
  daemon: Daemon | undefined;

  private constructor(
    readonly topo: Topology,
    readonly runner: NsRunner,
    readonly opts: GatewayOptions,
  ) {}

  /** A topology and a runner in its gw namespace (`runnerEnv`: see nsrunner.ts); no daemon yet. */
  static async bare(opts: GatewayOptions, runnerEnv: Record<string, string> = {}): Promise<Gateway> {
    const topo = await createTopology();
    progress(`namespaces ${topo.prefix}* (${opts.backend})`);
    try {
      return new Gateway(topo, new NsRunner(topo, 'gw', { ...topo.natgwEnv(), ...runnerEnv }), opts);
    } catch (e) {
      await topo.cleanup();
      throw e;
    }
  }

  static async withDaemon(opts: GatewayOptions): Promise<Gateway> {
    const gw = await Gateway.bare(opts);
    try {
      await gw.startDaemon();
    } catch (e) {
      await gw.cleanup();
      throw e;
    }
    return gw;
  }

  daemonEnv(): Record<string, string> {
    return {
      GATEWAY_NETFILTER_MODE: this.opts.backend,
      // A timer resync landing inside a series of samples would be measured as the command's cost.
      NATGW_RESYNC_PERIOD: this.opts.resync,
      NATGW_LIBNFTABLES: libnft,
      ...(bodyLimitOverride ? { NATGW_BODY_LIMIT: bodyLimitOverride } : {}),
    };
  }

  /** The environment the shim runs with: the daemon's paths, as in the pod. */
  shimEnv(): Record<string, string> {
    return { ...this.topo.natgwEnv(), ...this.daemonEnv() };
  }

  get socket(): string {
    return join(this.topo.stateDir, 'natgw.sock');
  }

  async startDaemon(): Promise<{ healthzMs: number; readyzMs: number }> {
    const d = Daemon.spawn(this.topo, this.daemonEnv());
    this.daemon = d;
    return d.ready();
  }

  async stopDaemon(): Promise<void> {
    await this.daemon?.stop();
    this.daemon = undefined;
  }

  /** PUT /v1/state; returns the milliseconds it took. */
  async putState(doc: unknown, query = ''): Promise<{ ms: number; body: any }> {
    // Serialised before the clock starts: the raw apply it is compared with has no such step.
    const text = new JsonText(JSON.stringify(doc));
    const [r, ms] = await timed(() => api(this.socket, 'PUT', `/v1/state${query}`, text));
    if (r.status === 413 && bodyLimitOverride === undefined) {
      const bytes = Buffer.byteLength(text.text);
      note(
        `the daemon's default body limit refused a ${(bytes / 1048576).toFixed(1)} MiB state document (HTTP 413); the rest of the run sets NATGW_BODY_LIMIT=${FALLBACK_BODY_LIMIT}`,
      );
      bodyLimitOverride = FALLBACK_BODY_LIMIT;
      await this.stopDaemon();
      await this.startDaemon();
      return this.putState(doc, query);
    }
    must(r, `PUT /v1/state${query}`);
    return { ms, body: r.body };
  }

  /**
   * Wait until the gratuitous ARP / unsolicited NA that a fill queued have gone out (natgw runs
   * up to 8 at a time, ~2 s each: 201 EIPs take ~50 s). Their process starts would otherwise
   * land in the per-command samples, in natgw's figures and the floors alike.
   */
  async settleAnnouncements(deadlineMs = 180_000): Promise<void> {
    const announcing = () =>
      execFileSync('ip', ['netns', 'pids', this.topo.ns.gw], { encoding: 'utf8' })
        .split('\n')
        .filter(Boolean)
        .filter((pid) => {
          try {
            return /^(arping|na6)$/.test(readFileSync(`/proc/${pid}/comm`, 'utf8').trim());
          } catch {
            return false;
          }
        }).length;
    const until = Date.now() + deadlineMs;
    let n = announcing();
    if (n > 0) progress(`waiting for ${n}+ announcements to finish`);
    // Two quiet looks in a row: the queue starts the next batch as one ends.
    for (let quiet = 0; quiet < 2 && Date.now() < until; quiet = n === 0 ? quiet + 1 : 0) {
      await new Promise((r) => setTimeout(r, 250));
      n = announcing();
    }
    if (n > 0) note(`announcements still running after ${deadlineMs / 1000} s: they overlap the samples`);
  }

  async backendInfo(): Promise<BackendInfo> {
    const r = must(await api(this.socket, 'GET', '/v1/state'), 'GET /v1/state');
    const b = r.body?.backend as BackendInfo | null | undefined;
    return b ?? { kind: this.opts.backend };
  }

  /**
   * Whether the namespace or the state dir has gone behind the bench's back (the machine is
   * shared, and a sweep of "leftover" namespaces by someone else takes a running one too).
   */
  vanished(): boolean {
    return !existsSync(`/run/netns/${this.topo.ns.gw}`) || !existsSync(this.topo.stateDir);
  }

  async cleanup(): Promise<void> {
    this.runner.close();
    await this.daemon?.stop('SIGKILL', 1000).catch(() => undefined);
    await this.topo.cleanup();
  }
}

/** `fn` on a gateway that is always cleaned up. */
export async function using<T>(make: () => Promise<Gateway>, fn: (gw: Gateway) => Promise<T>): Promise<T> {
  const gw = await make();
  try {
    return await fn(gw);
  } finally {
    await gw.cleanup();
  }
}

export const vanishedNote = (label: string): string =>
  `${label}: the gateway's namespace vanished mid-run (deleted from outside the bench); measured again in a new one`;

export class VanishedError extends Error {
  override readonly name = 'VanishedError';
}

/**
 * `fn` on a fresh gateway, once more on another fresh one if the first vanished under it
 * (its figures would be failures of the machine, not of natgw); the retry is reported.
 */
export async function withRetryIfVanished<T>(label: string, make: () => Promise<Gateway>, fn: (gw: Gateway) => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await using(make, async (gw) => {
        const r = await fn(gw).catch((e: unknown) => {
          throw gw.vanished() ? new VanishedError(String(e)) : e;
        });
        if (gw.vanished()) throw new VanishedError('namespace or state dir gone after the run');
        return r;
      });
    } catch (e) {
      if (!(e instanceof VanishedError) || attempt >= 2) throw e;
      note(vanishedNote(label));
    }
  }
}

/** The iptables tools of a variant, as natgw's iptables backend names them. */
export function iptablesTools(variant: string | undefined): { cmd: string; save: string; restore: string } {
  const v = variant === 'nft' ? 'nft' : 'legacy';
  return { cmd: `iptables-${v}`, save: `iptables-${v}-save`, restore: `iptables-${v}-restore` };
}
