/**
 * Many clients at once over the daemon's socket: 20 clients × 50 mixed operations (REST
 * and legacy; adds, conflicting adds, replaces, deletes of DNATs, FIPs, SNATs and routes).
 * Every answer must be the one a sequential model of that client's operations predicts,
 * the final desired state must equal the model, and the kernel must hold exactly that state:
 * read by the test from `iptables-save` / `nft list table` / `ip route` (kernelFacts.ts), and
 * confirmed by natgw (a dry-run plan of it finds nothing to change). Latency is a figure for
 * `node dist/bench/repair.js`, not an assertion here.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type ApiResponse, type Daemon } from './daemon-util.js';
import { prng } from '../helpers/prng.js';
import { kernelFacts, type NetfilterKind } from '../helpers/kernelFacts.js';

const CLIENTS = 20;
const OPS = 50;
const EIP = '172.20.0.10';

type Kind = 'dnat' | 'fip' | 'snat' | 'route';
type Verb = 'add' | 'replace' | 'del';
type Expect = 'ok' | 'conflict';

interface Op {
  readonly kind: Kind;
  readonly verb: Verb;
  readonly slot: number;
  readonly target: number;
  readonly legacy: boolean;
}

/** One client's identities: disjoint from every other client's, a few each so they repeat. */
const ident = {
  dnatPort: (c: number, k: number) => 10000 + c * 10 + k,
  fipEip: (c: number, k: number) => `172.21.${c}.${k + 1}`,
  snatCidr: (c: number, k: number) => `10.100.${c}.${k * 64}/26`,
  routeCidr: (c: number, k: number) => `10.200.${c * 4 + k}.0/24`,
};
const targets = {
  ip: (t: number) => [ADDR.vpc1, ADDR.vpc2][t]!,
  port: (t: number) => [80, 8080][t]!,
  nexthop: (t: number) => [ADDR.rtr, '10.0.1.253'][t]!,
};

/** The sequential model of one client: what each operation answers and leaves behind. */
class Model {
  readonly dnats = new Map<number, number>();
  readonly fips = new Map<string, number>();
  readonly snats = new Map<string, boolean>();
  readonly routes = new Map<string, number>();

  constructor(readonly c: number) {}

  apply(op: Op): Expect {
    const { c } = this;
    switch (op.kind) {
      case 'dnat': {
        const port = ident.dnatPort(c, op.slot);
        if (op.verb === 'del') return (this.dnats.delete(port), 'ok');
        const have = this.dnats.get(port);
        if (op.verb === 'add' && have !== undefined && have !== op.target) return 'conflict';
        this.dnats.set(port, op.target);
        return 'ok';
      }
      case 'fip': {
        const eip = ident.fipEip(c, op.slot);
        if (op.verb === 'del') return (this.fips.delete(eip), 'ok');
        const have = this.fips.get(eip);
        if (op.verb === 'add' && have !== undefined && have !== op.target) return 'conflict';
        this.fips.set(eip, op.target);
        return 'ok';
      }
      case 'snat': {
        const cidr = ident.snatCidr(c, op.slot);
        if (op.verb === 'del') return (this.snats.delete(cidr), 'ok');
        const randomFully = op.target === 1;
        if (!this.snats.has(cidr) || op.verb === 'replace') this.snats.set(cidr, randomFully);
        return 'ok';
      }
      case 'route': {
        const cidr = ident.routeCidr(c, op.slot);
        if (op.verb === 'del') return (this.routes.delete(cidr), 'ok');
        this.routes.set(cidr, op.target);
        return 'ok';
      }
    }
  }
}

function legacyCall(c: number, op: Op): { command: string; rules: string[] } {
  const t = op.target;
  switch (op.kind) {
    case 'dnat': {
      const id = `${EIP},${ident.dnatPort(c, op.slot)},tcp`;
      return op.verb === 'del' ? { command: 'dnat-del', rules: [id] } : { command: 'dnat-add', rules: [`${id},${targets.ip(t)},${targets.port(t)}`] };
    }
    case 'fip': {
      const eip = ident.fipEip(c, op.slot);
      return op.verb === 'del' ? { command: 'floating-ip-del', rules: [eip] } : { command: 'floating-ip-add', rules: [`${eip},${targets.ip(t)}`] };
    }
    case 'snat': {
      const id = `${EIP},${ident.snatCidr(c, op.slot)}`;
      return op.verb === 'del' ? { command: 'snat-del', rules: [id] } : { command: 'snat-add', rules: [t === 1 ? `${id},--random-fully` : id] };
    }
    case 'route': {
      const cidr = ident.routeCidr(c, op.slot);
      return op.verb === 'del' ? { command: 'subnet-route-del', rules: [cidr] } : { command: 'subnet-route-add', rules: [`${cidr},${targets.nexthop(t)}`] };
    }
  }
}

function restCall(c: number, op: Op): { method: string; path: string; body?: unknown } {
  const t = op.target;
  const q = op.verb === 'replace' ? '?replace=true' : '';
  const enc = encodeURIComponent;
  switch (op.kind) {
    case 'dnat': {
      const path = `/v1/dnats/${EIP},${ident.dnatPort(c, op.slot)},tcp`;
      return op.verb === 'del'
        ? { method: 'DELETE', path }
        : { method: 'PUT', path: path + q, body: { internalIp: targets.ip(t), internalPort: targets.port(t) } };
    }
    case 'fip': {
      const path = `/v1/fips/${ident.fipEip(c, op.slot)}`;
      return op.verb === 'del' ? { method: 'DELETE', path } : { method: 'PUT', path: path + q, body: { internalIp: targets.ip(t) } };
    }
    case 'snat': {
      const path = `/v1/snats/${EIP},${enc(ident.snatCidr(c, op.slot))}`;
      return op.verb === 'del' ? { method: 'DELETE', path } : { method: 'PUT', path: path + q, body: { randomFully: t === 1 } };
    }
    case 'route': {
      const path = `/v1/routes/${enc(ident.routeCidr(c, op.slot))}`;
      return op.verb === 'del' ? { method: 'DELETE', path } : { method: 'PUT', path: path + q, body: { nexthop: targets.nexthop(t) } };
    }
  }
}

function plan(c: number): Op[] {
  const rnd = prng(0x5eed + c);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)]!;
  // Clients 0-9 use REST, 10-14 the legacy endpoint, 15-19 a mix.
  const mode = c < 10 ? 'rest' : c < 15 ? 'legacy' : 'mixed';
  return Array.from({ length: OPS }, () => {
    const legacy = mode === 'legacy' || (mode === 'mixed' && rnd() < 0.5);
    const verb: Verb = legacy ? pick(['add', 'add', 'del'] as const) : pick(['add', 'add', 'replace', 'del'] as const);
    return { kind: pick(['dnat', 'fip', 'snat', 'route'] as const), verb, slot: Math.floor(rnd() * 3), target: Math.floor(rnd() * 2), legacy };
  });
}

function outcome(op: Op, r: ApiResponse): Expect | string {
  if (op.legacy) {
    if (r.status !== 200) return `HTTP ${r.status} ${r.text}`;
    const out = r.body as { status: number; stdout: string; stderr: string };
    if (out.status === 0 && out.stderr === '') return 'ok';
    if (out.status === 1 && out.stderr === '' && /already (exists|bindTo rule)/.test(out.stdout)) return 'conflict';
    return JSON.stringify(out);
  }
  if (r.status === 200 || r.status === 201 || r.status === 204) return 'ok';
  if (r.status === 409 && r.body?.error === 'conflict') return 'conflict';
  return `HTTP ${r.status} ${r.text}`;
}

describe('the daemon under concurrent clients', () => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;

  beforeAll(async () => {
    topo = await createTopology();
    sock = socketOf(topo);
    daemon = await startDaemon(topo, process.env.NATGW_PROFILE ? { NATGW_LOG_LEVEL: 'debug' } : {});
    const init = ok(await api(sock, 'POST', '/v1/legacy', { command: 'init', rules: [] }), 'init').body;
    expect(init.status).toBe(0);
    await waitReady(topo, daemon);
  });
  afterAll(async () => {
    if (process.env.NATGW_PROFILE && daemon) (await import('node:fs')).writeFileSync(process.env.NATGW_PROFILE, daemon.logs());
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
  });

  it(`${CLIENTS} clients × ${OPS} mixed operations end in the state a sequential model predicts`, async () => {
    const models = Array.from({ length: CLIENTS }, (_, c) => new Model(c));
    const mismatches: string[] = [];
    let conflicts = 0;
    const started = Date.now();
    await Promise.all(
      models.map(async (model) => {
        const c = model.c;
        for (const [i, op] of plan(c).entries()) {
          const expected = model.apply(op);
          let r: ApiResponse;
          if (op.legacy) r = await api(sock, 'POST', '/v1/legacy', legacyCall(c, op));
          else {
            const call = restCall(c, op);
            r = await api(sock, call.method, call.path, call.body);
          }
          const got = outcome(op, r);
          if (got === 'conflict') conflicts++;
          if (got !== expected) mismatches.push(`client ${c} op ${i} ${JSON.stringify(op)}: expected ${expected}, got ${got}`);
        }
      }),
    );
    const elapsed = (Date.now() - started) / 1000;
    const total = CLIENTS * OPS;
    const metrics = (await api(sock, 'GET', '/metrics')).text;
    const syncs = [...metrics.matchAll(/^natgw_syncs_total\{kind="\w+",outcome="success"\} (\d+)/gm)].reduce((n, m) => n + Number(m[1]), 0);
    console.info(
      `${total} operations in ${elapsed.toFixed(1)} s: ${(total / elapsed).toFixed(0)} ops/s over the socket, ${conflicts} conflicts, ${syncs} successful applies in all`,
    );
    expect(mismatches).toEqual([]);
    expect(conflicts).toBeGreaterThan(0);

    // The final desired state is the union of the client models.
    const desired = ok(await api(sock, 'GET', '/v1/state'), 'state').body.desired;
    const wantDnats = models.flatMap((m) =>
      [...m.dnats].map(([port, t]) => ({ eip: EIP, port, protocol: 'tcp', internalIp: targets.ip(t), internalPort: targets.port(t) })),
    );
    const wantFips = models.flatMap((m) => [...m.fips].map(([eip, t]) => ({ eip, internalIp: targets.ip(t) })));
    const wantSnats = models.flatMap((m) => [...m.snats].map(([cidr, randomFully]) => ({ eip: EIP, cidr, randomFully })));
    const wantRoutes = models.flatMap((m) => [...m.routes].map(([cidr, t]) => ({ cidr, nexthop: targets.nexthop(t) })));
    const asSet = (xs: unknown[]) => new Set(xs.map((x) => JSON.stringify(x, Object.keys(x as object).sort())));
    expect(asSet(desired.dnats)).toEqual(asSet(wantDnats));
    expect(asSet(desired.fips)).toEqual(asSet(wantFips));
    expect(asSet(desired.snats)).toEqual(asSet(wantSnats));
    expect(asSet(desired.routes)).toEqual(asSet(wantRoutes));

    // The kernel holds exactly that, read by this test with the tools themselves (not through natgw's read-back)...
    const backend = ok(await api(sock, 'GET', '/v1/state'), 'state').body.backend;
    const kind: NetfilterKind = backend.kind === 'nftables' ? 'nftables' : backend.variant === 'nft' ? 'iptables-nft' : 'iptables-legacy';
    const want = [
      ...wantDnats.map((d) => `dnat ${d.eip},${d.port},tcp -> ${d.internalIp}:${d.internalPort}`),
      ...wantFips.map((f) => `fip ${f.eip} -> ${f.internalIp}`),
      ...wantSnats.map((x) => `snat ${x.eip},${x.cidr}${x.randomFully ? ' random-fully' : ''}`),
      ...wantRoutes.map((r) => `route ${r.cidr} via ${r.nexthop}`),
    ].sort();
    expect(await kernelFacts(topo, kind)).toEqual(want);
    // ...and natgw agrees: planning the same state again finds nothing to do.
    const dry = ok(await api(sock, 'PUT', '/v1/state?dryRun=true', { desired }), 'dry run').body;
    expect(dry.report).toMatchObject({ netfilterChanges: 0, linkChanges: 0 });
    expect(dry.script).toBe('');
  }, 240_000);
});
