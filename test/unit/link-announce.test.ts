import { describe, expect, it } from 'vitest';
import { LinkManager } from '../../src/dataplane/link.js';
import type { ExecRequest, ExecResult, Executor } from '../../src/system/exec.js';

/** Answers every run after a tick, counting how many run at once. */
class SlowExecutor implements Executor {
  readonly runs: ExecRequest[] = [];
  readonly detached: ExecRequest[] = [];
  running = 0;
  maxRunning = 0;
  async run(req: ExecRequest): Promise<ExecResult> {
    this.runs.push(req);
    this.running++;
    this.maxRunning = Math.max(this.maxRunning, this.running);
    await new Promise((r) => setTimeout(r, 5));
    this.running--;
    return { command: req.file, exitCode: 0, stdout: '', stderr: '', timedOut: false, failedToStart: false };
  }
  spawnDetached(req: ExecRequest): void {
    this.detached.push(req);
  }
}

describe('gratuitous ARP', () => {
  it('thousands of EIPs are announced a few at a time, every tool waited for (reaped), none detached', async () => {
    const exec = new SlowExecutor();
    const link = new LinkManager(exec);
    for (let i = 0; i < 300; i++) link.announce('net1', `172.20.${i >> 8}.${i & 255}`);
    link.announce('net1', 'fd00::10');
    await link.settle();
    expect(exec.runs).toHaveLength(301);
    expect(exec.maxRunning).toBeLessThanOrEqual(8);
    expect(exec.maxRunning).toBeGreaterThan(1);
    expect(exec.detached).toEqual([]);
    expect(exec.runs[0]).toMatchObject({ file: 'arping', args: ['-U', '-c', '3', '-I', 'net1', '172.20.0.0'] });
    // IPv6: an unsolicited neighbour advertisement to all nodes, override flag, the interface's MAC.
    expect(exec.runs.at(-1)).toMatchObject({ file: 'na6', args: ['-i', 'net1', '-s', 'fd00::10', '-d', 'ff02::1', '-t', 'fd00::10', '-o', '-e'] });
  });

  it('an EIP announced again while still queued is sent once (one already being sent goes again)', async () => {
    const exec = new SlowExecutor();
    const link = new LinkManager(exec);
    for (let i = 0; i < 20; i++) link.announce('net1', `172.20.0.${i}`);
    // Announcing starts once the turn that asked is over (its answer goes out first): none yet.
    expect(exec.runs).toHaveLength(0);
    // The pump's turn was queued first: after one turn the first eight are running.
    await new Promise((r) => setImmediate(r));
    expect(exec.runs).toHaveLength(8);
    for (let i = 0; i < 20; i++) link.announce('net1', `172.20.0.${i}`);
    await link.settle();
    const count = (ip: string) => exec.runs.filter((r) => r.args.at(-1) === ip).length;
    // The first eight were already running when announced again; the other twelve still queued.
    expect(exec.runs).toHaveLength(28);
    expect(count('172.20.0.0')).toBe(2);
    expect(count('172.20.0.19')).toBe(1);
  });
});
