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
