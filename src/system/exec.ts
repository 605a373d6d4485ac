import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, openSync, readFileSync, readSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { unlinkedFileWith } from './unlinkedInput.js';
import { timelineMark } from './timeline.js';

/**
 * The one door to processes. Every tool natgw runs goes through an Executor, with an
 * argument array (never a shell string) and optionally a script on stdin rendered from
 * validated, typed values.
 */
export interface ExecRequest {
  readonly file: string;
  readonly args: readonly string[];
  /** Script fed on stdin (iptables-restore, nft -f -, ip -batch -). */
  readonly input?: string;
  readonly timeoutMs?: number;
  /**
   * The tool is one binary that starts no process of its own (nft, conntrack): it runs in
   * natgw's process group and only it is killed at the deadline. Default: a session of its own,
   * killed whole, for wrappers whose children could hold the output open — which costs every
   * start about a millisecond more, on the command path.
   */
  readonly single?: boolean;
  /**
   * The tool's answer is complete once its stderr matches this (a summary line it writes last):
   * the run resolves then, with exit status 0 and the output so far, and the process is reaped
   * in the background (still killed at the deadline). For netfilter tools whose exit waits on
   * the kernel after the work is done: closing any nfnetlink socket waits for the RCU grace
   * period an nft delete left pending (~10 ms).
   */
  readonly settledBy?: RegExp;
  /**
   * The tool does nothing before it reads its input: it takes no lock and opens no table until
   * its first line (iptables-restore), and an empty input ends it having done nothing. An
   * executor that keeps spares (SystemExecutor's `prestart`) may hand this run a process it
   * started earlier, off the command's critical path: a process start from the daemon blocks
   * its event loop for a millisecond or more (fork of a large process), between the plan and
   * the kernel. Needs `input`.
   */
  readonly prestartable?: boolean;
}

export interface ExecResult {
  readonly command: string;
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
  readonly timedOut: boolean;
  /** The binary was not found or could not be started. */
  readonly failedToStart: boolean;
}

export interface Executor {
  run(req: ExecRequest): Promise<ExecResult>;
  /** Start a process that outlives the call (gratuitous ARP); its output is discarded. */
  spawnDetached(req: ExecRequest): void;
  /**
   * A kernel status file of this process's own network namespace (/proc/net/…), read without a
   * tool; undefined when unreadable. Absent where the executor is not the kernel's here (fakes,
   * an executor running tools in another namespace): callers then ask the tool. With
   * `maxBytes`, undefined also when the file holds more (read no further than that).
   */
  readKernelFile?(path: string, maxBytes?: number): Promise<string | undefined>;
  /**
   * A long-lived process of this tool, shared by every caller of this executor (see
   * ToolSession); absent where the executor cannot keep one (fakes, recorders): callers then
   * run the tool once per call.
   */
  session?(file: string, args: readonly string[]): ToolSession;
  /**
   * Start the tool now and give it its stdin script later (PendingRun): its process start and
   * its own start-up happen while the caller waits for something else (a bulk change's
   * `ip -batch`, started while the NAT transaction applies). Absent where the executor cannot
   * (fakes, recorders): callers then run the tool when they have its script.
   */
  start?(req: Omit<ExecRequest, 'input' | 'settledBy'>): PendingRun;
  /**
   * Start a spare process for every prestartable run handed out since the last call (see
   * ExecRequest.prestartable). Called by the engine once a transaction is answered, when a
   * process start (a millisecond or more of a blocked event loop) delays no one.
   */
  startSpares?(): void;
}

/** A tool started by Executor.start, waiting for its stdin script. */
export interface PendingRun {
  /** Write the script and close stdin; resolves as Executor.run does. The deadline counts from here. */
  feed(input: string): Promise<ExecResult>;
  /** Close stdin unwritten: the tool reads nothing and ends (its result is dropped). */
  cancel(): void;
}

/** What one exchange with a session's process gave back. */
export interface SessionReply {
  /** stderr the process wrote before the marker. */
  readonly stderr: string;
  readonly timedOut: boolean;
  /** The process ended (or never started) before the marker came: it is replaced next time. */
  readonly died: boolean;
  /** It never started (no such binary): nothing of the request ran. */
  readonly failedToStart?: boolean;
  /** What it wrote on stdout during the exchange; only when the request asked for it (SessionOptions.stdoutDone). */
  readonly stdout?: string;
}

export interface SessionOptions {
  /**
   * The request writes on stdout (a listing): the answer waits until this holds for what came
   * so far (given the stderr before the marker), since the two pipes are read independently.
   */
  readonly stdoutDone?: (stdout: string, stderr: string) => boolean;
}

/**
 * One process kept running for many requests (`nft -i`): each request is written to its
 * stdin and answered once `marker` appears on its stderr. It saves a process start per
 * request and, for nft, the netlink socket's close, which waits for the kernel's RCU grace
 * period after every delete (README: The nft session).
 */
export interface ToolSession {
  exchange(input: string, marker: string, timeoutMs?: number, opts?: SessionOptions): Promise<SessionReply>;
  /** End the process (stdin closed; killed if it does not go); the next exchange starts a new one. */
  recycle(): void;
}

export class ExecError extends Error {
  override readonly name = 'ExecError';
  constructor(readonly result: ExecResult) {
    super(`${result.command} failed (exit ${result.exitCode}${result.timedOut ? ', timed out' : ''}): ${firstLine(result.stderr) || firstLine(result.stdout)}`);
  }
}

/** SIGKILL to the whole process group the tool leads (it was started detached: its own group). */
function killGroup(pid: number | undefined): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // already gone
  }
}

function firstLine(s: string): string {
  return s.trim().split('\n')[0] ?? '';
}

/** Run and throw an ExecError unless the tool exited 0. */
export async function runChecked(exec: Executor, req: ExecRequest): Promise<ExecResult> {
  const r = await exec.run(req);
  if (r.exitCode !== 0) throw new ExecError(r);
  return r;
}

const DEFAULT_TIMEOUT_MS = 30_000;

/**
 * Every run has a deadline (NATGW_TOOL_TIMEOUT caps every per-call timeout): a tool that hangs
 * would otherwise hold the engine's queue, and with it every command, forever. The tool runs
 * in a process group of its own and the whole group is killed at the deadline, because a
 * wrapper (a shell script, `ip -batch` feeding a child) can leave a grandchild holding the
 * output pipes open, and the run would not end even after its direct child died.
 */
export class SystemExecutor implements Executor {
  private readonly deadlineMs: number;
  private readonly prestart: boolean;
  /** One started, idle process per prestartable tool and arguments, waiting for its input. */
  private readonly spares = new Map<string, ChildProcess>();

  constructor(
    private readonly log?: Logger,
    opts: {
      readonly deadlineMs?: number;
      /**
       * Keep a spare process of every prestartable tool run (the daemon: one per command). Off
       * for a one-shot run, whose spare would only start to read an empty input and end.
       */
      readonly prestart?: boolean;
      /**
       * Run a prestartable tool with a small script through its runner shell (RUNNER_SH,
       * which keeps the next one started) instead of a spare of the daemon's. Default: as `prestart`.
       */
      readonly runner?: boolean;
    } = {},
  ) {
    this.deadlineMs = opts.deadlineMs ?? DEFAULT_TIMEOUT_MS;
    this.prestart = opts.prestart ?? false;
    this.useRunner = opts.runner ?? this.prestart;
  }

  private readonly useRunner: boolean;

  async run(req: ExecRequest): Promise<ExecResult> {
    const started = Date.now();
    const limit = Math.min(req.timeoutMs ?? this.deadlineMs, this.deadlineMs);
    // A large script goes through a file (inputFile), which a spare's pipe cannot take: it starts its own process.
    const spareKey =
      this.prestart && req.prestartable && req.input !== undefined && req.input.length < FILE_INPUT_BYTES
        ? `${req.single ? 's' : 'g'}\0${req.file}\0${req.args.join('\0')}`
        : undefined;
    // A command is under way: a spare of the daemon's own waits for the next quiet moment (startSpares).
    if (spareKey !== undefined) clearTimeout(this.sparesLater);
    const spare = spareKey === undefined ? undefined : this.takeSpare(spareKey);
    if (!spare && this.useRunner && req.prestartable && req.input !== undefined && req.input.length <= RUNNER_MAX_CHARS && !req.input.includes('\0')) {
      const via = await this.viaRunner(req, req.input, limit);
      if (via) {
        if (spareKey !== undefined) this.used.set(spareKey, req);
        return this.result(req, limit, started, via);
      }
    }
    const r = await runProcess(req, limit, undefined, spare);
    // Its successor starts when the caller says nothing waits (startSpares): started here, it
    // would block the event loop while the journal syncs, and the answer would wait for it.
    if (spareKey !== undefined) this.used.set(spareKey, req);
    return this.result(req, limit, started, r);
  }

  start(req: Omit<ExecRequest, 'input' | 'settledBy'>): PendingRun {
    const limit = Math.min(req.timeoutMs ?? this.deadlineMs, this.deadlineMs);
    let give: (input: string | undefined) => void = () => undefined;
    const input = new Promise<string | undefined>((resolve) => (give = resolve));
    const run = runProcess(req, limit, input);
    const cmd = [req.file, ...req.args].join(' ');
    this.log?.debug({ cmd }, 'tool started ahead of its script');
    return {
      feed: async (text) => {
        const fedAt = Date.now();
        give(text);
        return this.result({ ...req, input: text }, limit, fedAt, await run);
      },
      cancel: () => {
        this.log?.debug({ cmd }, 'tool started ahead: cancelled, its script never written');
        give(undefined);
      },
    };
  }

  private result(req: ExecRequest, limit: number, started: number, r: RawRun): ExecResult {
    const command = [req.file, ...req.args].join(' ');
    const result: ExecResult = {
      command,
      exitCode: r.timedOut ? r.exitCode || 124 : r.exitCode,
      stdout: r.stdout,
      stderr: r.timedOut ? `${command}: timed out after ${limit} ms (NATGW_TOOL_TIMEOUT) and was killed\n${r.stderr}` : r.stderr,
      timedOut: r.timedOut,
      failedToStart: r.failedToStart,
    };
    if (r.timedOut) this.log?.error({ cmd: command, ms: Date.now() - started, limitMs: limit }, 'tool timed out: killed its process group');
    this.log?.debug({ cmd: result.command, exitCode: result.exitCode, ms: Date.now() - started, stdinBytes: req.input?.length ?? 0 }, 'exec');
    return result;
  }

  /** One runner shell per tool and arguments (RUNNER_SH), with the marker that ends its answers. */
  private readonly runners = new Map<string, { readonly session: ProcessSession; readonly marker: string }>();

  /**
   * A prestartable tool with a small script, run by its runner shell (RUNNER_SH), which keeps
   * the next one started ahead as a spare did: a fork of the daemon (a large process) blocks its
   * event loop ~1.5 ms at 80 MiB, and a spare's start after every answer was on the path of a
   * command that followed at once; the shell's fork costs a fraction of that, in another
   * process, and never between two commands of the daemon. Undefined when the runner could not
   * start (the caller then runs the tool itself). A runner that dies mid-run leaves the tool's
   * outcome unknown: a failure (a transaction is then retried as a full sync, which reads back).
   */
  private async viaRunner(req: ExecRequest, input: string, limit: number): Promise<RawRun | undefined> {
    const lines = input.endsWith('\n') ? input.slice(0, -1).split('\n') : input.split('\n');
    const key = `${req.file}\0${req.args.join('\0')}`;
    let runner = this.runners.get(key);
    if (!runner) {
      const marker = `natgw-runner-${randomBytes(8).toString('hex')}`;
      // Its own process group: a deadline kills the shell and the tool it started.
      const session = new ProcessSession('sh', ['-c', RUNNER_SH, marker, req.file, ...req.args], this.deadlineMs, this.log, { group: true });
      runner = { session, marker };
      this.runners.set(key, runner);
    }
    timelineMark(`runner: ${req.file}`);
    const reply = await runner.session.exchange(`${lines.length}\n${lines.join('\n')}\n`, `${runner.marker}\n`, limit);
    timelineMark(`runner answered ${req.file}`);
    if (reply.failedToStart) return undefined;
    if (reply.timedOut) return { exitCode: 124, stdout: '', stderr: reply.stderr, timedOut: true, failedToStart: false };
    const at = reply.stderr.lastIndexOf(RC_LINE);
    const rc = at === -1 ? Number.NaN : Number.parseInt(reply.stderr.slice(at + RC_LINE.length), 10);
    if (reply.died || Number.isNaN(rc)) {
      return {
        exitCode: 127,
        stdout: '',
        stderr: `${reply.stderr}${req.file}: the shell running it ended mid-run; the outcome is unknown\n`,
        timedOut: false,
        failedToStart: false,
      };
    }
    return { exitCode: rc, stdout: '', stderr: reply.stderr.slice(0, at), timedOut: false, failedToStart: rc === 127 };
  }

  /** Prestartable runs handed out since the last startSpares(), by spare key. */
  private readonly used = new Map<string, ExecRequest>();

  startSpares(): void {
    const start = () => {
      for (const [key, req] of this.used) this.startSpare(key, req);
      this.used.clear();
    };
    if (!this.useRunner) {
      start();
      return;
    }
    // With a runner to fall back on, the fork waits until the daemon has been quiet a moment:
    // it blocks the event loop ~1.5 ms, which a command that follows at once (a controller
    // replaying rules) would wait for; such commands take the runner's tool meanwhile. A spare
    // is one hop shorter than the runner (the daemon writes to the tool itself): a command
    // after a pause, the usual case, takes it.
    clearTimeout(this.sparesLater);
    this.sparesLater = setTimeout(start, SPARES_AFTER_IDLE_MS);
    this.sparesLater.unref();
  }

  /** The deferred startSpares (runner on). */
  private sparesLater: NodeJS.Timeout | undefined;

  /** The spare for `key` when one is alive and idle (a spare that died is not handed out). */
  private takeSpare(key: string): ChildProcess | undefined {
    const spare = this.spares.get(key);
    this.spares.delete(key);
    if (!spare || spare.pid === undefined || spare.exitCode !== null || spare.signalCode !== null) return undefined;
    // A spare does not keep a one-shot process alive; a run does (see startSpare).
    spare.ref();
    for (const s of [spare.stdin, spare.stdout, spare.stderr]) (s as { ref?: () => void } | null)?.ref?.();
    return spare;
  }

  private startSpare(key: string, req: ExecRequest): void {
    if (this.spares.has(key)) return;
    let child: ChildProcess;
    try {
      child = spawnTool(req, 'pipe');
    } catch {
      return;
    }
    // A spare that cannot start is simply not used: the run starts its own and reports why.
    child.on('error', () => this.spares.get(key) === child && this.spares.delete(key));
    child.on('exit', () => this.spares.get(key) === child && this.spares.delete(key));
    child.stdin?.on('error', () => undefined);
    child.unref();
    for (const s of [child.stdin, child.stdout, child.stderr]) (s as { unref?: () => void } | null)?.unref?.();
    this.spares.set(key, child);
  }

  private readonly sessions = new Map<string, ProcessSession>();

  session(file: string, args: readonly string[]): ToolSession {
    const key = [file, ...args].join('\0');
    let s = this.sessions.get(key);
    if (!s) {
      s = new ProcessSession(file, args, this.deadlineMs, this.log);
      this.sessions.set(key, s);
    }
    return s;
  }

  async readKernelFile(path: string, maxBytes?: number): Promise<string | undefined> {
    // Synchronous: a /proc file is made in memory as it is read, and its read never waits on a
    // disk; through the thread pool each of open, read and close cost a round trip of the event
    // loop (~0.3 ms together on a busy node), on a delete's path.
    try {
      return maxBytes === undefined ? readFileSync(path, 'utf8') : readCapped(path, maxBytes);
    } catch {
      return undefined;
    }
  }

  spawnDetached(req: ExecRequest): void {
    try {
      const child = spawn(req.file, [...req.args], { detached: true, stdio: 'ignore', env: toolEnv() });
      // A missing binary must not become an uncaught 'error' event.
      child.on('error', () => undefined);
      child.unref();
    } catch {
      // best effort: gratuitous ARP is advisory
    }
  }
}

/** Output kept per stream before the tool is killed: far above any listing natgw reads. */
const MAX_OUTPUT_BYTES = 100 * 1024 * 1024;

/** The tools' environment: natgw's own, with messages in the C locale (parsers read them). */
function toolEnv(): NodeJS.ProcessEnv {
  return { ...process.env, LC_ALL: 'C' };
}

interface RawRun {
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
  readonly timedOut: boolean;
  readonly failedToStart: boolean;
}

/**
 * One tool run on child_process directly: a command's only process start is on its critical
 * path, and a general-purpose wrapper's per-call set-up (option normalisation, stream
 * pipelines, environment copies) cost several milliseconds of the daemon's event loop each.
 * Semantics kept from before: stdin fed from `input` (else /dev/null), stdout and stderr
 * decoded as UTF-8 untouched, a process group of its own (killed whole at the deadline), a
 * missing binary reported as failedToStart with exit 127, death by a signal as 127.
 */
function spawnTool(req: ExecRequest, stdin: 'pipe' | 'ignore' | number): ChildProcess {
  return spawn(req.file, [...req.args], { detached: !req.single, env: toolEnv(), stdio: [stdin, 'pipe', 'pipe'] });
}

/**
 * From this size on a script reaches its tool through an unlinked temp file, not a pipe. A pipe
 * holds 64 KiB and the rest is written only as the event loop turns, while nft -f and
 * iptables-restore read all of their input before they work: a bulk change's 1.2 MiB fed
 * through a pipe waited on what the daemon does meanwhile (hashing and persisting the new
 * state), and `nft -f -` took ~30 ms longer than from a file.
 */
const FILE_INPUT_BYTES = 64 * 1024;

/** A read descriptor of an unlinked temp file holding `input` (unlinkedInput.ts); undefined to use a pipe. */
function inputFile(input: string): number | undefined {
  if (input.length < FILE_INPUT_BYTES) return undefined;
  try {
    return unlinkedFileWith(join(tmpdir(), `natgw-stdin-${process.pid}-${randomBytes(8).toString('hex')}`), Buffer.from(input, 'utf8'));
  } catch {
    // A temp dir that is read-only or full: the pipe still works.
    return undefined;
  }
}

/** `late`: the input comes later (Executor.start); `spare`: a process started ahead (prestartable). */
function runProcess(req: ExecRequest, limit: number, late?: Promise<string | undefined>, spare?: ChildProcess): Promise<RawRun> {
  return new Promise((resolve) => {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let outBytes = 0;
    let errBytes = 0;
    let timedOut = false;
    let startError: Error | undefined;
    let overflow = false;
    let settled = false;
    let child: ChildProcess;
    const finish = (code: number | null, signal: NodeJS.Signals | null) => {
      if (settled) {
        // Settled by its output: now reaped.
        clearTimeout(timer);
        return;
      }
      settled = true;
      clearTimeout(timer);
      timelineMark(`ended ${req.file}`);
      const failedToStart = startError !== undefined && !timedOut;
      const note = startError ? `${startError.message}\n` : overflow ? `${req.file}: output above ${MAX_OUTPUT_BYTES} bytes; killed\n` : '';
      resolve({
        // Killed at the deadline: 124 as timeout(1) says; by another signal or never started: 127.
        exitCode: code ?? (timedOut ? 124 : signal !== null || failedToStart ? 127 : 0),
        stdout: Buffer.concat(out).toString('utf8'),
        stderr: Buffer.concat(err).toString('utf8') + note,
        timedOut,
        failedToStart,
      });
    };
    const kill = () => (req.single ? child?.kill('SIGKILL') : killGroup(child?.pid));
    const expire = () => {
      timedOut = true;
      kill();
    };
    // A started tool waiting for its script (Executor.start) is killed if none comes within the
    // deadline; once fed, the deadline counts again from then.
    let timer = setTimeout(expire, limit);
    const fileInput = spare === undefined && late === undefined && req.input !== undefined ? inputFile(req.input) : undefined;
    try {
      child = spare ?? spawnTool(req, fileInput ?? (req.input === undefined && late === undefined ? 'ignore' : 'pipe'));
      timelineMark(`started ${req.file}`);
    } catch (e) {
      startError = e as Error;
      finish(null, null);
      return;
    } finally {
      // The child holds its own copy of the descriptor.
      if (fileInput !== undefined) closeSync(fileInput);
    }
    const tooMuch = () => {
      overflow = true;
      kill();
    };
    child.stdout?.on('data', (d: Buffer) => {
      outBytes += d.length;
      if (outBytes > MAX_OUTPUT_BYTES) return tooMuch();
      out.push(d);
    });
    child.stderr?.on('data', (d: Buffer) => {
      errBytes += d.length;
      if (errBytes > MAX_OUTPUT_BYTES) return tooMuch();
      err.push(d);
      if (req.settledBy && !settled && req.settledBy.test(Buffer.concat(err).toString('utf8'))) {
        settled = true;
        resolve({
          exitCode: 0,
          stdout: Buffer.concat(out).toString('utf8'),
          stderr: Buffer.concat(err).toString('utf8'),
          timedOut: false,
          failedToStart: false,
        });
      }
    });
    child.on('error', (e) => {
      // Failed to start (ENOENT, EACCES): the process never ran.
      if (child.pid !== undefined) return;
      startError ??= e;
      finish(null, null);
    });
    // 'close', not 'exit': the output pipes are drained by then.
    child.on('close', (code, signal) => finish(code, signal));
    if (child.stdin) {
      // A tool that exits without reading its script (a usage error) closes the pipe: EPIPE.
      child.stdin.on('error', () => undefined);
      if (late === undefined) child.stdin.end(req.input);
      else
        void late.then((input) => {
          if (settled) return;
          clearTimeout(timer);
          timer = setTimeout(expire, limit);
          child.stdin?.end(input ?? '');
        });
    }
  });
}

/**
 * A ToolSession on child_process. Exchanges run one at a time, in call order. The process
 * never keeps natgw alive (unref'd): a shim's in-process run exits as if it were not there,
 * and the process then ends on the end of its stdin. It is replaced after a failure it
 * cannot be trusted past (a timeout, its death) and after RECYCLE_AFTER exchanges (an
 * interactive tool keeps a history of every line in memory).
 */
class ProcessSession implements ToolSession {
  private child: ChildProcess | undefined;
  private err = '';
  /** stdout of the current exchange (only listings write there). */
  private out = '';
  private exited = false;
  /** The current process never started (spawn's error event). */
  private startFailed = false;
  private exchanges = 0;
  private queue: Promise<unknown> = Promise.resolve();
  /** Woken on each stderr chunk and on exit. */
  private wake: (() => void) | undefined;

  constructor(
    private readonly file: string,
    private readonly args: readonly string[],
    private readonly deadlineMs: number,
    private readonly log?: Logger,
    private readonly opts: { readonly group?: boolean } = {},
  ) {}

  exchange(input: string, marker: string, timeoutMs?: number, opts: SessionOptions = {}): Promise<SessionReply> {
    const run = this.queue.then(() => this.once(input, marker, Math.min(timeoutMs ?? this.deadlineMs, this.deadlineMs), opts.stdoutDone));
    this.queue = run.catch(() => undefined);
    return run;
  }

  recycle(): void {
    const child = this.child;
    this.child = undefined;
    this.err = '';
    this.exchanges = 0;
    if (!child || this.exited) return;
    child.stdin?.end();
    // It ends on its own at the end of its input; one that does not is killed.
    const t = setTimeout(() => child.kill('SIGKILL'), 5000);
    t.unref();
    child.once('close', () => clearTimeout(t));
  }

  private start(): ChildProcess {
    const started = Date.now();
    this.exited = false;
    this.startFailed = false;
    this.err = '';
    // HOME without a history file, TERM without a terminal description: an interactive tool then reads and writes nothing of its own.
    const child = spawn(this.file, [...this.args], {
      env: { ...toolEnv(), HOME: '/dev/null', TERM: 'dumb' },
      stdio: ['pipe', 'pipe', 'pipe'],
      detached: this.opts.group === true,
    });
    const command = [this.file, ...this.args].join(' ');
    this.out = '';
    child.stdout?.setEncoding('utf8');
    child.stdout?.on('data', (d: string) => {
      if (this.child !== child) return;
      this.out += d;
      if (this.out.length > MAX_OUTPUT_BYTES) child.kill('SIGKILL');
      this.wake?.();
    });
    child.stderr?.setEncoding('utf8');
    child.stderr?.on('data', (d: string) => {
      if (this.child !== child) return;
      this.err += d;
      if (this.err.length > MAX_OUTPUT_BYTES) child.kill('SIGKILL');
      this.wake?.();
    });
    child.stdin?.on('error', () => undefined);
    child.on('error', (e) => {
      if (child.pid !== undefined || this.child !== child) return;
      this.log?.warn({ cmd: command, err: e.message }, 'tool session could not start');
      this.exited = true;
      this.startFailed = true;
      this.wake?.();
    });
    // 'close', not 'exit': what it wrote before it died is read by then.
    child.on('close', (code, signal) => {
      if (this.child === child) {
        this.exited = true;
        this.wake?.();
      }
      this.log?.debug({ cmd: command, exitCode: code, signal, ms: Date.now() - started }, 'tool session ended');
    });
    this.log?.debug({ cmd: command, pid: child.pid }, 'tool session started');
    child.unref();
    (child.stdin as unknown as { unref?: () => void } | null)?.unref?.();
    (child.stderr as unknown as { unref?: () => void } | null)?.unref?.();
    (child.stdout as unknown as { unref?: () => void } | null)?.unref?.();
    this.child = child;
    return child;
  }

  private async once(input: string, marker: string, limit: number, stdoutDone?: SessionOptions['stdoutDone']): Promise<SessionReply> {
    if (this.exchanges >= RECYCLE_AFTER) this.recycle();
    // Reaped already ('exit') though its pipes have not closed yet: it is not written to.
    const child = this.child && !this.exited && this.child.exitCode === null && this.child.signalCode === null ? this.child : this.start();
    this.exchanges++;
    this.err = '';
    this.out = '';
    let answered: string | undefined;
    child.stdin?.write(input);
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      this.wake?.();
    }, limit);
    try {
      for (;;) {
        const at = answered === undefined ? this.err.indexOf(marker) : -1;
        if (at >= 0) {
          answered = this.err.slice(0, at);
          this.err = this.err.slice(at + marker.length);
        }
        if (answered !== undefined && (!stdoutDone || stdoutDone(this.out, answered))) {
          const stdout = this.out;
          this.out = '';
          return { stderr: answered, timedOut: false, died: false, ...(stdoutDone ? { stdout } : {}) };
        }
        if (this.exited || timedOut) {
          const stderr = answered ?? this.err;
          if (timedOut) this.opts.group ? killGroup(child.pid) : child.kill('SIGKILL');
          this.recycle();
          return { stderr, timedOut, died: true, ...(this.startFailed ? { failedToStart: true } : {}) };
        }
        await new Promise<void>((resolve) => {
          this.wake = resolve;
        });
        this.wake = undefined;
      }
    } finally {
      clearTimeout(timer);
    }
  }
}

/**
 * A file's text as ONE read(2) gives it, if that holds at most `maxBytes`; undefined when it
 * holds more. A regular file's read returns all of it up to the buffer (64 KiB or more); a
 * /proc seq_file's returns records until the next would overflow its page-sized buffer, so text
 * of at most a page less one record (the caller's `maxBytes`, see PROC_CONNTRACK_MAX) is the
 * whole file, and a second read would only walk it again (for /proc/net/nf_conntrack, the whole
 * hash: as long as the first).
 */
function readCapped(path: string, maxBytes: number): string | undefined {
  const fd = openSync(path, 'r');
  try {
    const buf = Buffer.allocUnsafe(Math.max(maxBytes + 1, 65536));
    const n = readSync(fd, buf, 0, buf.length, null);
    return n > maxBytes ? undefined : buf.toString('utf8', 0, n);
  } finally {
    closeSync(fd);
  }
}

/** Quiet time after an answer before the daemon forks its own spares (runner on). */
const SPARES_AFTER_IDLE_MS = 25;

/**
 * Largest script a runner takes: the shell reads its input a byte per read(2). A command's
 * iptables script is one or two hundred bytes; larger ones start the tool directly.
 */
const RUNNER_MAX_CHARS = 2048;

/** What the runner writes after the tool's output: its exit status follows. */
const RC_LINE = '\nnatgw-rc ';

/**
 * The runner: a shell that keeps the tool ("$@") started ahead and gives it one request's
 * lines on stdin. Each turn of the loop starts a pipeline at once: the tool, waiting for its
 * input (a prestartable tool does nothing before it), and a subshell that reads the next
 * request from the runner's stdin (a line count, then the lines) and writes it into the pipe.
 * The tool's stdout and stderr go to the shell's stderr, then RC_LINE, its exit status and the
 * marker ($0). The lines are data, read into a variable and printed, never evaluated. At the
 * end of the runner's stdin the subshell ends the loop (the waiting tool reads an empty input
 * and ends having done nothing).
 */
const RUNNER_SH = `while :; do
  {
    IFS= read -r n || { kill $$; exit 0; }
    s= nl=
    while [ "$n" -gt 0 ]; do IFS= read -r l; s="$s$nl$l"; nl='
'; n=$((n-1)); done
    printf '%s\\n' "$s"
  } | "$@" >&2
  printf '\\nnatgw-rc %s %s\\n' "$?" "$0" >&2
done
`;

/** Exchanges before a session's process is replaced. */
const RECYCLE_AFTER = 1000;

/** A recorder for unit tests of planners: answers from a table and remembers what ran. */
export class RecordingExecutor implements Executor {
  readonly calls: ExecRequest[] = [];
  readonly detached: ExecRequest[] = [];
  constructor(private readonly answer: (req: ExecRequest) => Partial<ExecResult> | undefined = () => undefined) {}

  async run(req: ExecRequest): Promise<ExecResult> {
    this.calls.push(req);
    const a = this.answer(req) ?? {};
    return {
      command: [req.file, ...req.args].join(' '),
      exitCode: 0,
      stdout: '',
      stderr: '',
      timedOut: false,
      failedToStart: false,
      ...a,
    };
  }

  spawnDetached(req: ExecRequest): void {
    this.detached.push(req);
  }
}
