/**
 * `--compare '<command prefix>'`: the controller's legacy command sequence (init, eipCount(N)×
 * eip-add, then N× snat-add, dnat-add, floating-ip-add, dnat-del) through any command-compatible script —
 * the original Kube-OVN nat-gateway.sh, say — in its own fresh namespaces, and through natgw's
 * shim with the daemon running, per backend. Contract as the controller uses it: one
 * `<prefix> <command> <rule>` exec per call, success = exit 0 and no stderr but `Warning:`.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { legacyError } from './commands.js';
import { Gateway, SHIM, withRetryIfVanished, type BackendName } from './gateway.js';
import { progress } from './progress.js';
import { round, summarize, type Summary } from './stats.js';
import { in16, poolEip } from './workload.js';

export const SEQUENCE = ['init', 'eip-add', 'snat-add', 'dnat-add', 'floating-ip-add', 'dnat-del'] as const;
export type SequenceCommand = (typeof SEQUENCE)[number];

export interface SequenceFigures {
  readonly perCommand: Record<SequenceCommand, Summary & { firstError?: string }>;
  /** Sum of every call's time: what the controller waits for the whole sequence. */
  readonly totalMs: number;
}

export interface CompareRun {
  readonly n: number;
  readonly target: SequenceFigures;
  readonly natgw: Partial<Record<BackendName, SequenceFigures>>;
}

const EIP = poolEip(0);

/**
 * EIPs the sequence adds: one per 20 rules, at most 5. One eip-add was one sample, whatever a
 * busy machine did to it in that moment; the script's takes ~3 s each (it waits for arping).
 */
export const eipCount = (n: number): number => Math.max(1, Math.min(5, Math.floor(n / 20)));

/** The sequence's calls: [command, rule] in the order the controller would send them. */
export function sequence(n: number): Array<[SequenceCommand, string[]]> {
  const calls: Array<[SequenceCommand, string[]]> = [['init', ['eth0,net1']]];
  // The rules below all use the first; the others are EIPs of FIPs the sequence does not add.
  for (let i = 0; i < eipCount(n); i++) calls.push(['eip-add', [`${poolEip(i)}/16`]]);
  for (let i = 0; i < n; i++) calls.push(['snat-add', [`${EIP},10.${100 + (i >> 8)}.${i & 255}.0/24`]]);
  for (let i = 0; i < n; i++) calls.push(['dnat-add', [`${EIP},${1000 + i},tcp,10.0.1.${2 + (i % 250)},80`]]);
  for (let i = 0; i < n; i++) calls.push(['floating-ip-add', [`${in16(172, 21, i)},${in16(10, 2, i)}`]]);
  for (let i = 0; i < n; i++) calls.push(['dnat-del', [`${EIP},${1000 + i},tcp`]]);
  return calls;
}

async function runSequence(gw: Gateway, prefix: readonly string[], env: Record<string, string>, n: number, label: string): Promise<SequenceFigures> {
  const times = new Map<SequenceCommand, number[]>();
  const failures = new Map<SequenceCommand, { count: number; first: string }>();
  let totalMs = 0;
  const calls = sequence(n);
  let done = 0;
  for (const [cmd, rules] of calls) {
    const r = await gw.runner.run([...prefix, cmd, ...rules], { env, timeoutMs: 120_000 });
    totalMs += r.ms;
    const error = legacyError(r.exitCode, r.stdout, r.stderr);
    // A failed call is timed too: the controller waited for it all the same (and then retries).
    times.set(cmd, [...(times.get(cmd) ?? []), r.ms]);
    if (error !== undefined) {
      const f = failures.get(cmd);
      failures.set(cmd, { count: (f?.count ?? 0) + 1, first: f?.first ?? error });
    }
    if (++done % 500 === 0) progress(`compare ${label} N=${n}: ${done}/${calls.length} calls`);
  }
  const perCommand = Object.fromEntries(
    SEQUENCE.map((c) => {
      const f = failures.get(c);
      return [c, { ...summarize(times.get(c) ?? [], f?.count ?? 0), ...(f ? { firstError: f.first } : {}) }];
    }),
  ) as SequenceFigures['perCommand'];
  return { perCommand, totalMs: round(totalMs) };
}

export async function compare(prefixText: string, sizes: readonly number[], backends: readonly BackendName[], resync: string): Promise<CompareRun[]> {
  // Split on blanks, never through a shell: the prefix is a command line, not a script.
  const prefix = prefixText.trim().split(/\s+/);
  // What the compared script writes under /etc (see nsrunner.ts) lands here.
  const etc = mkdtempSync(join(tmpdir(), 'natgw-bench-etc-'));
  const removeEtc = () => rmSync(etc, { recursive: true, force: true });
  process.once('exit', removeEtc);
  const runs: CompareRun[] = [];
  try {
    for (const n of sizes) {
      progress(`compare N=${n}: ${prefixText}`);
      const target = await withRetryIfVanished(
        `compare N=${n} target`,
        () => Gateway.bare({ backend: 'iptables', resync }, { BENCH_PRIVATE_ETC: mkdtempSync(join(etc, `n${n}-`)) }),
        (gw) => runSequence(gw, prefix, gw.topo.natgwEnv(), n, 'target'),
      );
      const natgw: CompareRun['natgw'] = {};
      for (const backend of backends) {
        progress(`compare N=${n}: natgw shim, ${backend}`);
        natgw[backend] = await withRetryIfVanished(
          `compare N=${n} natgw ${backend}`,
          () => Gateway.withDaemon({ backend, resync }),
          (gw) => runSequence(gw, ['bash', SHIM], gw.shimEnv(), n, `natgw ${backend}`),
        );
      }
      runs.push({ n, target, natgw });
    }
  } finally {
    removeEtc();
    process.removeListener('exit', removeEtc);
  }
  return runs;
}
