import { SystemExecutor, type ExecRequest, type ExecResult, type Executor } from '../../src/system/exec.js';

/**
 * The production Executor, one network namespace over: every tool runs under
 * `ip netns exec <ns>`, the way natgw runs inside the gateway pod. For module-level
 * real-kernel tests that drive a backend or manager directly.
 */
export class NetnsExecutor implements Executor {
  private readonly inner = new SystemExecutor();
  constructor(private readonly ns: string) {}

  run(req: ExecRequest): Promise<ExecResult> {
    return this.inner.run(this.wrap(req));
  }

  private wrap(req: ExecRequest): ExecRequest {
    return { ...req, file: 'ip', args: ['netns', 'exec', this.ns, req.file, ...req.args] };
  }
}
