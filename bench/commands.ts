/**
 * Per-command latency against a gateway holding a given state: each series creates fresh
 * identities one request (or one shim exec) at a time, as the controller does, and its
 * delete series removes them again, so every series starts from the same size.
 */
import { api } from './daemon.js';
import { SHIM, type Gateway } from './gateway.js';
import { summarize, type Summary } from './stats.js';
import { SHIM_K0, op } from './workload.js';

export const COMMANDS = ['dnat-add', 'dnat-del', 'snat-add', 'snat-del', 'floating-ip-add', 'floating-ip-del'] as const;
export type Command = (typeof COMMANDS)[number];
export type CommandFigures = Partial<Record<Command, Summary & { firstError?: string }>>;

interface Outcome {
  readonly ms: number;
  readonly error?: string;
}

async function series(n: number, one: (k: number) => Promise<Outcome>): Promise<Summary & { firstError?: string }> {
  const times: number[] = [];
  let failures = 0;
  let firstError: string | undefined;
  for (let k = 0; k < n; k++) {
    const r = await one(k);
    if (r.error === undefined) times.push(r.ms);
    else {
      failures++;
      firstError ??= r.error;
    }
  }
  return { ...summarize(times, failures), ...(firstError ? { firstError } : {}) };
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

export async function apiSeries(gw: Gateway, n: number): Promise<CommandFigures> {
  const out: CommandFigures = {};
  for (const cmd of COMMANDS) {
    out[cmd] = await series(n, async (k) => {
      const [method, path, body, want] = request(cmd, k);
      const t = process.hrtime.bigint();
      const r = await api(gw.socket, method, path, body).catch((e: Error) => ({ status: 0, text: e.message }));
      const ms = Number(process.hrtime.bigint() - t) / 1e6;
      return r.status === want ? { ms } : { ms, error: `${method} ${path} → ${r.status} ${r.text.slice(0, 300)}` };
    });
  }
  return out;
}

/** SPEC §1: success is exit 0 with nothing on stderr but `Warning:` lines. */
export function legacyError(exitCode: number, stdout: string, stderr: string): string | undefined {
  const bad = stderr.split('\n').filter((l) => l !== '' && !l.startsWith('Warning:'));
  if (exitCode === 0 && bad.length === 0) return undefined;
  return `exit ${exitCode}: ${(bad.join(' | ') || stdout).trim().slice(0, 300)}`;
}

export async function shimSeries(gw: Gateway, n: number): Promise<CommandFigures> {
  const out: CommandFigures = {};
  const env = gw.shimEnv();
  for (const cmd of COMMANDS) {
    out[cmd] = await series(n, async (k) => {
      const r = await gw.runner.run(['bash', SHIM, cmd, legacyRule(cmd, SHIM_K0 + k)], { env });
      const error = legacyError(r.exitCode, r.stdout, r.stderr);
      return error === undefined ? { ms: r.ms } : { ms: r.ms, error };
    });
  }
  return out;
}
