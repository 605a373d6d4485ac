import { describe, expect, it } from 'vitest';
import { LinkManager } from '../../src/dataplane/link.js';
import { netDevNames } from '../../src/dataplane/linkPlan.js';
import type { ExecRequest, ExecResult, Executor } from '../../src/system/exec.js';

const PROC_NET_DEV = `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  eth0: 1065      11    0    0    0     0          0         0      936      10    0    0    0     0       0          0
net1-with-a-long:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
`;

/** `ip link show dev X` succeeds for the names in `ipKnows`. */
class FakeExec implements Executor {
  readonly runs: ExecRequest[] = [];
  constructor(private readonly ipKnows: readonly string[]) {}
  async run(req: ExecRequest): Promise<ExecResult> {
    this.runs.push(req);
    const ok = this.ipKnows.includes(req.args.at(-1) ?? '');
    return { command: req.file, exitCode: ok ? 0 : 1, stdout: '', stderr: ok ? '' : 'Device does not exist.\n', timedOut: false, failedToStart: false };
  }
}

describe('interface existence', () => {
  it('reads the names /proc/net/dev lists', () => {
    expect([...netDevNames(PROC_NET_DEV)]).toEqual(['lo', 'eth0', 'net1-with-a-long']);
    expect(netDevNames('').size).toBe(0);
  });

  it('answers from /proc/net/dev without a process, and asks ip for a name it does not list (an alternative name)', async () => {
    const exec = new FakeExec(['altname0']);
    const kernel = Object.assign(exec, { readKernelFile: async (path: string) => (path === '/proc/net/dev' ? PROC_NET_DEV : undefined) });
    const link = new LinkManager(kernel);
    expect(await link.exists('eth0')).toBe(true);
    expect(exec.runs).toEqual([]);
    expect(await link.exists('altname0')).toBe(true);
    expect(await link.exists('net1')).toBe(false);
    expect(exec.runs.map((r) => r.args.at(-1))).toEqual(['altname0', 'net1']);
    expect(await link.waitFor(['eth0', 'net1'], 0)).toEqual(['net1']);
  });

  it('asks ip where the executor reads no kernel files (another namespace, a fake)', async () => {
    const exec = new FakeExec(['eth0']);
    const link = new LinkManager(exec);
    expect(await link.exists('eth0')).toBe(true);
    expect(exec.runs).toHaveLength(1);
  });
});
