import type { ChildProcess } from 'node:child_process';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { NsRef, Topology } from '../test/helpers/netns.js';
import type { RunRequest, RunResult } from './nsrunner.js';

export type { RunResult };

/** A command timer living in one namespace of a topology (bench/nsrunner.ts); killed with the topology. */
export class NsRunner {
  private readonly child: ChildProcess;
  private readonly waiting: Array<(r: RunResult) => void> = [];
  private exited = false;
  private stderr = '';

  constructor(topo: Topology, ns: NsRef, env: Record<string, string>) {
    const entry = path.join(path.dirname(fileURLToPath(import.meta.url)), 'nsrunner.js');
    this.child = topo.spawn(ns, [process.execPath, entry], { env });
    this.child.stderr?.setEncoding('utf8').on('data', (d: string) => (this.stderr = (this.stderr + d).slice(-4096)));
    createInterface({ input: this.child.stdout! }).on('line', (line) => this.waiting.shift()?.(JSON.parse(line) as RunResult));
    this.child.once('exit', () => {
      this.exited = true;
      const dead: RunResult = { ms: Number.NaN, exitCode: 255, stdout: '', stderr: `bench runner exited: ${this.stderr}`, timedOut: false };
      for (const w of this.waiting.splice(0)) w(dead);
    });
  }

  /** One timed run; requests are answered in order, so callers may simply await them one by one. */
  run(argv: readonly string[], opts: Omit<RunRequest, 'argv'> = {}): Promise<RunResult> {
    if (this.exited) return Promise.reject(new Error(`bench runner is gone: ${this.stderr}`));
    return new Promise((resolve) => {
      this.waiting.push(resolve);
      this.child.stdin!.write(`${JSON.stringify({ argv, ...opts })}\n`);
    });
  }

  /** Like run(), but a non-zero exit is an error naming the command. */
  async ok(argv: readonly string[], opts: Omit<RunRequest, 'argv'> = {}): Promise<RunResult> {
    const r = await this.run(argv, opts);
    if (r.exitCode !== 0)
      throw new Error(`${argv.join(' ')} → exit ${r.exitCode}${r.timedOut ? ' (timed out)' : ''}: ${(r.stderr || r.stdout).trim().slice(0, 2000)}`);
    return r;
  }

  close(): void {
    this.child.stdin?.end();
  }
}
