/**
 * Static neighbour entries on the real kernel: PERMANENT with the synthetic MAC, no ARP request
 * and no neighbour solicitation on the wire while traffic to them flows, and back on their own
 * (no command) after their device is deleted and recreated or their entries are flushed.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTopology, type Topology } from '../helpers/netns.js';
import { waitFor } from '../helpers/poll.js';
import { startCapture } from '../helpers/capture.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const DEV = 'nb0';
const PEER = 'nbp';

/** gw's nb0 ⇄ ext's nbp, with an address of each family on both ends. */
async function makeLink(topo: Topology): Promise<void> {
  await topo.exec('gw', ['ip', 'link', 'add', DEV, 'type', 'veth', 'peer', 'name', PEER, 'netns', topo.ns.ext]);
  await topo.exec('gw', ['ip', 'addr', 'add', '10.9.0.1/24', 'dev', DEV]);
  await topo.exec('gw', ['ip', 'addr', 'add', 'fd09::1/64', 'dev', DEV, 'nodad']);
  await topo.exec('ext', ['ip', 'addr', 'add', '10.9.0.2/24', 'dev', PEER]);
  await topo.exec('ext', ['ip', 'addr', 'add', 'fd09::2/64', 'dev', PEER, 'nodad']);
  await topo.exec('ext', ['ip', 'link', 'set', PEER, 'up']);
  await topo.exec('gw', ['ip', 'link', 'set', DEV, 'up']);
}

/** PERMANENT entries on nb0 as `address mac`, sorted. */
async function permanent(topo: Topology): Promise<string[]> {
  const r = await topo.exec('gw', ['ip', '-j', 'neigh', 'show', 'nud', 'permanent', 'dev', DEV], { reject: false });
  const list = (JSON.parse(r.stdout || '[]') as { dst: string; lladdr?: string; state?: string[] }[]).filter((n) => n.state?.includes('PERMANENT'));
  return list.map((n) => `${n.dst} ${n.lladdr ?? ''}`).sort();
}

const OURS = ['10.9.0.50 0a:58:0a:09:00:32', '10.9.0.51 02:00:00:00:00:51', 'fd09::50 0a:58:00:00:00:50'];

describe('static neighbour entries', () => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;

  beforeAll(async () => {
    topo = await createTopology();
    // A long period: whatever comes back below comes back on the link event, not the timer.
    Object.assign(topo.env, { GATEWAY_NETFILTER_MODE: 'nftables', NATGW_RESYNC_PERIOD: '1h' });
    sock = socketOf(topo);
    await makeLink(topo);
    // Another owner's PERMANENT entry: natgw must never remove it.
    await topo.exec('gw', ['ip', 'neigh', 'replace', '10.9.0.77', 'lladdr', '02:00:00:00:00:77', 'nud', 'permanent', 'dev', DEV]);
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
  });
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
  });

  it('holds them PERMANENT, with the synthetic MAC where none is given', async () => {
    ok(await api(sock, 'PUT', `/v1/neighbours/${DEV},10.9.0.50`, {}), 'v4 synthetic');
    ok(await api(sock, 'PUT', `/v1/neighbours/${DEV},fd09::50`, {}), 'v6 synthetic');
    ok(await api(sock, 'PUT', `/v1/neighbours/${DEV},10.9.0.51`, { mac: '02:00:00:00:00:51' }), 'v4 explicit');
    expect(await permanent(topo)).toEqual([...OURS, '10.9.0.77 02:00:00:00:00:77'].sort());
    const listed = ok(await api(sock, 'GET', '/v1/neighbours'), 'list').body;
    expect(JSON.stringify(listed)).toContain('10.9.0.51');
    expect((await api(sock, 'PUT', `/v1/neighbours/${DEV},10.9.0.52`, { mac: 'zz' })).status).toBe(400);
  });

  it('sends no ARP request and no neighbour solicitation for them while traffic flows (a control address is resolved)', async () => {
    const cap = await startCapture(topo, 'ext', PEER, ['arp', 'or', 'icmp', 'or', 'icmp6']);
    try {
      for (const dst of ['10.9.0.50', 'fd09::50', '10.9.0.60']) {
        void topo.exec('gw', ['ping', '-c', '5', '-i', '0.2', '-W', '1', dst], { reject: false });
      }
      const echoes = (dst: string) =>
        cap.lines().filter((l) => l.includes(`> ${dst}: ICMP echo request`) || l.includes(`> ${dst}: ICMP6, echo request`)).length;
      await waitFor(async () => echoes('10.9.0.50') >= 3 && echoes('fd09::50') >= 3 && cap.lines().some((l) => l.includes('who-has 10.9.0.60')), {
        what: 'echo requests to both static neighbours on the wire, and the control address resolved by ARP',
        timeoutMs: 10_000,
      });
      // The frames went to the synthetic MAC without asking.
      expect(cap.lines().some((l) => l.includes('> 0a:58:0a:09:00:32') && l.includes('10.9.0.50'))).toBe(true);
      expect(cap.lines().filter((l) => l.includes('who-has 10.9.0.50'))).toEqual([]);
      expect(cap.lines().filter((l) => /neighbor solicitation, who has fd09::50\b/.test(l))).toEqual([]);
    } finally {
      await cap.stop();
    }
  });

  it('comes back on its own after the device is deleted and recreated', async () => {
    await topo.exec('gw', ['ip', 'link', 'del', DEV]);
    await makeLink(topo);
    await waitFor(async () => (await permanent(topo)).join() === OURS.join(), {
      what: 'the static neighbours to come back on the recreated device',
      timeoutMs: 10_000,
    });
  });

  it('comes back on its own after its entries are flushed, and natgw removes only its own', async () => {
    await topo.exec('gw', ['ip', 'neigh', 'replace', '10.9.0.77', 'lladdr', '02:00:00:00:00:77', 'nud', 'permanent', 'dev', DEV]);
    await topo.exec('gw', ['ip', 'neigh', 'del', '10.9.0.50', 'dev', DEV]);
    await waitFor(async () => (await permanent(topo)).includes(OURS[0]!), { what: 'a deleted entry to come back', timeoutMs: 10_000 });
    await topo.exec('gw', ['ip', 'neigh', 'flush', 'dev', DEV, 'nud', 'permanent']);
    await waitFor(async () => (await permanent(topo)).join() === OURS.join(), { what: 'the flushed entries to come back', timeoutMs: 10_000 });
    await topo.exec('gw', ['ip', 'neigh', 'replace', '10.9.0.77', 'lladdr', '02:00:00:00:00:77', 'nud', 'permanent', 'dev', DEV]);
    ok(await api(sock, 'DELETE', `/v1/neighbours/${DEV},10.9.0.51`), 'delete');
    expect(await permanent(topo)).toEqual(['10.9.0.50 0a:58:0a:09:00:32', '10.9.0.77 02:00:00:00:00:77', 'fd09::50 0a:58:00:00:00:50']);
    // A full sync (as after any link event) keeps it that way: the deleted one stays gone, the foreign one stays.
    const before = (await api(sock, 'GET', '/v1/state')).body.generation as number;
    // (Not a link down: the kernel drops every entry of a device that goes down, foreign ones too.)
    await topo.exec('gw', ['ip', 'addr', 'add', '10.9.0.3/24', 'dev', DEV]);
    await topo.exec('gw', ['ip', 'addr', 'del', '10.9.0.3/24', 'dev', DEV]);
    await waitFor(async () => ((await api(sock, 'GET', '/v1/state')).body.generation as number) > before, { what: 'a resync after the link event' });
    expect(await permanent(topo)).toEqual(['10.9.0.50 0a:58:0a:09:00:32', '10.9.0.77 02:00:00:00:00:77', 'fd09::50 0a:58:00:00:00:50']);
  });

  it('is part of the declarative state document', async () => {
    const doc = ok(await api(sock, 'GET', '/v1/state'), 'state').body;
    const desired = { ...doc.desired, neighbours: [...doc.desired.neighbours, { address: '10.9.0.53', dev: DEV }] };
    const dry = ok(await api(sock, 'PUT', '/v1/state?dryRun=true', desired), 'dry run').body;
    expect(dry.script).toContain(`neigh replace 10.9.0.53 lladdr 0a:58:0a:09:00:35 nud permanent dev ${DEV}`);
    expect(await permanent(topo)).not.toContain('10.9.0.53 0a:58:0a:09:00:35');
    ok(await api(sock, 'PUT', '/v1/state', desired), 'apply');
    expect(await permanent(topo)).toContain('10.9.0.53 0a:58:0a:09:00:35');
  });
});
