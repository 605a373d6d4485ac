/**
 * Runs INSIDE a network namespace (bench/runner.ts starts it there with `ip netns exec`) and
 * times commands it is asked to run: one JSON request per stdin line, one JSON answer per
 * stdout line. Every figure that is a process (the shim, `nft`, `bash -c true`, the compared
 * script) is timed here, by one small parent, so they carry the same spawn overhead and none
 * carries `ip netns exec`'s own cost — inside the pod the controller's exec lands directly in
 * the namespace.
 */
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

export interface RunRequest {
  readonly argv: readonly string[];
  /** Replaces the runner's environment when given. */
  readonly env?: Record<string, string>;
  readonly input?: string;
  readonly timeoutMs?: number;
}

export interface RunResult {
  readonly ms: number;
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
  readonly timedOut: boolean;
}

const KEEP = 64 * 1024;

/**
 * What a started command's environment never holds: bash takes either as proof that sshd started
 * it (`run_by_ssh`) and, run with `-c`, then sources ~/.bashrc (a pod's exec sets neither).
 */
const SSH_MARKERS = ['SSH_CLIENT', 'SSH2_CLIENT'];

function envFor(given: Record<string, string> | undefined): NodeJS.ProcessEnv {
  const env = { ...(given ?? process.env) };
  for (const k of SSH_MARKERS) delete env[k];
  return env;
}

function run(req: RunRequest): Promise<RunResult> {
  return new Promise((resolve) => {
    const [file, ...args] = req.argv;
    let stdout = '';
    let stderr = '';
    let timedOut = false;
    const t0 = process.hrtime.bigint();
    // No input: stdin is /dev/null, as a pod exec without stdin gives it. Node's 'pipe' is a
    // socketpair, and bash run with `-c` and a socket on stdin takes it for rshd's connection:
    // with SHLVL unset (a bench started from cron, CI, a detached job) it sources ~/.bashrc,
    // which made `bash -c true` cost 130-150 ms here (pyenv init) against 2-4 ms.
    const child = spawn(file ?? 'false', args, { env: envFor(req.env), stdio: [req.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, req.timeoutMs ?? 120_000);
    child.stdout?.setEncoding('utf8').on('data', (d: string) => (stdout = (stdout + d).slice(-KEEP)));
    child.stderr?.setEncoding('utf8').on('data', (d: string) => (stderr = (stderr + d).slice(-KEEP)));
    child.stdin?.on('error', () => undefined);
    child.stdin?.end(req.input);
    const finish = (exitCode: number) => {
      clearTimeout(timer);
      resolve({ ms: Number(process.hrtime.bigint() - t0) / 1e6, exitCode, stdout, stderr, timedOut });
    };
    child.once('error', (e) => {
      stderr += String(e);
      finish(127);
    });
    // 'close', not 'exit': the caller of a command waits for its output to end, as kubectl exec does.
    child.once('close', (code, signal) => finish(code ?? (signal ? 128 + 9 : 1)));
  });
}

/**
 * BENCH_PRIVATE_ETC=<dir>: /etc becomes an overlay whose writes land in <dir>, for every
 * command this runner starts. `ip netns exec` already gave the runner a mount namespace of its
 * own (a slave of the host's), so the mount is seen by nothing else and goes with the runner. A
 * compared script may write /etc (the original writes /etc/kube-ovn/nat-gateway.env); the
 * host's /etc stays untouched, even if the bench is killed.
 */
function privateEtc(dir: string): void {
  for (const d of ['upper', 'work']) mkdirSync(join(dir, d), { recursive: true });
  const r = spawnSync('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=/etc,upperdir=${join(dir, 'upper')},workdir=${join(dir, 'work')}`, '/etc'], {
    encoding: 'utf8',
  });
  if (r.status !== 0) {
    process.stderr.write(`bench runner: cannot make /etc private: ${r.stderr || r.error}\n`);
    process.exit(1);
  }
}

async function main(): Promise<void> {
  if (process.env.BENCH_PRIVATE_ETC) privateEtc(process.env.BENCH_PRIVATE_ETC);
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (line.trim() === '') continue;
    const result = await run(JSON.parse(line) as RunRequest);
    process.stdout.write(`${JSON.stringify(result)}\n`);
  }
}

void main();
