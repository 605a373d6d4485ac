/**
 * A bulk PUT /v1/state brings its EIPs up only once NAT is in place. Here the NAT transaction is
 * refused (an injected failure of the real tool's run, its retry as a full sync too): the answer
 * is the tool's error, no EIP went up, natgw owns nothing in netfilter, the state is as before,
 * and no `ip -batch` is left running. The same PUT then applies, addresses and all.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { basename } from 'node:path';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, ownedNetfilter, type BackendCase } from '../helpers/backends.js';
import { waitFor } from '../helpers/poll.js';
import { makeWrappers } from '../helpers/faults.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIPS = Array.from({ length: 40 }, (_, i) => `172.20.0.${100 + i}`);

/** Processes in the gateway's namespace whose command line is `argv` (the daemon's `ip monitor` is not `ip -batch -`). */
function processesRunning(topo: Topology, argv: readonly string[]): number[] {
  const pids = spawnSync('ip', ['netns', 'pids', topo.ns.gw], { encoding: 'utf8' }).stdout.split('\n').filter(Boolean);
  return pids.map(Number).filter((pid) => {
    try {
      // The fault wrapper runs the real tool by its full path.
      const [file, ...args] = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0$/, '').split('\0');
      return basename(file ?? '') === argv[0] && args.join(' ') === argv.slice(1).join(' ');
    } catch {
      return false;
    }
  });
}

async function addressesOnNet1(topo: Topology): Promise<string[]> {
  const r = await topo.exec('gw', ['ip', '-j', 'addr', 'show', 'dev', 'net1']);
  const links = JSON.parse(r.stdout) as Array<{ addr_info: Array<{ local: string }> }>;
  return links.flatMap((l) => l.addr_info.map((a) => a.local)).filter((a) => EIPS.includes(a));
}

describe.each(BACKENDS)('bulk PUT /v1/state whose NAT transaction is refused ($name)', (b: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;
  let faults: ReturnType<typeof makeWrappers>;

  beforeAll(async () => {
    faults = makeWrappers();
    topo = await createTopology();
    Object.assign(topo.env, b.env, { NATGW_RESYNC_PERIOD: '1h', NATGW_LOG_LEVEL: 'debug' });
    sock = socketOf(topo);
    daemon = await startDaemon(topo, {
      PATH: `${faults.dir}:${process.env.PATH ?? ''}`,
      // The faults are injected into the nft tool: the daemon runs it instead of its libnftables helper.
      NATGW_LIBNFTABLES: 'off',
    });
    await waitReady(topo, daemon);
  }, 60_000);

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
    faults?.remove();
  });

  it('answers the tool error, leaves nothing applied and no ip -batch behind; then applies', async () => {
    const before = ok(await api(sock, 'GET', '/v1/state'), 'GET /v1/state').body;
    const netfilterBefore = await ownedNetfilter(topo, b);
    const doc = {
      ...before.desired,
      initialized: true,
      eips: EIPS.map((address) => ({ address, prefixLength: 24 })),
      snats: [{ eip: EIPS[0], cidr: ADDR.vpcCidr, randomFully: false }],
      dnats: EIPS.flatMap((eip) => Array.from({ length: 15 }, (_, i) => ({ eip, port: 8000 + i, protocol: 'tcp', internalIp: ADDR.vpc1, internalPort: 80 }))),
    };
    // The forward change (adds), in the first run and in the full sync's retry.
    if (b.iptablesVariant) faults.arm(`iptables-${b.iptablesVariant}-restore`, 1, 'fail', '--noflush', '^-[AI] ');
    else faults.arm('nft', 1, 'fail', '-f', '^(add|insert|replace) ');
    let r: Awaited<ReturnType<typeof api>>;
    try {
      r = await api(sock, 'PUT', '/v1/state', doc);
    } finally {
      faults.disarm();
    }
    expect(r.status, r.text).toBe(500);
    expect(r.body.message).toMatch(/injected fault/);
    expect(await addressesOnNet1(topo)).toEqual([]);
    expect(await ownedNetfilter(topo, b)).toBe(netfilterBefore);
    expect(ok(await api(sock, 'GET', '/v1/state'), 'GET /v1/state').body.digest).toBe(before.digest);
    await waitFor(async () => processesRunning(topo, ['ip', '-batch', '-']).length === 0, {
      what: 'no ip -batch left in the gateway',
      timeoutMs: 5000,
      intervalMs: 50,
    });

    const put = ok(await api(sock, 'PUT', '/v1/state', doc), 'PUT /v1/state after the fault');
    expect(put.body.dryRun).toBe(false);
    expect((await addressesOnNet1(topo)).sort()).toEqual([...EIPS].sort());
  }, 60_000);
});
