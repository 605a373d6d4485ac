import type { ExecRequest, ExecResult, Executor } from '../../src/system/exec.js';

/** A recorded tool run as one line, for comparing what the engine ran. */
export const cmd = (r: ExecRequest): string => [r.file, ...r.args].join(' ');

/** A run that reads the kernel back (a listing): a partial sync runs none. */
export const isListing = (r: ExecRequest): boolean =>
  r.args.some((a) => a === 'list' || a === 'show' || a.endsWith('-save')) || (r.file === 'ip' && r.args.includes('-j'));

/** An nft transaction. */
export const isApply = (r: ExecRequest): boolean => r.file === 'nft' && r.args.includes('-f');

/** A real executor (`inner`) that remembers every run. */
export class RecordedExecutor<E extends Executor = Executor> implements Executor {
  readonly calls: ExecRequest[] = [];
  constructor(readonly inner: E) {}
  run(req: ExecRequest): Promise<ExecResult> {
    this.calls.push(req);
    return this.inner.run(req);
  }
}

/** A fake executor for unit tests of planners: answers from a table and remembers what ran. */
export class RecordingExecutor implements Executor {
  readonly calls: ExecRequest[] = [];
  constructor(private readonly answer: (req: ExecRequest) => Partial<ExecResult> | undefined = () => undefined) {}

  async run(req: ExecRequest): Promise<ExecResult> {
    this.calls.push(req);
    return resultOf(req, this.answer(req) ?? {});
  }
}

/** A tool run's result for `req`: a clean exit with no output, unless `over` says otherwise. */
export function resultOf(req: ExecRequest, over: Partial<ExecResult> = {}): ExecResult {
  return { command: cmd(req), exitCode: 0, stdout: '', stderr: '', timedOut: false, failedToStart: false, ...over };
}
