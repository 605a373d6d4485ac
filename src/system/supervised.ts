import { promises as fs } from 'node:fs';
import type { Readable } from 'node:stream';
import type { Logger } from 'pino';
import { diesWithNatgw } from './diesWithNatgw.js';

export type SupervisedState = 'stopped' | 'starting' | 'running' | 'backoff';

export interface ExitRecord {
  readonly at: string;
  readonly code: number | null;
  readonly signal: string | null;
  readonly error?: string;
  readonly ranMs: number;
}

export interface SupervisedOptions {
  readonly file: string;
  readonly args: readonly string[];
  /** What the logs call it (default: file). */
  readonly name?: string;
  readonly log: Logger;
  /** Runs before every start (write the config, clear what a dead instance left). A throw counts as a failed start. */
  readonly beforeStart?: () => Promise<void>;
  /** Runs once the child has a pid. */
  readonly onSpawn?: (pid: number) => void;
  /** Every change of state, for metrics and health. */
  readonly onState?: (s: SupervisedState) => void;
  /** Each line the child prints on stdout (default: logged at debug level). */
  readonly onLine?: (line: string) => void;
  /** Each line on stderr (default: onLine). */
  readonly onStderr?: (line: string) => void;
  /** Each exit (or failed start) of a child that is to be restarted, before the backoff. */
  readonly onExit?: (e: ExitRecord) => void;
  readonly minBackoffMs?: number;
  readonly maxBackoffMs?: number;
  /** A run at least this long resets the backoff: the next failure is retried quickly again. */
  readonly stableMs?: number;
  /** SIGTERM, then SIGKILL after this long (stop, natgw's exit). */
  readonly graceMs?: number;
}

/** Lines handed over in one turn of the event loop; then natgw's commands get their turn. */
export const LINES_PER_TURN = 256;
/** An unterminated line longer than this is garbage, dropped. */
const MAX_PARTIAL = 64 * 1024;

/**
 * A child's output, line by line, LINES_PER_TURN lines per turn of the event loop (setImmediate
 * between them), the stream paused while a backlog waits: a burst (conntrack events) waits in
 * the child's pipe, never in natgw, and commands interleave with it. Resolves at the stream's
 * end. execa's own line iteration does the same at about 8× the cost per line (200,000
 * conntrack lines: 460–750 ms against 55–80 ms, event-loop stalls up to 80 ms against 6 ms).
 */
export function readLines(stream: Readable | null | undefined, each: (line: string) => void): Promise<void> {
  if (!stream) return Promise.resolve();
  return new Promise((resolve) => {
    let partial = '';
    let queue: string[] = [];
    let at = 0;
    let scheduled = false;
    let ended = false;
    const finish = (): void => {
      if (!ended || scheduled || at < queue.length) return;
      if (partial !== '') each(partial);
      partial = '';
      resolve();
    };
    const drain = (): void => {
      scheduled = false;
      const end = Math.min(at + LINES_PER_TURN, queue.length);
      for (; at < end; at++) each(queue[at] as string);
      if (at < queue.length) {
        scheduled = true;
        setImmediate(drain);
        return;
      }
      queue = [];
      at = 0;
      stream.resume();
      finish();
    };
    stream.setEncoding('utf8');
    stream.on('data', (chunk: string) => {
      const lines = (partial + chunk).split('\n');
      partial = lines.pop() ?? '';
      if (partial.length > MAX_PARTIAL) partial = '';
      if (queue.length === 0) queue = lines;
      else for (const line of lines) queue.push(line);
      if (queue.length - at > LINES_PER_TURN) stream.pause();
      if (!scheduled) {
        scheduled = true;
        setImmediate(drain);
      }
    });
    const ends = (): void => {
      ended = true;
      finish();
    };
    stream.once('end', ends);
    stream.once('close', ends);
    stream.once('error', ends);
  });
}

interface Run {
  readonly cancel: AbortController;
  readonly done: Promise<void>;
  pid?: number;
}

/**
 * Keeps one long-lived child process running (conntrackd, BIRD, the conntrack follower, the
 * link monitor): restarted with exponential backoff when it exits, read line by line, and
 * never a throw into its owner (the NAT must not depend on the child). execa does the
 * process work: it kills the child when natgw exits and when stop() cancels it (SIGTERM, then
 * SIGKILL). Its output is split into lines here (readLines), not by execa. The child is a direct child of natgw, so natgw
 * reaps it even where PID 1 reaps nothing, and it dies with natgw even after a SIGKILL
 * (diesWithNatgw).
 */
export class Supervised {
  private run: Run | undefined;
  private timer: NodeJS.Timeout | undefined;
  private stopping = false;
  private failures = 0;
  private current: SupervisedState = 'stopped';
  restarts = 0;
  lastExit: ExitRecord | null = null;

  constructor(private readonly o: SupervisedOptions) {}

  get state(): SupervisedState {
    return this.current;
  }

  get pid(): number | undefined {
    return this.current === 'running' ? this.run?.pid : undefined;
  }

  start(): void {
    if (this.current !== 'stopped') return;
    this.stopping = false;
    this.launch();
  }

  private set(s: SupervisedState): void {
    this.current = s;
    this.o.onState?.(s);
  }

  private launch(): void {
    this.timer = undefined;
    if (this.stopping) return;
    this.set('starting');
    const cancel = new AbortController();
    const run: Run = { cancel, done: this.follow(cancel.signal).catch(() => undefined) };
    this.run = run;
  }

  /** One child, from its start to its exit. */
  private async follow(signal: AbortSignal): Promise<void> {
    const startedAt = Date.now();
    try {
      await this.o.beforeStart?.();
    } catch (e) {
      this.exited(startedAt, null, null, e instanceof Error ? e.message : String(e));
      return;
    }
    // Loaded with the first child, not with the daemon: nothing on the command path needs it.
    const { execa } = await import('execa');
    if (this.stopping || signal.aborted) {
      this.set('stopped');
      return;
    }
    const cmd = diesWithNatgw(this.o.file, this.o.args);
    const child = execa(cmd.file, cmd.args, {
      stdin: 'ignore',
      buffer: false,
      env: { LC_ALL: 'C' },
      cancelSignal: signal,
      forceKillAfterDelay: this.o.graceMs ?? 3000,
      reject: false,
    });
    if (child.pid !== undefined && this.run) {
      this.run.pid = child.pid;
      this.o.onSpawn?.(child.pid);
      this.set('running');
    }
    let lastStderr = '';
    const onLine = this.o.onLine ?? ((line: string) => this.o.log.debug({ child: this.o.file, line }, `${this.o.file} says`));
    const onStderr = this.o.onStderr ?? onLine;
    const guard =
      (each: (line: string) => void) =>
      (line: string): void => {
        try {
          each(line);
        } catch (err) {
          this.o.log.warn({ err, child: this.o.file }, `a line of ${this.o.name ?? this.o.file} could not be handled`);
        }
      };
    await Promise.all([
      readLines(child.stdout, guard(onLine)),
      readLines(
        child.stderr,
        guard((line) => {
          lastStderr = line;
          onStderr(line);
        }),
      ),
    ]);
    const r = await child;
    const error = r.exitCode === undefined && r.signal === undefined ? r.shortMessage : lastStderr.slice(0, 500) || undefined;
    this.exited(startedAt, r.exitCode ?? null, r.signal ?? null, error);
  }

  private exited(startedAt: number, code: number | null, signal: string | null, error?: string): void {
    const ranMs = Date.now() - startedAt;
    this.lastExit = { at: new Date().toISOString(), code, signal, ...(error ? { error } : {}), ranMs };
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
      `${this.o.name ?? this.o.file} ${what}; restarting it after a backoff (NAT is not affected)`,
    );
    this.o.onExit?.(this.lastExit);
    this.set('backoff');
    this.timer = setTimeout(() => this.launch(), delay);
    this.timer.unref();
  }

  /** Stop the child (SIGTERM, then SIGKILL after the grace period) and restart it no more. */
  async stop(): Promise<void> {
    this.stopping = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    const run = this.run;
    if (!run) {
      this.set('stopped');
      return;
    }
    run.cancel.abort();
    await run.done;
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
