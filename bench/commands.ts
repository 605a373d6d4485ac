/**
 * Per-command latency against a gateway holding a given state: fresh identities created one
 * request (or one shim exec) at a time, as the controller does, and removed again by the
 * delete right after, so every sample finds the gateway at the same size.
 */
import { api } from './daemon.js';
import { SHIM, type Gateway } from './gateway.js';
import type { FloorSample, KernelFloor } from './floors.js';
import { summarize, type Summary } from './stats.js';
import { SHIM_K0, op } from './workload.js';

export const COMMANDS = ['dnat-add', 'dnat-del', 'snat-add', 'snat-del', 'floating-ip-add', 'floating-ip-del'] as const;
export type Command = (typeof COMMANDS)[number];
export type CommandFigures = Partial<Record<Command, Summary & { firstError?: string }>>;

interface Outcome {
  readonly ms: number;
  readonly error?: string;
}

/** As the README writes identities: commas literal, a CIDR's slash as %2F. */
const enc = (id: string): string => id.replaceAll('/', '%2F');

/** The API request of sample k of a command: method, path, body, the status that means success. */
export function request(cmd: Command, k: number): [string, string, unknown, number] {
  const d = op.dnat(k);
  const s = op.snat(k);
  const f = op.fip(k);
  switch (cmd) {
    case 'dnat-add':
      return ['PUT', `/v1/dnats/${enc(`${d.eip},${d.port},${d.protocol}`)}`, { internalIp: d.internalIp, internalPort: d.internalPort }, 201];
    case 'dnat-del':
      return ['DELETE', `/v1/dnats/${enc(`${d.eip},${d.port},${d.protocol}`)}`, undefined, 204];
    case 'snat-add':
      return ['PUT', `/v1/snats/${enc(`${s.eip},${s.cidr}`)}`, { randomFully: false }, 201];
    case 'snat-del':
      return ['DELETE', `/v1/snats/${enc(`${s.eip},${s.cidr}`)}`, undefined, 204];
    case 'floating-ip-add':
      return ['PUT', `/v1/fips/${enc(f.eip)}`, { internalIp: f.internalIp }, 201];
    case 'floating-ip-del':
      return ['DELETE', `/v1/fips/${enc(f.eip)}`, undefined, 204];
  }
}

/** The script's rule argument of sample k of a command. */
export function legacyRule(cmd: Command, k: number): string {
  const d = op.dnat(k);
  const s = op.snat(k);
  const f = op.fip(k);
  switch (cmd) {
    case 'dnat-add':
      return `${d.eip},${d.port},${d.protocol},${d.internalIp},${d.internalPort}`;
    case 'dnat-del':
      return `${d.eip},${d.port},${d.protocol}`;
    case 'snat-add':
      return `${s.eip},${s.cidr}`;
    case 'snat-del':
      return `${s.eip},${s.cidr}`;
    case 'floating-ip-add':
      return `${f.eip},${f.internalIp}`;
    case 'floating-ip-del':
      return f.eip;
  }
}

/** Each command's samples as they come, with the first failure kept. */
class Samples {
  private readonly times = new Map<Command, number[]>();
  private readonly failures = new Map<Command, number>();
  private readonly firstError = new Map<Command, string>();

  add(cmd: Command, r: Outcome): void {
    if (r.error === undefined) (this.times.get(cmd) ?? this.times.set(cmd, []).get(cmd))?.push(r.ms);
    else {
      this.failures.set(cmd, (this.failures.get(cmd) ?? 0) + 1);
      if (!this.firstError.has(cmd)) this.firstError.set(cmd, r.error);
    }
  }

  figures(): CommandFigures {
    const out: CommandFigures = {};
    for (const cmd of COMMANDS) {
      const e = this.firstError.get(cmd);
      out[cmd] = { ...summarize(this.times.get(cmd) ?? [], this.failures.get(cmd) ?? 0), ...(e ? { firstError: e } : {}) };
    }
    return out;
  }
}

/** The pause before a round's floor sample, for the daemon's last tool run to end (see apiRounds). */
const FLOOR_SETTLE_MS = 5;

async function apiRequest(gw: Gateway, cmd: Command, k: number): Promise<Outcome> {
  const [method, path, body, want] = request(cmd, k);
  const t = process.hrtime.bigint();
  const r = await api(gw.socket, method, path, body).catch((e: Error) => ({ status: 0, text: e.message }));
  const ms = Number(process.hrtime.bigint() - t) / 1e6;
  return r.status === want ? { ms } : { ms, error: `${method} ${path} → ${r.status} ${r.text.slice(0, 300)}` };
}

/**
 * The API commands in rounds: round k takes one sample of the kernel floor (when given), then
 * sample k of every command in turn, each add's delete right after it. Every command and the
 * floor then share the same moments of the run (a shared machine's load moves within a minute,
 * so a floor measured in a phase of its own is a ratio's other half taken at another time), and
 * no command takes more of a daemon's early life than another. Identities from `k0` on.
 */
export async function apiRounds(
  gw: Gateway,
  n: number,
  opts: { floor?: KernelFloor; k0?: number } = {},
): Promise<{ api: CommandFigures; floor: FloorSample[] }> {
  const samples = new Samples();
  const floor: FloorSample[] = [];
  for (let k = 0; k < n; k++) {
    if (opts.floor) {
      // What the last command left running settles first (the daemon's runner starts its next
      // tool once it answered): the floor is one bare tool on an otherwise idle gateway, and
      // the commands that follow still come back to back.
      await new Promise((r) => setTimeout(r, FLOOR_SETTLE_MS));
      floor.push(await opts.floor.sample(k));
    }
    for (const cmd of COMMANDS) samples.add(cmd, await apiRequest(gw, cmd, (opts.k0 ?? 0) + k));
  }
  return { api: samples.figures(), floor };
}

/** SPEC §1: success is exit 0 with nothing on stderr but `Warning:` lines. */
export function legacyError(exitCode: number, stdout: string, stderr: string): string | undefined {
  const bad = stderr.split('\n').filter((l) => l !== '' && !l.startsWith('Warning:'));
  if (exitCode === 0 && bad.length === 0) return undefined;
  return `exit ${exitCode}: ${(bad.join(' | ') || stdout).trim().slice(0, 300)}`;
}

/** The shim's commands in rounds, as apiRounds (no floor: the shim is compared with an ideal call). */
export async function shimRounds(gw: Gateway, n: number, k0 = SHIM_K0): Promise<CommandFigures> {
  const samples = new Samples();
  const env = gw.shimEnv();
  for (let k = 0; k < n; k++) {
    for (const cmd of COMMANDS) {
      const r = await gw.runner.run(['bash', SHIM, cmd, legacyRule(cmd, k0 + k)], { env });
      const error = legacyError(r.exitCode, r.stdout, r.stderr);
      samples.add(cmd, error === undefined ? { ms: r.ms } : { ms: r.ms, error });
    }
  }
  return samples.figures();
}
