/**
 * Load: 50 concurrent API clients (REST and POST /v1/legacy) and 10 concurrent shim callers
 * (`bash image/nat-gateway.sh …`, the controller's exec path) run mixed operations against one
 * real daemon, on every backend. Each client owns its identities, so the operations the daemon
 * acknowledged, in each client's order, form a sequential model of the final state (the daemon
 * serialises everything through its queue). The final kernel, read by the test from
 * `iptables-save` / `nft list table` / `ip route` (kernelFacts.ts), must equal that model.
 * Latency p50/p99 per door is printed: a figure, not an assertion.
 *
 * NATGW_LOAD_OPS sets the operations per backend (default 1,500, about a minute each on a
 * 2-core machine; the full 5,000 with NATGW_LOAD_OPS=5000).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { kernelFacts, type NetfilterKind } from '../helpers/kernelFacts.js';
import { EIP, Model, call, legacyArgs, outcome, randomOp, type Op } from '../helpers/natModel.js';
import { prng } from '../helpers/prng.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const API_CLIENTS = 50;
const SHIM_CLIENTS = 10;
const TOTAL = Number(process.env.NATGW_LOAD_OPS ?? 1500);
// About 7 ms per operation here (1,500 in 10 s): three times that, and the set-up.
const TIMEOUT_MS = 30_000 + TOTAL * 20;

function percentile(xs: readonly number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? NaN;
}

describe.each(BACKENDS)('load on $name', (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env);
    sock = socketOf(topo);
    daemon = await startDaemon(topo);
    expect(ok(await api(sock, 'POST', '/v1/legacy', { command: 'init', rules: [] }), 'init').body.status).toBe(0);
    expect(ok(await api(sock, 'POST', '/v1/legacy', { command: 'eip-add', rules: [`${EIP}/24`] }), 'eip').body.status).toBe(0);
    await waitReady(topo, daemon);
  });
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
  });

  it(`${API_CLIENTS} API clients and ${SHIM_CLIENTS} shim callers, ${TOTAL} mixed operations: the kernel equals the model of what was acknowledged`, {
    timeout: TIMEOUT_MS,
  }, async () => {
    const clients = API_CLIENTS + SHIM_CLIENTS;
    const model = new Model();
    const latency = { api: [] as number[], shim: [] as number[] };
    const unexpected: string[] = [];
    let acked = 0;
    let conflicts = 0;
    // Shim calls cost a process each: give the shim callers a smaller share so all clients finish together.
    const perApi = Math.ceil((TOTAL * 0.8) / API_CLIENTS);
    const perShim = Math.ceil((TOTAL * 0.2) / SHIM_CLIENTS);
    const started = Date.now();

    await Promise.all(
      Array.from({ length: clients }, async (_, c) => {
        const rnd = prng(0x10ad + c);
        const shim = c >= API_CLIENTS;
        const n = shim ? perShim : perApi;
        for (let i = 0; i < n; i++) {
          const op: Op = randomOp(rnd, shim || rnd() < 0.3);
          const expectConflict = model.conflicts(c, op);
          const t0 = performance.now();
          let got: string;
          if (shim) {
            const [command, rule] = legacyArgs(c, op);
            const r = await topo.natgw(command, rule);
            latency.shim.push(performance.now() - t0);
            got =
              r.exitCode === 0 && r.stderr === ''
                ? 'ok'
                : r.exitCode === 1 && r.stderr === '' && /already (exists|bindTo rule)/.test(r.stdout)
                  ? 'conflict'
                  : `exit ${r.exitCode} ${r.stdout} ${r.stderr}`;
          } else {
            const req = call(c, op);
            got = outcome(op, await api(sock, req.method, req.path, req.body));
            latency.api.push(performance.now() - t0);
          }
          if (got === 'ok') {
            model.apply(c, op);
            acked++;
          } else if (got === 'conflict') conflicts++;
          if (got !== (expectConflict ? 'conflict' : 'ok')) unexpected.push(`client ${c} op ${i} ${JSON.stringify(op)}: ${got}`);
        }
      }),
    );
    const seconds = (Date.now() - started) / 1000;
    const ops = latency.api.length + latency.shim.length;
    const fmt = (xs: number[]) => `p50 ${percentile(xs, 50).toFixed(0)} ms, p99 ${percentile(xs, 99).toFixed(0)} ms`;
    console.info(
      `[${backend.name}] ${ops} operations (${acked} acknowledged, ${conflicts} conflicts) in ${seconds.toFixed(1)} s, ${(ops / seconds).toFixed(0)} ops/s; ` +
        `API ${fmt(latency.api)} (${latency.api.length}); shim ${fmt(latency.shim)} (${latency.shim.length})`,
    );
    expect(unexpected).toEqual([]);
    expect(ops).toBeGreaterThanOrEqual(TOTAL);

    const state = ok(await api(sock, 'GET', '/v1/state'), 'state').body;
    const kind: NetfilterKind = state.backend.kind === 'nftables' ? 'nftables' : state.backend.variant === 'nft' ? 'iptables-nft' : 'iptables-legacy';
    expect(kind).toBe(backend.name);
    expect(await kernelFacts(topo, kind)).toEqual(model.facts());
    // The EIP the run started with is still there.
    expect(await topo.addresses('gw', 'net1', 4)).toContain(`${EIP}/24`);
  });
});
