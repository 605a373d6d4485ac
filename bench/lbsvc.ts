/**
 * The LoadBalancer-service commands beside the original script:
 *
 *   node dist/bench/lbsvc.js --original <path to Kube-OVN's lb-svc.sh> [--n 20]
 *
 * init, eip-add, N× dnat-add (one Service, N ports) and N× dnat-del, one exec per call as the
 * controller runs them, through the original script and through natgw's image/lb-svc.sh (iptables,
 * both variants, and nftables), each in fresh namespaces. Calls are timed inside the gateway's
 * namespace by the bench's runner (bench/nsrunner.ts), beside two floors timed the same way:
 * `bash -c true` (any script's start) and `node -e 0` (Node.js's start, which natgw pays per call
 * with no daemon). Prints per-command medians, natgw's ratio to the original and to the node
 * floor; the last line is the figures as JSON.
 *
 * The original needs busybox-style `ipcalc -n/-p` (Kube-OVN's image is Alpine): the bench puts a
 * small stand-in first on its PATH.
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { ADDR, createTopology, REPO_ROOT, type Topology } from '../test/helpers/netns.js';
import { legacyError } from './commands.js';
import { progress } from './progress.js';
import { NsRunner } from './runner.js';

// The topology helper sweeps namespaces in its exit hook, which a signal's default action would skip.
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.once(sig, () => process.exit(130));
import { ratio, round, type Summary, summarize } from './stats.js';

const COMMANDS = ['init', 'eip-add', 'dnat-add', 'dnat-del'] as const;
type Command = (typeof COMMANDS)[number];

const EIP = '172.20.0.10';
const LB_SHIM = join(REPO_ROOT, 'image', 'lb-svc.sh');

/** busybox's `ipcalc -n|-p <ip/len>` output (NETWORK=…, PREFIX=…), which the original parses. */
const IPCALC = `#!/usr/bin/env bash
IFS=/ read -r ip len <<<"$2"
IFS=. read -r a b c d <<<"$ip"
n=$(( (a << 24 | b << 16 | c << 8 | d) & ((0xffffffff << (32 - len)) & 0xffffffff) ))
case $1 in
  -n) echo "NETWORK=$((n >> 24 & 255)).$((n >> 16 & 255)).$((n >> 8 & 255)).$((n & 255))" ;;
  -p) echo "PREFIX=$len" ;;
  *) exit 1 ;;
esac
`;

function calls(n: number): Array<[Command, string[]]> {
  const out: Array<[Command, string[]]> = [
    ['init', []],
    ['eip-add', [`${EIP}/24,${ADDR.extGateway}`]],
  ];
  for (let i = 0; i < n; i++) out.push(['dnat-add', [`${EIP},${1000 + i},tcp,${ADDR.sub2},${8000 + i},${ADDR.rtr}`]]);
  for (let i = 0; i < n; i++) out.push(['dnat-del', [`${EIP},${1000 + i},tcp,${ADDR.sub2},${8000 + i}`]]);
  return out;
}

type Figures = Record<Command, Summary & { firstError?: string }>;

interface Target {
  readonly name: string;
  readonly argv: readonly string[];
  readonly env: Record<string, string>;
  /** The iptables-save of the variant its rules are in (iptables targets). */
  readonly save?: string;
}

/** The nat table's rules (no counters, no comments), in order. */
const natRules = (save: string): string =>
  save
    .split('\n')
    .filter((l) => l.startsWith('-A '))
    .join('\n');

/** The variant the plain `iptables` command is (the original's): `iptables -V` names nf_tables for nft. */
function defaultVariant(): 'nft' | 'legacy' {
  return spawnSync('iptables', ['-V'], { encoding: 'utf8' }).stdout?.includes('nf_tables') ? 'nft' : 'legacy';
}

interface TargetFigures {
  readonly figures: Figures;
  readonly floors: { bash: Summary; node: Summary };
  readonly layout?: string;
}

async function runTarget(target: Target, n: number): Promise<TargetFigures> {
  const topo: Topology = await createTopology();
  try {
    const runner = new NsRunner(topo, 'gw', { ...topo.natgwEnv(), ...target.env });
    const env = { ...topo.natgwEnv(), ...target.env };
    const times = new Map<Command, number[]>();
    const failures = new Map<Command, { count: number; first: string }>();
    let layout: string | undefined;
    for (const [cmd, rules] of calls(n)) {
      // The nat table's rules once every dnat-add is in, as `iptables-save` shows them.
      if (cmd === 'dnat-del' && layout === undefined && target.save) layout = natRules((await runner.run([target.save, '-t', 'nat'], { env })).stdout);
      const r = await runner.run([...target.argv, cmd, ...rules], { env, timeoutMs: 60_000 });
      times.set(cmd, [...(times.get(cmd) ?? []), r.ms]);
      const error = legacyError(r.exitCode, r.stdout, r.stderr);
      if (error !== undefined) {
        const f = failures.get(cmd);
        failures.set(cmd, { count: (f?.count ?? 0) + 1, first: f?.first ?? error });
      }
    }
    const bash: number[] = [];
    const node: number[] = [];
    for (let i = 0; i < Math.max(10, n); i++) {
      bash.push((await runner.run(['bash', '-c', 'true'], { env })).ms);
      node.push((await runner.run([process.execPath, '-e', '0'], { env })).ms);
    }
    runner.close();
    const figures = Object.fromEntries(
      COMMANDS.map((c) => {
        const f = failures.get(c);
        return [c, { ...summarize(times.get(c) ?? [], f?.count ?? 0), ...(f ? { firstError: f.first } : {}) }];
      }),
    ) as Figures;
    return { figures, floors: { bash: summarize(bash), node: summarize(node) }, layout };
  } finally {
    await topo.cleanup();
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { original: { type: 'string' }, n: { type: 'string', default: '20' } } });
  if (!values.original) {
    process.stderr.write('usage: node dist/bench/lbsvc.js --original <lb-svc.sh> [--n 20]\n');
    process.exit(2);
  }
  const n = Number(values.n);
  const bin = mkdtempSync(join(tmpdir(), 'natgw-bench-lbsvc-'));
  try {
    writeFileSync(join(bin, 'ipcalc'), IPCALC);
    chmodSync(join(bin, 'ipcalc'), 0o755);
    const targets: Target[] = [
      { name: 'original', argv: ['bash', values.original], env: { PATH: `${bin}:${process.env.PATH ?? ''}` }, save: `iptables-${defaultVariant()}-save` },
      {
        name: 'natgw iptables-nft',
        argv: ['bash', LB_SHIM],
        env: { GATEWAY_NETFILTER_MODE: 'iptables', NATGW_IPTABLES_VARIANT: 'nft' },
        save: 'iptables-nft-save',
      },
      {
        name: 'natgw iptables-legacy',
        argv: ['bash', LB_SHIM],
        env: { GATEWAY_NETFILTER_MODE: 'iptables', NATGW_IPTABLES_VARIANT: 'legacy' },
        save: 'iptables-legacy-save',
      },
      { name: 'natgw nftables', argv: ['bash', LB_SHIM], env: { GATEWAY_NETFILTER_MODE: 'nftables' } },
    ];
    const results: Array<TargetFigures & { name: string }> = [];
    for (const t of targets) {
      progress(`lb-svc: ${t.name}, N=${n}`);
      results.push({ name: t.name, ...(await runTarget(t, n)) });
    }
    const original = results[0]!;
    console.log(`\nLoadBalancer-service commands, N=${n} (median ms per call; ×orig = natgw / original; ×node = natgw / node -e 0 in the same run)`);
    console.log(['target'.padEnd(24), ...COMMANDS.map((c) => c.padStart(18)), 'bash -c true'.padStart(14), 'node -e 0'.padStart(11)].join(''));
    for (const r of results) {
      const cells = COMMANDS.map((c) => {
        const f = r.figures[c];
        const mark = f.failures > 0 ? ` !${f.failures}` : '';
        const rel = r === original ? '' : ` ×${ratio(f.median, original.figures[c].median)}/${ratio(f.median, r.floors.node.median)}`;
        return `${f.median}${rel}${mark}`.padStart(18);
      });
      console.log([r.name.padEnd(24), ...cells, String(r.floors.bash.median).padStart(14), String(r.floors.node.median).padStart(11)].join(''));
    }
    for (const r of results.slice(1)) {
      if (r.layout === undefined) continue;
      const same = r.layout === original.layout;
      console.log(
        `  ${r.name}: nat table after ${n} dnat-add ${same ? "identical to the original's" : `differs from the original's:\n${r.layout}\n  original:\n${original.layout}`}`,
      );
    }
    for (const r of results)
      for (const c of COMMANDS)
        if (r.figures[c].firstError) console.log(`  ${r.name} ${c}: ${r.figures[c].failures} failed, first: ${r.figures[c].firstError}`);
    console.log(
      JSON.stringify({
        bench: 'lbsvc',
        n,
        results: results.map(({ layout: _, ...r }) => ({ ...r, floors: { bash: round(r.floors.bash.median), node: round(r.floors.node.median) } })),
      }),
    );
  } finally {
    rmSync(bin, { recursive: true, force: true });
  }
}

void main();
