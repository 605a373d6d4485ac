/**
 * Soak: `npm run soak -- --minutes N [--seed S] [--backends nftables,iptables-legacy,iptables-nft]`.
 * Outside CI (root, network namespaces). For each backend in turn (the time split evenly) it runs
 * a real daemon in a gateway namespace and repeats rounds of: random operations from several
 * concurrent API clients (REST and legacy), sometimes drift injected behind natgw's back (a
 * flushed chain or map, a deleted table, route or EIP address), sometimes a daemon restart
 * (SIGTERM or SIGKILL). After each round it waits (polling, with a deadline) until the kernel,
 * read independently with the tools themselves (test/helpers/kernelFacts.ts), equals a model of
 * the acknowledged operations, and reports any divergence. Seeded, so a failure reproduces;
 * prints progress; stops by itself; exits 1 on any divergence.
 */
import { createTopology, type Topology } from '../test/helpers/netns.js';
import { kernelFacts, type NetfilterKind } from '../test/helpers/kernelFacts.js';
import { prng } from '../test/helpers/prng.js';
import { waitFor } from '../test/helpers/poll.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from '../test/netns/daemon-util.js';
import { EIP, Model, call, outcome, randomOp } from '../test/helpers/natModel.js';

const CLIENTS = 4;
const OPS_PER_CLIENT = 8;

interface Args {
  minutes: number;
  seed: number;
  backends: NetfilterKind[];
}

function parseArgs(argv: readonly string[]): Args {
  const args: Args = { minutes: 5, seed: Date.now() % 100_000, backends: ['nftables', 'iptables-legacy', 'iptables-nft'] };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1];
    switch (argv[i]) {
      case '--minutes':
        args.minutes = Number(v);
        i++;
        break;
      case '--seed':
        args.seed = Number(v);
        i++;
        break;
      case '--backends':
        args.backends = (v ?? '').split(',').filter(Boolean) as NetfilterKind[];
        i++;
        break;
      default:
        throw new Error(`unknown argument ${argv[i]} (use --minutes N, --seed S, --backends a,b)`);
    }
  }
  if (!(args.minutes > 0) || !Number.isFinite(args.seed) || args.backends.length === 0) throw new Error('bad arguments');
  return args;
}

const ENV: Record<NetfilterKind, Record<string, string>> = {
  nftables: { GATEWAY_NETFILTER_MODE: 'nftables' },
  'iptables-legacy': { GATEWAY_NETFILTER_MODE: 'iptables', NATGW_IPTABLES_VARIANT: 'legacy' },
  'iptables-nft': { GATEWAY_NETFILTER_MODE: 'iptables', NATGW_IPTABLES_VARIANT: 'nft' },
};

/** Drift behind natgw's back, as a person or another tool would cause it. */
function drifts(kind: NetfilterKind, model: Model): Array<{ what: string; argv: string[] }> {
  const out: Array<{ what: string; argv: string[] }> = [];
  if (kind === 'nftables') {
    out.push({ what: 'flush map port_dnat', argv: ['nft', 'flush', 'map', 'ip', 'natgw', 'port_dnat'] });
    out.push({ what: 'flush chain shared_snat', argv: ['nft', 'flush', 'chain', 'ip', 'natgw', 'shared_snat'] });
    out.push({ what: 'flush map fip_snat', argv: ['nft', 'flush', 'map', 'ip', 'natgw', 'fip_snat'] });
    out.push({ what: 'delete table ip natgw', argv: ['nft', 'delete', 'table', 'ip', 'natgw'] });
  } else {
    const ipt = kind === 'iptables-legacy' ? 'iptables-legacy' : 'iptables-nft';
    for (const chain of ['SHARED_DNAT', 'SHARED_SNAT', 'EXCLUSIVE_DNAT', 'EXCLUSIVE_SNAT'])
      out.push({ what: `flush ${chain}`, argv: [ipt, '-t', 'nat', '-F', chain] });
  }
  const route = [...model.routes.keys()][0];
  if (route) out.push({ what: `delete route ${route}`, argv: ['ip', 'route', 'del', route, 'dev', 'eth0'] });
  out.push({ what: 'delete the EIP address', argv: ['ip', 'addr', 'del', `${EIP}/24`, 'dev', 'net1'] });
  return out;
}

async function eipPresent(topo: Topology): Promise<boolean> {
  const r = await topo.exec('gw', ['ip', '-4', '-o', 'addr', 'show', 'dev', 'net1']);
  return r.stdout.includes(` ${EIP}/24 `);
}

function diff(want: readonly string[], got: readonly string[]): string {
  const w = new Set(want);
  const g = new Set(got);
  return [...want.filter((x) => !g.has(x)).map((x) => `  missing: ${x}`), ...got.filter((x) => !w.has(x)).map((x) => `  extra:   ${x}`)].join('\n');
}

/** What helps explain a divergence: natgw's own desired state against the model, the processes in the namespace, the daemon's warnings. */
async function diagnose(topo: Topology, daemon: Daemon, want: readonly string[]): Promise<string> {
  const out: string[] = [];
  const st = await api(socketOf(topo), 'GET', '/v1/state').catch(() => undefined);
  const d = st?.body?.desired;
  if (d) {
    const desired = [
      ...d.dnats.map(
        (x: { eip: string; port: number; protocol: string; internalIp: string; internalPort: number }) =>
          `dnat ${x.eip},${x.port},${x.protocol} -> ${x.internalIp}:${x.internalPort}`,
      ),
      ...d.fips.map((x: { eip: string; internalIp: string }) => `fip ${x.eip} -> ${x.internalIp}`),
      ...d.snats.map((x: { eip: string; cidr: string; randomFully: boolean }) => `snat ${x.eip},${x.cidr}${x.randomFully ? ' random-fully' : ''}`),
      ...d.routes.map((x: { cidr: string; nexthop: string }) => `route ${x.cidr} via ${x.nexthop}`),
    ].sort();
    const dd = diff(want, desired);
    out.push(`  natgw's desired state ${dd === '' ? 'equals the model' : `differs from the model:\n${dd}`}`);
    out.push(`  drift: ${JSON.stringify(st?.body?.drift ?? null).slice(0, 600)}`);
  } else out.push(`  GET /v1/state failed: ${st?.status} ${st?.text ?? ''}`);
  const pids = (await topo.exec('gw', ['ip', 'netns', 'pids', topo.ns.gw], { reject: false })).stdout.split('\n').filter(Boolean);
  for (const pid of pids) {
    const cmd = (await topo.exec('gw', ['cat', `/proc/${pid}/cmdline`], { reject: false })).stdout.replace(/\0/g, ' ').slice(0, 160);
    out.push(`  process ${pid}${Number(pid) === daemon.pid ? ' (the daemon)' : ''}: ${cmd}`);
  }
  const warnings = daemon
    .logs()
    .split('\n')
    .filter((l) => /"level":(40|50|60)/.test(l))
    .slice(-15);
  out.push(`  daemon warnings (last ${warnings.length}):\n    ${warnings.map((l) => l.slice(0, 400)).join('\n    ')}`);
  return out.join('\n');
}

interface Tally {
  rounds: number;
  ops: number;
  conflicts: number;
  drifts: number;
  restarts: number;
  divergences: number;
}

/** Ctrl-C or SIGTERM ends the current round and cleans up instead of leaving namespaces and a daemon behind. */
let stopping = false;
for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => (stopping = true));

async function soakBackend(kind: NetfilterKind, untilMs: number, seed: number): Promise<Tally> {
  const rnd = prng(seed);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)]!;
  const tally: Tally = { rounds: 0, ops: 0, conflicts: 0, drifts: 0, restarts: 0, divergences: 0 };
  const topo = await createTopology();
  const sock = socketOf(topo);
  let daemon: Daemon | undefined;
  const env = { ...ENV[kind], NATGW_RESYNC_PERIOD: '1s' };
  try {
    daemon = await startDaemon(topo, env);
    ok(await api(sock, 'POST', '/v1/legacy', { command: 'init', rules: [] }), 'init');
    const eip = ok(await api(sock, 'POST', '/v1/legacy', { command: 'eip-add', rules: [`${EIP}/24`] }), 'eip-add').body;
    if (eip.status !== 0) throw new Error(`eip-add: ${JSON.stringify(eip)}`);
    await waitReady(topo, daemon);
    const model = new Model();
    while (Date.now() < untilMs && !stopping) {
      tally.rounds++;
      const unexpected: string[] = [];
      await Promise.all(
        Array.from({ length: CLIENTS }, async (_, c) => {
          for (let i = 0; i < OPS_PER_CLIENT; i++) {
            const op = randomOp(rnd, rnd() < 0.5);
            const expectConflict = model.conflicts(c, op);
            const req = call(c, op);
            const got = outcome(op, await api(sock, req.method, req.path, req.body));
            tally.ops++;
            if (got === 'ok') model.apply(c, op);
            else if (got === 'conflict') tally.conflicts++;
            if (got !== (expectConflict ? 'conflict' : 'ok')) unexpected.push(`client ${c} ${JSON.stringify(op)} → ${got}`);
          }
        }),
      );
      let event = 'ops';
      const r = rnd();
      if (r < 0.3) {
        const d = pick(drifts(kind, model));
        await topo.exec('gw', d.argv, { reject: false });
        tally.drifts++;
        event = `drift: ${d.what}`;
      } else if (r < 0.4) {
        const signal = rnd() < 0.5 ? 'SIGKILL' : 'SIGTERM';
        await stopDaemon(daemon, signal);
        daemon = await startDaemon(topo, env);
        await waitReady(topo, daemon, 60_000);
        tally.restarts++;
        event = `restart (${signal})`;
      }
      const want = model.facts();
      let got: string[] = [];
      const converged = await waitFor(
        async () => {
          got = await kernelFacts(topo, kind);
          return diff(want, got) === '' && (await eipPresent(topo));
        },
        { what: 'the kernel to match the model', timeoutMs: 30_000, intervalMs: 200 },
      ).then(
        () => true,
        () => false,
      );
      if (!converged || unexpected.length > 0) {
        tally.divergences++;
        console.log(`[${kind}] round ${tally.rounds} after ${event}: DIVERGENCE`);
        if (unexpected.length) console.log(`  unexpected answers:\n  ${unexpected.join('\n  ')}`);
        if (!converged) console.log(`${diff(want, got)}${(await eipPresent(topo)) ? '' : '\n  missing: EIP address'}`);
        console.log(await diagnose(topo, daemon, want));
        // The model no longer describes the kernel: later rounds would only repeat this finding.
        break;
      }
      if (tally.rounds % 10 === 0 || event !== 'ops') {
        const left = Math.max(0, Math.round((untilMs - Date.now()) / 1000));
        console.log(`[${kind}] round ${tally.rounds}: ${tally.ops} ops, ${want.length} objects, ${event}; converged (${left} s left)`);
      }
    }
  } finally {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo.cleanup();
  }
  return tally;
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  const started = Date.now();
  const slice = (args.minutes * 60_000) / args.backends.length;
  console.log(`soak: ${args.minutes} min, seed ${args.seed}, backends ${args.backends.join(', ')}`);
  let failed = false;
  for (const [i, kind] of args.backends.entries()) {
    if (stopping) break;
    const t = await soakBackend(kind, started + slice * (i + 1), args.seed + i);
    console.log(
      `[${kind}] done: ${t.rounds} rounds, ${t.ops} operations (${t.conflicts} conflicts), ${t.drifts} drifts injected, ` +
        `${t.restarts} restarts, ${t.divergences} divergences`,
    );
    if (t.divergences > 0) failed = true;
  }
  console.log(`soak: ${((Date.now() - started) / 60_000).toFixed(1)} min, ${failed ? 'DIVERGENCE FOUND' : 'no divergence'}`);
  process.exitCode = failed ? 1 : 0;
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : e);
  process.exitCode = 2;
});
