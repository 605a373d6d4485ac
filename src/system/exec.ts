import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import type { Logger } from 'pino';
import { SystemError } from '../model/errors.js';

/**
 * The one door to short-lived processes. Every tool natgw runs on the command path goes through
 * an Executor, with an argument array (never a shell string) and optionally a script on stdin
 * rendered from validated, typed values. Long-lived children (monitors, conntrackd) are
 * supervised with execa (supervised.ts).
 */
export interface ExecRequest {
  readonly file: string;
  readonly args: readonly string[];
  /** Script fed on stdin (iptables-restore, nft -f -, ip -batch -); without it stdin is empty. */
  readonly input?: string;
  /** Capped by the executor's deadline (NATGW_TOOL_TIMEOUT). */
  readonly timeoutMs?: number;
}

/** What a run gave back, whatever its exit status (execa's result with `reject: false`). */
export interface ExecResult {
  /** The command as the log and the errors show it, e.g. `nft -f -`. */
  readonly command: string;
  /** 124 when killed at the deadline, 127 when it could not start or died of a signal. */
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
  readonly timedOut: boolean;
  /** The binary was not found or could not be started. */
  readonly failedToStart: boolean;
}

export interface Executor {
  run(req: ExecRequest): Promise<ExecResult>;
  /**
   * A kernel status file of this process's own network namespace (/proc/net/…), read without a
   * tool; undefined when unreadable. Absent where the executor is not the kernel's here (fakes,
   * an executor running tools in another namespace): callers then ask the tool.
   */
  readKernelFile?(path: string): Promise<string | undefined>;
}

function firstLine(s: string): string {
  return s.trim().split('\n')[0] ?? '';
}

/**
 * A tool refused what natgw asked of it, or could not run: the one error type for every tool
 * (after execa's: command, exitCode, timedOut, shortMessage, stdout, stderr), built only here
 * from the run's result, so a caller tells a kernel refusal from a bug the same way for all of
 * them and a user reads one shape of message. The refused script is kept for the log.
 */
export class ExecError extends SystemError {
  override readonly name = 'ExecError';
  readonly command: string;
  readonly exitCode: number;
  readonly timedOut: boolean;
  readonly failedToStart: boolean;
  readonly stdout: string;
  readonly stderr: string;
  /** `<command> failed with exit code N` / `timed out` / `could not start`. */
  readonly shortMessage: string;
  /**
   * @param action what was refused, for the message: `the transaction`, `the listing`.
   * @param script the script the tool was given, kept for the log.
   */
  constructor(
    result: ExecResult,
    readonly action = 'the command',
    readonly script?: string,
  ) {
    const how = result.timedOut ? 'timed out' : result.failedToStart ? 'could not start' : `failed with exit code ${result.exitCode}`;
    const why = firstLine(result.stderr) || firstLine(result.stdout) || `${result.command} ${how}`;
    super(`Error: ${result.command} refused ${action}: ${why}`);
    this.command = result.command;
    this.exitCode = result.exitCode;
    this.timedOut = result.timedOut;
    this.failedToStart = result.failedToStart;
    this.stdout = result.stdout;
    this.stderr = result.stderr;
    this.shortMessage = `${result.command} ${how}`;
  }
}

/** Run and throw an ExecError unless the tool exited 0. */
export async function runChecked(exec: Executor, req: ExecRequest, action?: string): Promise<ExecResult> {
  const r = await exec.run(req);
  if (r.exitCode !== 0) throw new ExecError(r, action, req.input);
  return r;
}

const DEFAULT_TIMEOUT_MS = 30_000;

/** Output (both streams) kept before the tool is killed: far above any listing natgw reads. */
const MAX_OUTPUT_BYTES = 100 * 1024 * 1024;

/** The tools' environment: natgw's own, with messages in the C locale (parsers read them). */
export function toolEnv(): NodeJS.ProcessEnv {
  return { ...process.env, LC_ALL: 'C' };
}

/**
 * Runs tools on node:child_process. Every run has a deadline (NATGW_TOOL_TIMEOUT caps every
 * per-call timeout): a tool that hangs would otherwise hold the engine's queue, and with it
 * every command, forever. The tool leads a process group of its own, killed whole at the
 * deadline, because a wrapper (`bash` sequencing nft phases, `ip netns exec`) can leave a
 * grandchild holding the output pipes open, and the run would not end when its direct child died.
 */
export class SystemExecutor implements Executor {
  private readonly deadlineMs: number;

  constructor(
    private readonly log?: Logger,
    opts: { readonly deadlineMs?: number } = {},
  ) {
    this.deadlineMs = opts.deadlineMs ?? DEFAULT_TIMEOUT_MS;
  }

  run(req: ExecRequest): Promise<ExecResult> {
    const started = Date.now();
    const limit = Math.min(req.timeoutMs ?? this.deadlineMs, this.deadlineMs);
    const command = [req.file, ...req.args].join(' ');
    return new Promise((resolve) => {
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      let bytes = 0;
      let timedOut = false;
      let overflow = false;
      let startError: Error | undefined;
      let done = false;
      let timer: NodeJS.Timeout | undefined;
      const finish = (code: number | null, signal: NodeJS.Signals | null) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        const failedToStart = startError !== undefined;
        const note = timedOut
          ? `${command}: timed out after ${limit} ms (NATGW_TOOL_TIMEOUT) and was killed\n`
          : startError
            ? `${startError.message}\n`
            : overflow
              ? `${command}: output above ${MAX_OUTPUT_BYTES} bytes; killed\n`
              : '';
        const result: ExecResult = {
          command,
          // Killed at the deadline: 124 as timeout(1) says; by another signal or never started: 127.
          exitCode: timedOut ? 124 : (code ?? (signal !== null || failedToStart ? 127 : 0)),
          stdout: Buffer.concat(out).toString('utf8'),
          stderr: (timedOut ? note : '') + Buffer.concat(err).toString('utf8') + (timedOut ? '' : note),
          timedOut,
          failedToStart,
        };
        if (timedOut) this.log?.error({ cmd: command, ms: Date.now() - started, limitMs: limit }, 'tool timed out: killed its process group');
        this.log?.debug({ cmd: command, exitCode: result.exitCode, ms: Date.now() - started, stdinBytes: req.input?.length ?? 0 }, 'exec');
        resolve(result);
      };
      let child: ReturnType<typeof spawn>;
      try {
        child = spawn(req.file, [...req.args], {
          detached: true,
          env: toolEnv(),
          stdio: [req.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
        });
      } catch (e) {
        startError = e as Error;
        finish(null, null);
        return;
      }
      const killGroup = () => {
        try {
          if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
        } catch {
          // already gone
        }
      };
      timer = setTimeout(() => {
        timedOut = true;
        killGroup();
      }, limit);
      const collect = (into: Buffer[]) => (d: Buffer) => {
        bytes += d.length;
        if (bytes > MAX_OUTPUT_BYTES) {
          overflow = true;
          killGroup();
          return;
        }
        into.push(d);
      };
      child.stdout?.on('data', collect(out));
      child.stderr?.on('data', collect(err));
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
        child.stdin.end(req.input);
      }
    });
  }

  async readKernelFile(path: string): Promise<string | undefined> {
    // Synchronous: a /proc file is made in memory as it is read, and its read never waits on a
    // disk; through the thread pool each of open, read and close cost a round trip of the event
    // loop, on a delete's path.
    try {
      return readFileSync(path, 'utf8');
    } catch {
      return undefined;
    }
  }
}
