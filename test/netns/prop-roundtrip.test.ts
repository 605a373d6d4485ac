/**
 * Generated valid rules round-trip through parse, apply and read-back on the real kernel, on
 * every backend (fast-check, a bounded number of runs: each one is a few real transactions).
 * Each run sends a random batch of DNAT, SNAT, FIP and route rules as the controller does (one
 * legacy command per kind, all rules as its arguments), then checks that the kernel, read by the
 * test itself (kernelFacts.ts), holds exactly what the parsed rules say; that natgw's own
 * read-back agrees (a dry-run of its desired state plans nothing); and that deleting them all
 * leaves nothing behind.
 */
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { kernelFacts, type NetfilterKind } from '../helpers/kernelFacts.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const RUNS = Number(process.env.NATGW_PROP_NETNS_RUNS ?? 8);
// About a second per run here: three times that, and the set-up.
const TIMEOUT_MS = 20_000 + RUNS * 3_000;

const octet = fc.integer({ min: 0, max: 255 });
const unicast = fc
  .tuple(
    fc.integer({ min: 1, max: 223 }).filter((o) => o !== 127),
    octet,
    octet,
    fc.integer({ min: 1, max: 254 }),
  )
  .map((o) => o.join('.'));
const port = fc.integer({ min: 1, max: 65535 });
const toInt = (ip: string) => ip.split('.').reduce((a, o) => a * 256 + Number(o), 0);
const fromInt = (n: number) => [24, 16, 8, 0].map((s) => (n >>> s) & 255).join('.');
const network = (ip: string, len: number) => `${fromInt(len === 0 ? 0 : (toInt(ip) & ((0xffffffff << (32 - len)) >>> 0)) >>> 0)}/${len}`;

const batch = fc.record({
  dnats: fc.uniqueArray(fc.record({ eip: unicast, port, protocol: fc.constantFrom('tcp', 'udp', 'TCP'), ip: unicast, ip2: port }), {
    maxLength: 6,
    selector: (d) => `${d.eip}|${d.port}|${d.protocol.toLowerCase()}`,
  }),
  snats: fc.uniqueArray(fc.record({ eip: unicast, addr: unicast, len: fc.integer({ min: 0, max: 32 }), rf: fc.boolean() }), {
    maxLength: 6,
    selector: (s) => `${s.eip}|${network(s.addr, s.len)}`,
  }),
  fips: fc.uniqueArray(fc.record({ eip: unicast, ip: unicast }), { maxLength: 6, selector: (f) => f.eip }),
  // Routes live on the VPC side: destinations in 10.128.0.0/9 (clear of the topology's own
  // subnets), next hops on eth0's subnet.
  routes: fc.uniqueArray(
    fc.record({ net: fc.integer({ min: 0x0a800000, max: 0x0affffff }), len: fc.integer({ min: 9, max: 32 }), hop: fc.integer({ min: 2, max: 250 }) }),
    { maxLength: 6, selector: (r) => network(fromInt(r.net), r.len) },
  ),
});

describe.each(BACKENDS)('generated rules round-trip on $name', (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;
  const legacy = async (command: string, rules: string[]) => {
    if (rules.length === 0 && command !== 'init') return;
    const r = ok(await api(sock, 'POST', '/v1/legacy', { command, rules }), command).body;
    if (r.status !== 0 || r.stderr !== '') throw new Error(`${command} ${rules.join(' ')}: ${JSON.stringify(r)}`);
  };

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env);
    sock = socketOf(topo);
    daemon = await startDaemon(topo);
    await legacy('init', []);
    await waitReady(topo, daemon);
  });
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
  });

  it("the kernel holds exactly the parsed rules; natgw's read-back agrees; deleting them leaves nothing", { timeout: TIMEOUT_MS }, async () => {
    const kind = backend.name as NetfilterKind;
    await fc.assert(
      fc.asyncProperty(batch, async (b) => {
        const routes = b.routes.map((r) => ({ cidr: network(fromInt(r.net), r.len), hop: `10.0.1.${r.hop}` }));
        await legacy(
          'dnat-add',
          b.dnats.map((d) => `${d.eip},${d.port},${d.protocol},${d.ip},${d.ip2}`),
        );
        await legacy(
          'snat-add',
          b.snats.map((s) => `${s.eip},${s.addr}/${s.len}${s.rf ? ',--random-fully' : ''}`),
        );
        await legacy(
          'floating-ip-add',
          b.fips.map((f) => `${f.eip},${f.ip}`),
        );
        await legacy(
          'subnet-route-add',
          routes.map((r) => `${r.cidr},${r.hop}`),
        );

        const want = [
          ...b.dnats.map((d) => `dnat ${d.eip},${d.port},${d.protocol.toLowerCase()} -> ${d.ip}:${d.ip2}`),
          ...b.snats.map((s) => `snat ${s.eip},${network(s.addr, s.len)}${s.rf ? ' random-fully' : ''}`),
          ...b.fips.map((f) => `fip ${f.eip} -> ${f.ip}`),
          ...routes.map((r) => `route ${r.cidr} via ${r.hop}`),
        ].sort();
        const got = await kernelFacts(topo, kind);
        expect(got, `missing ${JSON.stringify(want.filter((x) => !got.includes(x)))}, extra ${JSON.stringify(got.filter((x) => !want.includes(x)))}`).toEqual(
          want,
        );
        const desired = ok(await api(sock, 'GET', '/v1/state'), 'state').body.desired;
        const dry = ok(await api(sock, 'PUT', '/v1/state?dryRun=true', { desired }), 'dry run').body;
        expect(dry.report).toMatchObject({ netfilterChanges: 0, linkChanges: 0 });

        await legacy(
          'dnat-del',
          b.dnats.map((d) => `${d.eip},${d.port},${d.protocol}`),
        );
        await legacy(
          'snat-del',
          b.snats.map((s) => `${s.eip},${s.addr}/${s.len}`),
        );
        await legacy(
          'floating-ip-del',
          b.fips.map((f) => f.eip),
        );
        await legacy(
          'subnet-route-del',
          routes.map((r) => r.cidr),
        );
        expect(await kernelFacts(topo, kind)).toEqual([]);
      }),
      { numRuns: RUNS, endOnFailure: true },
    );
    expect(ADDR.vpcCidr).toBe('10.0.1.0/24'); // the next hops above assume eth0's subnet
  });
});
