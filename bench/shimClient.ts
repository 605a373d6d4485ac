/**
 * What one shim call costs, client by client (SPEC §4.1: the controller execs the shim once
 * per rule). In one run, interleaved so that machine noise hits every variant alike:
 *   nodeStart  `node -e 0`: the floor of any Node.js client
 *   bashStart  `bash -c :`: the floor of the shim itself
 *   ncHealth   one `nc -U` GET /healthz: the client's own floor, the daemon doing nothing
 *   shimNc     `bash nat-gateway.sh <command>` as deployed: the daemon reached through nc
 *   shimNode   the same with NATGW_SHIM_CLIENT=node: the Node.js client
 *
 * measureShimClients() is the reusable part; it runs in the caller's network namespace against
 * a daemon already answering. Run directly (as root), this file builds a throw-away topology,
 * starts a daemon in its gw namespace and measures there:
 *   node dist/bench/shimClient.js [runs]
 */
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

export interface ShimClientOptions {
  /** image/nat-gateway.sh */
  readonly shim: string;
  /** The daemon's socket (NATGW_SOCKET in env as well). */
  readonly socket: string;
  /** natgw's environment for the shim (NATGW_SOCKET, NATGW_ENV_FILE, ...). */
  readonly env: NodeJS.ProcessEnv;
  /** The command and its rules; use one that changes nothing when repeated. */
  readonly argv: readonly string[];
  /** The command's exit status (default 0); the shim calls must also have an empty stderr. */
  readonly status?: number;
  readonly runs?: number;
}

export interface Figure {
  readonly medianMs: number;
  readonly p90Ms: number;
  readonly minMs: number;
}

export type ShimClientFigures = Record<'nodeStart' | 'bashStart' | 'ncHealth' | 'shimNc' | 'shimNode', Figure> & {
  readonly runs: number;
};

function figure(samples: number[]): Figure {
  const s = [...samples].sort((a, b) => a - b);
  const at = (q: number) => s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? NaN;
  const r = (x: number) => Math.round(x * 100) / 100;
  return { medianMs: r(at(0.5)), p90Ms: r(at(0.9)), minMs: r(s[0] ?? NaN) };
}

interface Call {
  readonly file: string;
  readonly args: readonly string[];
  readonly env?: NodeJS.ProcessEnv;
  readonly status?: number;
  readonly input?: string;
}

/** One run, timed; throws unless it exited as expected with an empty stderr (a failing variant measures nothing). */
function timed(c: Call): { ms: number; stdout: string } {
  const t0 = performance.now();
  // stdin from /dev/null: on a socket, bash would take itself for rshd's and source ~/.bashrc.
  const stdin = c.input === undefined ? 'ignore' : 'pipe';
  const r = spawnSync(c.file, c.args, { env: c.env ?? process.env, stdio: [stdin, 'pipe', 'pipe'], encoding: 'utf8', input: c.input });
  const ms = performance.now() - t0;
  if (r.error || r.status !== (c.status ?? 0) || r.stderr !== '') {
    throw new Error(`${c.file} ${c.args.join(' ')}: exit ${r.status} ${r.error?.message ?? ''} stderr: ${r.stderr}`);
  }
  return { ms, stdout: r.stdout };
}

export function measureShimClients(o: ShimClientOptions): ShimClientFigures {
  const runs = o.runs ?? 30;
  const calls = {
    nodeStart: { file: process.execPath, args: ['-e', '0'] },
    bashStart: { file: 'bash', args: ['-c', ':'] },
    ncHealth: { file: 'nc', args: ['-U', o.socket], input: 'GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' },
    shimNc: { file: 'bash', args: [o.shim, ...o.argv], env: o.env, status: o.status },
    shimNode: { file: 'bash', args: [o.shim, ...o.argv], env: { ...o.env, NATGW_SHIM_CLIENT: 'node' }, status: o.status },
  } satisfies Record<string, Call>;
  type Key = keyof typeof calls;
  const keys = Object.keys(calls) as Key[];
  // Warm the page cache and the daemon, and check that both shim clients say the same.
  const viaNc = timed(calls.shimNc).stdout;
  const viaNode = timed(calls.shimNode).stdout;
  if (viaNc !== viaNode) throw new Error(`the shim's clients disagree:\n${viaNc}\n---\n${viaNode}`);
  const samples = Object.fromEntries(keys.map((k) => [k, [] as number[]])) as Record<Key, number[]>;
  for (let i = 0; i < runs; i++) for (const k of keys) samples[k].push(timed(calls[k]).ms);
  return { runs, ...(Object.fromEntries(keys.map((k) => [k, figure(samples[k])])) as Record<Key, Figure>) };
}

/** Count of requests the daemon logged per legacy endpoint: which client really answered. */
function legacyRequests(logs: string): { raw: number; json: number } {
  const lines = logs.split('\n');
  return {
    raw: lines.filter((l) => l.includes('"path":"/v1/legacy/raw"')).length,
    json: lines.filter((l) => l.includes('"path":"/v1/legacy"')).length,
  };
}

async function main(): Promise<void> {
  const self = fileURLToPath(import.meta.url);
  if (process.argv[2] === '--measure') {
    process.stdout.write(`${JSON.stringify(measureShimClients(JSON.parse(process.argv[3] ?? '{}') as ShimClientOptions))}\n`);
    return;
  }
  const runs = Number(process.argv[2] ?? 30);
  const { ADDR, REPO_ROOT, createTopology } = await import('../test/helpers/netns.js');
  const { socketOf, startDaemon, stopDaemon } = await import('../test/netns/daemon-util.js');
  const topo = await createTopology();
  try {
    Object.assign(topo.env, { GATEWAY_V4: ADDR.extGateway });
    await topo.natgwOk('init');
    const daemon = await startDaemon(topo);
    try {
      const commands: { what: string; argv: string[]; status: number }[] = [
        { what: 'dnat-add, already present (a transaction that changes nothing)', argv: ['dnat-add', `172.20.0.10,8080,tcp,${ADDR.vpc1},80`], status: 0 },
        { what: 'dnat-add, invalid (refused before any kernel work)', argv: ['dnat-add', `172.20.0.10,http,tcp,${ADDR.vpc1},80`], status: 1 },
      ];
      await topo.natgwOk(...(commands[0]!.argv as [string, string]));
      for (const { what, argv, status } of commands) {
        const before = legacyRequests(daemon.logs());
        const opts: ShimClientOptions = { shim: join(REPO_ROOT, 'image', 'nat-gateway.sh'), socket: socketOf(topo), env: topo.natgwEnv(), argv, status, runs };
        // Measured inside gw, so that a client that failed over to in-process would act on the test's namespace.
        const r = await topo.exec('gw', [process.execPath, self, '--measure', JSON.stringify(opts)], { timeoutMs: 10 * 60_000 });
        const figures = JSON.parse(r.stdout.trim().split('\n').at(-1) ?? '{}') as ShimClientFigures;
        const after = legacyRequests(daemon.logs());
        // Proof of the path taken: shimNc reaches /v1/legacy/raw, shimNode /v1/legacy.
        const daemonRequests = { raw: after.raw - before.raw, json: after.json - before.json };
        console.log(JSON.stringify({ command: argv.join(' '), what, ...figures, daemonRequests }, null, 2));
      }
    } finally {
      await stopDaemon(daemon);
    }
  } finally {
    await topo.cleanup();
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((e: unknown) => {
    console.error(e);
    process.exitCode = 1;
  });
}
