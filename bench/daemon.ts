/**
 * `natgw serve` in a topology's gw namespace, driven over its Unix socket the way a
 * controller would: a new connection per request. Only the API and the shim's command line
 * are used, never natgw's modules, so the bench keeps working while the engine is rebuilt.
 */
import type { ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import type { Topology } from '../test/helpers/netns.js';

export interface ApiResponse {
  readonly status: number;
  readonly text: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  readonly body: any;
}

/** A body already serialised, so that a timed call measures the daemon, not the client's JSON.stringify. */
export class JsonText {
  constructor(readonly text: string) {}
}

export function api(socketPath: string, method: string, path: string, body?: unknown, timeoutMs = 600_000): Promise<ApiResponse> {
  const payload = body === undefined ? undefined : body instanceof JsonText ? body.text : JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        socketPath,
        method,
        path,
        agent: false,
        timeout: timeoutMs,
        headers: payload === undefined ? {} : { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(payload)) },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('error', reject);
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let parsed: unknown;
          try {
            parsed = text ? JSON.parse(text) : undefined;
          } catch {
            parsed = undefined;
          }
          resolve({ status: res.statusCode ?? 0, text, body: parsed });
        });
      },
    );
    req.on('timeout', () => req.destroy(new Error(`${method} ${path}: no answer in ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end(payload);
  });
}

export function must(r: ApiResponse, what: string): ApiResponse {
  if (r.status < 200 || r.status >= 300) throw new Error(`${what}: HTTP ${r.status} ${r.text.slice(0, 2000)}`);
  return r;
}

export interface Memory {
  readonly rssKiB: number;
  readonly peakKiB: number;
}

export class Daemon {
  /** How much of its stdout and stderr a daemon keeps (a timeline of a whole start needs more). */
  static tailBytes = 16384;
  private out = '';
  private err = '';
  private gone = false;
  readonly exited: Promise<number>;
  /** The node process answering on the socket (from /healthz), once it has answered. */
  pid: number | undefined;

  private constructor(
    readonly topo: Topology,
    readonly child: ChildProcess,
    readonly startedAt: bigint,
  ) {
    // Drained continuously: a daemon blocked on a full log pipe would be measured as slow.
    child.stdout?.setEncoding('utf8').on('data', (d: string) => (this.out = (this.out + d).slice(-Daemon.tailBytes)));
    child.stderr?.setEncoding('utf8').on('data', (d: string) => (this.err = (this.err + d).slice(-Daemon.tailBytes)));
    this.exited = new Promise((resolve) =>
      child.once('exit', (code, signal) => {
        this.gone = true;
        resolve(code ?? (signal ? 128 : 1));
      }),
    );
  }

  get socket(): string {
    return join(this.topo.stateDir, 'natgw.sock');
  }

  /** Spawn `natgw serve` (through the shim, as the image would) with the topology's environment plus `env`. */
  static spawn(topo: Topology, env: Record<string, string>): Daemon {
    const saved = { ...topo.env };
    Object.assign(topo.env, env);
    try {
      const t0 = process.hrtime.bigint();
      return new Daemon(topo, topo.spawnNatgw('serve'), t0);
    } finally {
      for (const k of Object.keys(topo.env)) delete topo.env[k];
      Object.assign(topo.env, saved);
    }
  }

  /**
   * Milliseconds from spawn until `probe` answers 200 (polled every `intervalMs`). /readyz is
   * asked to hold its answer until ready (`?waitMs=`): a poll would measure its own interval
   * (up to ~14 ms at 10 ms) and load the daemon with requests while it starts.
   */
  async waitFor(probe: '/healthz' | '/readyz', timeoutMs = 600_000, intervalMs = 10): Promise<number> {
    const deadline = Date.now() + timeoutMs;
    const asked = probe === '/readyz' ? '/readyz?waitMs=30000' : probe;
    let last = '';
    for (;;) {
      if (this.gone) throw new Error(`natgw serve exited while waiting for ${probe}: ${this.diagnostics()}`);
      const r = await api(this.socket, 'GET', asked, undefined, 35_000).catch((e: Error) => ({ status: 0, text: e.message, body: undefined }));
      if (r.status === 200) {
        const ms = Number(process.hrtime.bigint() - this.startedAt) / 1e6;
        if (probe === '/healthz' && typeof r.body?.pid === 'number') this.pid = r.body.pid;
        return ms;
      }
      last = r.text;
      if (Date.now() > deadline) throw new Error(`natgw serve: ${probe} not 200 after ${timeoutMs} ms (last: ${last.slice(0, 500)}) ${this.diagnostics()}`);
      await new Promise((r2) => setTimeout(r2, intervalMs));
    }
  }

  /** Start and wait until ready; returns [ms to /healthz, ms to /readyz], both from spawn. */
  async ready(timeoutMs = 600_000): Promise<{ healthzMs: number; readyzMs: number }> {
    const healthzMs = await this.waitFor('/healthz', timeoutMs);
    const readyzMs = await this.waitFor('/readyz', timeoutMs);
    return { healthzMs: Math.round(healthzMs * 100) / 100, readyzMs: Math.round(readyzMs * 100) / 100 };
  }

  memory(): Memory | undefined {
    const pid = this.pid ?? this.child.pid;
    try {
      const status = readFileSync(`/proc/${pid}/status`, 'utf8');
      const kib = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? Number.NaN);
      return { rssKiB: kib('VmRSS'), peakKiB: kib('VmHWM') };
    } catch {
      return undefined;
    }
  }

  /** Stop it by its own pid and wait; SIGKILL if it has not gone after `graceMs`. */
  async stop(signal: NodeJS.Signals = 'SIGTERM', graceMs = 10_000): Promise<void> {
    if (this.gone) return;
    const pid = this.pid ?? this.child.pid;
    const kill = (s: NodeJS.Signals) => {
      try {
        if (pid !== undefined) process.kill(pid, s);
      } catch {
        // already gone
      }
    };
    kill(signal);
    const timer = setTimeout(() => kill('SIGKILL'), graceMs);
    await this.exited;
    clearTimeout(timer);
  }

  /** The daemon's latest log lines (JSON, as it wrote them). */
  logTail(): string {
    return this.out;
  }

  diagnostics(): string {
    return `\n--- daemon stderr ---\n${this.err.slice(-3000)}\n--- daemon log (tail) ---\n${this.out.slice(-3000)}`;
  }
}
