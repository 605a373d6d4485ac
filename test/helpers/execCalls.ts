import type { ExecRequest, ExecResult, Executor, ToolSession } from '../../src/system/exec.js';

/** A recorded tool run as one line, for comparing what the engine ran. */
export const cmd = (r: ExecRequest): string => [r.file, ...r.args].join(' ');

/** A run that reads the kernel back (a listing): a partial sync runs none. */
export const isListing = (r: ExecRequest): boolean =>
  r.args.some((a) => a === 'list' || a === 'show' || a.endsWith('-save')) || (r.file === 'ip' && r.args.includes('-j'));

/** An nft transaction. */
export const isApply = (r: ExecRequest): boolean => r.file === 'nft' && r.args.includes('-f');

/** A real executor (`inner`) that remembers every run; sessions pass through, unrecorded. */
export class RecordedExecutor<E extends Executor = Executor> implements Executor {
  readonly calls: ExecRequest[] = [];
  constructor(readonly inner: E) {}
  run(req: ExecRequest): Promise<ExecResult> {
    this.calls.push(req);
    return this.inner.run(req);
  }
  spawnDetached(req: ExecRequest): void {
    this.inner.spawnDetached(req);
  }
  session(file: string, args: readonly string[]): ToolSession {
    const s = this.inner.session?.(file, args);
    if (!s) throw new Error('the inner executor keeps no sessions');
    return s;
  }
}
