/**
 * Running the shim (image/nat-gateway.sh) as the controller does and capturing its raw bytes;
 * the command sequence its client tests compare across paths; the daemon's request counts.
 * Shared by the shim's netns tests.
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import http from 'node:http';
import { join } from 'node:path';
import { ADDR, REPO_ROOT, type Topology } from '../helpers/netns.js';
import { waitFor } from '../helpers/poll.js';
import type { Daemon } from './daemon-util.js';

export const SHIM = join(REPO_ROOT, 'image', 'nat-gateway.sh');
export const EIP = '172.20.0.10';

export interface Run {
  readonly argv: string;
  readonly status: number;
  /** Hex, so that a single differing byte shows. */
  readonly stdout: string;
  readonly stderr: string;
}

/** Every argument byte-escaped for printf %b: the wrapper rebuilds the exact bytes, invalid UTF-8 included. */
export const escapeArg = (a: string | Buffer): string =>
  [...Buffer.from(a)].map((b) => (/[A-Za-z0-9]/.test(String.fromCharCode(b)) ? String.fromCharCode(b) : `\\x${b.toString(16).padStart(2, '0')}`)).join('');

export const WRAPPER = 'shim=$1; shift; args=(); for a in "$@"; do v=$(printf "%bx" "$a"); args+=("${v%x}"); done; exec bash "$shim" "${args[@]}"';

/** `bash nat-gateway.sh argv...` in gw with natgw's environment plus `env`; raw bytes out. */
export function shim(topo: Topology, argv: readonly (string | Buffer)[], env: Record<string, string> = {}, where: 'gw' | 'host' = 'gw'): Promise<Run> {
  const full = { ...topo.natgwEnv(), ...env };
  const bash = '/bin/bash';
  const inner = [bash, '-c', WRAPPER, 'wrapper', SHIM, ...argv.map(escapeArg)];
  // 'host': for stand-in daemons the test process serves on its own loopback; such a run must
  // have neither nc nor node on PATH, so that nothing can reach a real natgw from there.
  const [file, ...args] = where === 'gw' ? ['ip', 'netns', 'exec', topo.ns.gw, ...inner] : inner;
  const child = spawn(file!, args, {
    env: full,
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  child.stdout.on('data', (c: Buffer) => out.push(c));
  child.stderr.on('data', (c: Buffer) => err.push(c));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        // gone already
      }
      reject(new Error(`shim ${argv.join(' ')} timed out`));
    }, 45_000);
    child.once('error', reject);
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      resolve({
        argv: argv.map(String).join(' '),
        status: code ?? 128 + (signal === 'SIGKILL' ? 9 : 0),
        stdout: Buffer.concat(out).toString('hex'),
        stderr: Buffer.concat(err).toString('hex'),
      });
    });
  });
}

export const text = (hex: string) => Buffer.from(hex, 'hex').toString('utf8');

/** Successes, idempotent repeats, a conflict, validation errors, unknown commands, hostile arguments; ends where it began. */
export const SEQUENCE: readonly (readonly (string | Buffer)[])[] = [
  ['eip-add', `${EIP}/24`],
  ['dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`],
  ['dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`],
  ['dnat-add', `${EIP},8080,tcp,${ADDR.vpc2},80`],
  ['dnat-add', `${EIP},http,tcp,${ADDR.vpc1},80`],
  ['snat-add', `${EIP},${ADDR.vpcCidr}`],
  ['dnat-add', ''],
  ['dnat-add', 'a b', `it's "quoted"`, '$(touch /tmp/natgw-pwned)', '`id`; rm -rf /', 'line1\nline2\n', '', '+&=%25;|*?~\\'],
  ['snat-add', '', ''],
  ['frobnicate', 'x y', '$HOME'],
  ['frob nic"ate$(id)', 'a\nb'],
  [''],
  ['', ''],
  ['dnat-add', Buffer.from([0x31, 0xff, 0xfe, 0x2c, 0xe2, 0x82, 0x0a])],
  ['dnat-add', `${EIP},9090,tcp,${ADDR.vpc2},80,extra`],
  ['subnet-route-add', 'not-a-cidr'],
  ['init', 'a'],
  ['init', 'x,', ''],
  ['snat-del', `${EIP},${ADDR.vpcCidr}`],
  ['dnat-del', `${EIP},8080,tcp`],
  ['eip-del', `${EIP}/24`],
];

/** A shorter round for the in-process paths (each run starts Node.js and the engine). */
export const SHORT = [0, 1, 3, 7, 9, 16, 19, 20].map((i) => SEQUENCE[i]!);

export async function runSequence(topo: Topology, env: Record<string, string>, seq = SEQUENCE): Promise<Run[]> {
  const out: Run[] = [];
  for (const argv of seq) out.push(await shim(topo, argv, env));
  return out;
}

/** Lines the daemon logged for requests to exactly this path. */
export const countRequests = (d: Daemon, path: string) =>
  d
    .logs()
    .split('\n')
    .filter((l) => l.includes(`"path":"${path}"`)).length;

/**
 * The daemon logs a request once its answer is sent, and the line reaches the test through a
 * pipe some time after the shim got that answer. A marker request sent after the shim returned
 * is logged after it: once the marker's line is in, so is every line before it.
 */
export async function settleLogs(socketPath: string, d: Daemon): Promise<void> {
  const marker = `/v1/openapi.json?settle=${Math.random().toString(36).slice(2)}`;
  await new Promise<void>((resolve, reject) => {
    const req = http.request({ socketPath, path: marker, method: 'GET' }, (res) => {
      res.resume();
      res.on('end', resolve);
    });
    req.on('error', reject);
    req.end();
  });
  await waitFor(async () => d.logs().includes(`"path":"${marker}"`), { timeoutMs: 10_000, intervalMs: 20, what: `the daemon's log line for ${marker}` });
}

/** The requests for `path` the daemon logged so far (see settleLogs). */
export async function requestsVia(socketPath: string, d: Daemon, path: string): Promise<number> {
  await settleLogs(socketPath, d);
  return countRequests(d, path);
}

/**
 * A PATH directory holding only `tools` (symlinks to the system's): a shim run that succeeds
 * with it never started what is left out (node, nc). The caller removes it.
 */
export function pathWith(tools: readonly string[], needs: string): string {
  const dir = mkdtempSync(join(tmpdir(), `natgw-${tools.join('-')}-`));
  for (const tool of tools) {
    const at = ['/usr/sbin', '/usr/bin', '/sbin', '/bin'].map((d) => join(d, tool)).find((p) => existsSync(p));
    if (!at) throw new Error(`${tool} not found: ${needs} needs it (scripts/setup.sh installs it)`);
    symlinkSync(at, join(dir, tool));
  }
  return dir;
}
