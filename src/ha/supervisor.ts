import { spawn as nodeSpawn, type ChildProcess } from 'node:child_process';
import { diesWithNatgw } from '../system/diesWithNatgw.js';
import { lazyReadline } from '../system/builtin.js';
import { promises as fs } from 'node:fs';
import type { Logger } from 'pino';

export type SupervisorState = 'stopped' | 'starting' | 'running' | 'backoff';

export interface SupervisorOptions {
  readonly file: string;
  readonly args: readonly string[];
  readonly log: Logger;
  /** Runs before every start (write the config, clear what a dead instance left). A throw counts as a failed start. */
  readonly beforeStart?: () => Promise<void>;
  /** Runs once the child has a pid (record it for the next natgw to find an orphan). */
  readonly onSpawn?: (pid: number) => void;
  /** Every change of state, for metrics and health. */
  readonly onState?: (s: SupervisorState) => void;
  readonly spawn?: (file: string, args: readonly string[]) => ChildProcess;
  readonly minBackoffMs?: number;
  readonly maxBackoffMs?: number;
  /** A run at least this long resets the backoff: the next failure is retried quickly again. */
  readonly stableMs?: number;
  /** Each line the child prints (default: conntrackd's, its errors and warnings at warn level). */
  readonly onLine?: (line: string) => void;
}

export interface ExitRecord {
  readonly at: string;
  readonly code: number | null;
  readonly signal: string | null;
  readonly error?: string;
  readonly ranMs: number;
}

/**
 * Keeps one child process running: restarts it with exponential backoff when it exits, and
 * never throws into its owner (the NAT must not depend on the child). The child is a direct
 * child of natgw, so natgw reaps it even where PID 1 reaps nothing.
 */
export class Supervisor {
  private child: ChildProcess | undefined;
  private timer: NodeJS.Timeout | undefined;
  private stopping = false;
  private failures = 0;
  private startedAt = 0;
  private current: SupervisorState = 'stopped';
  restarts = 0;
  lastExit: ExitRecord | null = null;
  /** When the pending restart runs (state 'backoff'). */
  nextStartAt: number | null = null;

  constructor(private readonly o: SupervisorOptions) {}

  get state(): SupervisorState {
    return this.current;
  }

  get pid(): number | undefined {
    return this.current === 'running' ? this.child?.pid : undefined;
  }

  start(): void {
    if (this.current !== 'stopped') return;
    this.stopping = false;
    void this.launch();
  }

  private set(s: SupervisorState): void {
    this.current = s;
    this.o.onState?.(s);
  }

  private async launch(): Promise<void> {
    this.timer = undefined;
    this.nextStartAt = null;
    if (this.stopping) return;
    this.set('starting');
    this.startedAt = Date.now();
    try {
      await this.o.beforeStart?.();
    } catch (e) {
      this.exited(null, null, e instanceof Error ? e.message : String(e));
      return;
    }
    if (this.stopping) {
      this.set('stopped');
      return;
    }
    const spawn =
      this.o.spawn ??
      ((f, a) => {
        const cmd = diesWithNatgw(f, a);
        return nodeSpawn(cmd.file, [...cmd.args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, LC_ALL: 'C' } });
      });
    let child: ChildProcess;
    try {
      child = spawn(this.o.file, this.o.args);
    } catch (e) {
      this.exited(null, null, e instanceof Error ? e.message : String(e));
      return;
    }
    this.child = child;
    let done = false;
    const finish = (code: number | null, signal: string | null, error?: string): void => {
      if (done) return;
      done = true;
      if (this.child === child) this.child = undefined;
      this.exited(code, signal, error);
    };
    child.once('error', (e) => finish(null, null, e.message));
    child.once('exit', (code, signal) => finish(code, signal));
    for (const stream of [child.stdout, child.stderr]) {
      if (!stream) continue;
      // node:readline loaded here, not at the daemon's start (replica sync is optional).
      lazyReadline()
        .createInterface({ input: stream })
        .on('line', (line) => {
          if (this.o.onLine) return this.o.onLine(line);
          // conntrackd marks its own severity: keep its errors visible, its chatter at debug.
          if (/\[(ERROR|WARNING)\]/.test(line)) this.o.log.warn({ child: this.o.file, line }, 'conntrackd says');
          else this.o.log.debug({ child: this.o.file, line }, 'conntrackd says');
        });
    }
    if (child.pid !== undefined) {
      this.o.onSpawn?.(child.pid);
      this.set('running');
    }
  }

  private exited(code: number | null, signal: string | null, error?: string): void {
    const ranMs = Date.now() - this.startedAt;
    this.lastExit = { at: new Date().toISOString(), code, signal, error, ranMs };
    if (this.stopping) {
      this.set('stopped');
      return;
    }
    if (ranMs >= (this.o.stableMs ?? 30_000)) this.failures = 0;
    const min = this.o.minBackoffMs ?? 250;
    const delay = Math.min(this.o.maxBackoffMs ?? 30_000, min * 2 ** this.failures);
    this.failures++;
    this.restarts++;
    const what = code === null && signal === null ? 'could not start' : 'exited';
    this.o.log.warn(
      { child: this.o.file, code, signal, error, ranMs, restartInMs: delay },
      `${this.o.file} ${what}; restarting it after a backoff (NAT is not affected)`,
    );
    this.nextStartAt = Date.now() + delay;
    this.set('backoff');
    this.timer = setTimeout(() => void this.launch(), delay);
    this.timer.unref();
  }

  /** Stop the child (SIGTERM, then SIGKILL after a grace period) and restart it no more. */
  async stop(graceMs = 3000): Promise<void> {
    this.stopping = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) {
      this.set('stopped');
      return;
    }
    const gone = new Promise<void>((r) => child.once('exit', () => r()));
    child.kill('SIGTERM');
    const t = setTimeout(() => child.kill('SIGKILL'), graceMs);
    await gone;
    clearTimeout(t);
    this.set('stopped');
  }
}

/**
 * A daemon that a killed natgw left running on our configuration (the pid it recorded, our
 * config path in its command line): killed, and waited for (at most 2 s), before a new one starts.
 */
export async function killOrphan(pidFile: string, configFile: string, what: string, log: Logger): Promise<void> {
  const pid = Number((await fs.readFile(pidFile, 'utf8').catch(() => '')).trim());
  if (!Number.isInteger(pid) || pid <= 1) return;
  const cmdline = await fs.readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
  if (!cmdline.split('\0').includes(configFile)) return;
  log.warn({ pid }, `stopping a ${what} left running by an earlier natgw`);
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    return;
  }
  const alive = () =>
    fs.stat(`/proc/${pid}`).then(
      () => true,
      () => false,
    );
  const deadline = Date.now() + 2000;
  while (Date.now() < deadline && (await alive())) await new Promise((r) => setTimeout(r, 20));
}
