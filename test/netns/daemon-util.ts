/**
 * Driving `natgw serve` inside a topology's gw namespace: start it, talk HTTP to it over
 * its Unix socket (from the test process: a path socket is not bound to a network
 * namespace), wait for it with polling, stop it by its own pid.
 */
import { StateStore } from '../../src/state/store.js';
import type { ChildProcess } from 'node:child_process';
import { copyFileSync, readdirSync, statSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import type { Topology } from '../helpers/netns.js';
import { waitFor } from '../helpers/poll.js';

export interface Daemon {
  readonly child: ChildProcess;
  readonly pid: number;
  /** Resolves with the exit code (128 + n for a signal) once the process has gone. */
  readonly exited: Promise<number>;
  /** Its JSON log lines so far (stdout) and its stderr. */
  logs(): string;
  stderr(): string;
}

export const socketOf = (topo: Topology): string => join(topo.stateDir, 'natgw.sock');

export interface ApiResponse {
  readonly status: number;
  readonly text: string;
  readonly headers: http.IncomingHttpHeaders;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  readonly body: any;
}

/** One HTTP request over the daemon's Unix socket. */
export function api(
  socketPath: string,
  method: string,
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
  timeoutMs = 60_000,
): Promise<ApiResponse> {
  const payload = body === undefined ? undefined : JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        socketPath,
        method,
        path,
        agent: false,
        timeout: timeoutMs,
        headers: { ...(payload !== undefined ? { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(payload)) } : {}), ...headers },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let parsed: unknown;
          try {
            parsed = text ? JSON.parse(text) : undefined;
          } catch {
            parsed = undefined;
          }
          resolve({ status: res.statusCode ?? 0, text, headers: res.headers, body: parsed });
        });
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error(`${method} ${path}: timed out`)));
    req.on('error', reject);
    req.end(payload);
  });
}

/** Start `natgw serve` in gw with the topology's environment plus `env`; wait until it answers. */
export async function startDaemon(topo: Topology, env: Record<string, string> = {}, opts: { waitAnswer?: boolean } = {}): Promise<Daemon> {
  const saved = { ...topo.env };
  Object.assign(topo.env, env);
  let child: ChildProcess;
  try {
    child = topo.spawnNatgw('serve');
  } finally {
    for (const k of Object.keys(topo.env)) delete topo.env[k];
    Object.assign(topo.env, saved);
  }
  let out = '';
  let err = '';
  child.stdout?.setEncoding('utf8').on('data', (d: string) => (out += d));
  child.stderr?.setEncoding('utf8').on('data', (d: string) => (err += d));
  const exited = new Promise<number>((resolve) => {
    child.once('exit', (code, signal) => resolve(code ?? 128 + (signal === 'SIGKILL' ? 9 : signal === 'SIGTERM' ? 15 : 0)));
  });
  const pid = child.pid;
  if (pid === undefined) throw new Error('natgw serve did not start');
  const daemon: Daemon = { child, pid, exited, logs: () => out, stderr: () => err };
  if (opts.waitAnswer ?? true) {
    let gone = false;
    void exited.then(() => (gone = true));
    await waitFor(
      async () => {
        if (gone) throw new Error(`natgw serve exited early: ${err}${out}`);
        const r = await api(socketOf(topo), 'GET', '/healthz', undefined, {}, 1000);
        return r.status === 200 && r.body?.pid === pid;
      },
      { what: 'natgw serve to answer on its socket', timeoutMs: 15_000, intervalMs: 50 },
    ).catch((e: unknown) => {
      throw new Error(`${(e as Error).message}\nlogs:\n${out}\nstderr:\n${err}`);
    });
  }
  return daemon;
}

export async function waitReady(topo: Topology, d?: Daemon, timeoutMs = 20_000): Promise<void> {
  await waitFor(async () => (await api(socketOf(topo), 'GET', '/readyz', undefined, {}, 2000)).status === 200, {
    what: 'the daemon to report ready',
    timeoutMs,
    intervalMs: 50,
  }).catch(async (e: unknown) => {
    const r = await api(socketOf(topo), 'GET', '/readyz').catch(() => undefined);
    throw new Error(`${(e as Error).message}\nreadyz: ${r?.text}\nlogs:\n${d?.logs() ?? ''}\nstderr:\n${d?.stderr() ?? ''}`);
  });
}

/**
 * A `natgw serve` child's output (stdout and stderr), collected from now on, once it answers
 * /healthz on `socket`; fails with that output if it exits first or never answers.
 */
export async function waitServing(child: ChildProcess, socket: string, name: string): Promise<() => string> {
  let out = '';
  child.stdout?.setEncoding('utf8').on('data', (d: string) => (out += d));
  child.stderr?.setEncoding('utf8').on('data', (d: string) => (out += d));
  let gone = false;
  child.once('exit', () => (gone = true));
  await waitFor(
    async () => {
      if (gone) throw new Error(`natgw serve in ${name} exited: ${out}`);
      return (await api(socket, 'GET', '/healthz', undefined, {}, 1000)).status === 200;
    },
    { what: `natgw serve in ${name} to answer`, timeoutMs: 20_000, intervalMs: 50 },
  ).catch((e: unknown) => {
    throw new Error(`${(e as Error).message}\n${out}`);
  });
  return () => out;
}

/**
 * Wait for a log line: the daemon writes its log through a pipe, so a line logged before an
 * answer may reach this process after it.
 */
export async function waitForLog(d: Pick<Daemon, 'logs'>, pattern: string | RegExp, timeoutMs = 5000, from = 0): Promise<void> {
  const seen = () => {
    const text = d.logs().slice(from);
    return typeof pattern === 'string' ? text.includes(pattern) : pattern.test(text);
  };
  await waitFor(async () => seen(), { what: `the log line ${String(pattern)}`, timeoutMs, intervalMs: 20 }).catch((e: unknown) => {
    throw new Error(`${(e as Error).message}\nlogs:\n${d.logs().slice(from)}`);
  });
}

/** Signal the daemon (by its own pid) and wait for it to exit. */
export async function stopDaemon(d: Daemon, signal: NodeJS.Signals = 'SIGTERM'): Promise<number> {
  try {
    process.kill(d.pid, signal);
  } catch {
    // already gone
  }
  return d.exited;
}

/** Assert a 2xx and return the body, with the response in the message otherwise. */
export function ok(r: ApiResponse, what: string): ApiResponse {
  if (r.status < 200 || r.status >= 300) throw new Error(`${what}: HTTP ${r.status} ${r.text}`);
  return r;
}

/** The desired state natgw persisted (its snapshot with the journal replayed), read as a fresh process would. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export async function savedState(topo: Topology): Promise<any> {
  return new StateStore(topo.stateDir).load();
}

/** A state dir's regular files (state, journal, records), not its socket or log: a saved copy, or one put back. */
export function copyStateDir(from: string, to: string): void {
  for (const name of readdirSync(from)) {
    const p = join(from, name);
    if (statSync(p).isFile() && !name.endsWith('.sock') && name !== 'natgw.log') copyFileSync(p, join(to, name));
  }
}
