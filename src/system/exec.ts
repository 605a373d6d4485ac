import { readFile } from 'node:fs/promises';
import { execa } from 'execa';
import type { Logger } from 'pino';

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
   * an executor running tools in another namespace): callers then ask the tool.
   */
  readKernelFile?(path: string): Promise<string | undefined>;
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

  constructor(
    private readonly log?: Logger,
    opts: { readonly deadlineMs?: number } = {},
  ) {
    this.deadlineMs = opts.deadlineMs ?? DEFAULT_TIMEOUT_MS;
  }

  async run(req: ExecRequest): Promise<ExecResult> {
    const started = Date.now();
    const limit = Math.min(req.timeoutMs ?? this.deadlineMs, this.deadlineMs);
    const child = execa(req.file, [...req.args], {
      input: req.input,
      reject: false,
      stripFinalNewline: false,
      detached: true,
      env: { LC_ALL: 'C' },
    });
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      killGroup(child.pid);
    }, limit);
    let r: Awaited<typeof child>;
    try {
      r = await child;
    } finally {
      clearTimeout(timer);
    }
    const command = [req.file, ...req.args].join(' ');
    const result: ExecResult = {
      command,
      exitCode: timedOut ? (r.exitCode ?? 124) || 124 : (r.exitCode ?? (r.failed ? 127 : 0)),
      stdout: String(r.stdout ?? ''),
      stderr: timedOut ? `${command}: timed out after ${limit} ms (NATGW_TOOL_TIMEOUT) and was killed\n${String(r.stderr ?? '')}` : String(r.stderr ?? ''),
      timedOut,
      failedToStart: r.exitCode === undefined && !timedOut && r.signal === undefined,
    };
    if (timedOut) this.log?.error({ cmd: command, ms: Date.now() - started, limitMs: limit }, 'tool timed out: killed its process group');
    this.log?.debug({ cmd: result.command, exitCode: result.exitCode, ms: Date.now() - started, stdinBytes: req.input?.length ?? 0 }, 'exec');
    return result;
  }

  async readKernelFile(path: string): Promise<string | undefined> {
    try {
      return await readFile(path, 'utf8');
    } catch {
      return undefined;
    }
  }

  spawnDetached(req: ExecRequest): void {
    try {
      const child = execa(req.file, [...req.args], { detached: true, stdio: 'ignore', cleanup: false, reject: false });
      child.unref();
      // A missing binary must not become an unhandled rejection.
      child.catch(() => undefined);
    } catch {
      // best effort: gratuitous ARP is advisory
    }
  }
}

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
