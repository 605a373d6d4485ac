import { spawn } from 'node:child_process';
import { closeSync, existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { Logger } from 'pino';
import type { Config } from '../config/config.js';
import type { CommandOutput } from '../engine/output.js';
import { NO_DAEMON, requestJson } from './client.js';
import { LOG_TO_ENV, openDaemonLog } from './daemonLog.js';
import { socketAnswers } from '../daemon/listeners.js';

/**
 * The shim's path to the daemon (SPEC §4.1): POST /v1/legacy over the Unix socket (no token:
 * the socket's mode protects it). Where no daemon answers, start one (unless
 * NATGW_AUTOSTART=false) and forward to it; if that fails too, return undefined and the
 * caller runs the command in-process, under the same lock. The output is the command's own
 * output on every path.
 *
 * help and get-iptables-version run in-process: they read no state and take no lock, and
 * their output is the same text either way. Everything else, unknown commands included, goes
 * to the daemon, so this module (and a forwarded run) loads none of the engine.
 */
const IN_PROCESS = new Set(['get-iptables-version', 'help']);

/** How long a freshly started daemon has to answer on its socket. */
const AUTOSTART_DEADLINE_MS = 5000;

/**
 * The daemon's heap limits, two of the V8 options Node.js documents, given where natgw starts the
 * daemon: here (the autostart) and in the shim's `serve` (image/nat-gateway.sh; a test keeps the
 * two equal). They hold its peak RSS under the target at the largest benchmarked size, where the
 * 512 MiB old space is more than ten times the live heap: why and how much in docs/performance.md
 * ("heap limits" among the kept mechanisms, and where the daemon's memory peaks).
 */
export const DAEMON_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=2', '--max-old-space-size=512'];

/** A command sent to a daemon. `absent`: nothing listens there (run elsewhere); `failed`: it answered but did not run it. */
export type Attempt = { kind: 'ok'; out: CommandOutput } | { kind: 'absent' } | { kind: 'failed'; why: string };

/**
 * The fast path, before any configuration is validated: one attempt at a running daemon, or
 * undefined for a command that runs in-process. A forwarded command then loads nothing but
 * node:http (start-up time is most of a shim call).
 */
export async function tryRunningDaemon(socket: string, command: string | undefined, args: readonly string[]): Promise<Attempt | undefined> {
  if (command === undefined || command === 'serve' || IN_PROCESS.has(command)) return undefined;
  return post(socket, command, args);
}

/** After a first attempt that did not run the command: start a daemon where none answered, and forward to it. */
export async function forward(config: Config, command: string, args: readonly string[], first: Attempt, log: Logger): Promise<CommandOutput | undefined> {
  if (first.kind === 'failed') {
    log.warn({ command, why: first.why }, 'daemon did not run the command; running in-process');
    return undefined;
  }
  if (!config.autostart) return undefined;
  if (!startDaemon(config, log)) return undefined;
  if (!(await waitForSocket(config.socket))) {
    log.warn({ socket: config.socket }, 'autostarted daemon did not answer in time; running in-process');
    return undefined;
  }
  const second = await post(config.socket, command, args);
  if (second.kind === 'ok') return second.out;
  log.warn({ command, why: second.kind === 'failed' ? second.why : 'no daemon' }, 'forwarding to the autostarted daemon failed; running in-process');
  return undefined;
}

/** POST /v1/legacy. */
async function post(socket: string, command: string, args: readonly string[]): Promise<Attempt> {
  let o: Partial<CommandOutput> | null;
  try {
    o = await requestJson<Partial<CommandOutput> | null>({ kind: 'socket', socket }, 'POST', '/v1/legacy', JSON.stringify({ command, rules: args }));
  } catch (e) {
    const code = ((e as Error).cause as NodeJS.ErrnoException | undefined)?.code;
    return NO_DAEMON.has(code ?? '') ? { kind: 'absent' } : { kind: 'failed', why: (e as Error).message };
  }
  if (typeof o?.status !== 'number' || typeof o.stdout !== 'string' || typeof o.stderr !== 'string') return { kind: 'failed', why: 'malformed answer' };
  return { kind: 'ok', out: { status: o.status, stdout: o.stdout, stderr: o.stderr } };
}

/** bin/natgw.js of this installation (dist/src/cli → repository root), else the script running now. */
function natgwBin(): string | undefined {
  const fromHere = fileURLToPath(new URL('../../../bin/natgw.js', import.meta.url));
  if (existsSync(fromHere)) return fromHere;
  const argv1 = process.argv[1];
  return argv1 && existsSync(argv1) ? argv1 : undefined;
}

/**
 * Start `natgw serve` detached, with this process's environment; it outlives the shim. Its
 * JSON log (stdout) and anything on its stderr go to the container's stdout where `kubectl
 * logs` reads it, else to natgw-daemon.log in the state dir (daemonLog.ts): the shim's own
 * stdout and stderr carry only the command's output.
 */
function startDaemon(config: Config, log: Logger): boolean {
  const bin = natgwBin();
  if (!bin) return false;
  const dest = openDaemonLog(config.stateDir);
  if (!dest) log.warn({ stateDir: config.stateDir }, 'daemon log unavailable; its output is discarded');
  const where = dest?.where ?? 'discarded';
  try {
    const out = dest?.fd ?? 'ignore';
    const child = spawn(process.execPath, [...DAEMON_NODE_FLAGS, bin, 'serve'], {
      detached: true,
      stdio: ['ignore', out, out],
      env: { ...process.env, [LOG_TO_ENV]: where },
    });
    child.on('error', (e) => log.warn({ err: e }, 'could not start the daemon'));
    child.unref();
    log.info({ pid: child.pid, bin, logs: where }, 'autostarted natgw daemon');
    return child.pid !== undefined;
  } catch (e) {
    log.warn({ err: e }, 'could not start the daemon');
    return false;
  } finally {
    if (dest) closeSync(dest.fd);
  }
}

async function waitForSocket(socketPath: string): Promise<boolean> {
  const deadline = Date.now() + AUTOSTART_DEADLINE_MS;
  for (let delay = 20; Date.now() < deadline; delay = Math.min(delay * 2, 200)) {
    if (await socketAnswers(socketPath)) return true;
    await new Promise((r) => setTimeout(r, Math.min(delay, Math.max(0, deadline - Date.now()))));
  }
  return socketAnswers(socketPath);
}
