/**
 * Several external interfaces (Kube-OVN #7134 / PR #7238), with real traffic on every backend:
 * a gateway with the VPC and two external networks (net1 ⇄ ext, net2 ⇄ ext2), each with its
 * own gateway. The same remote address (REMOTE) lives behind both external gateways, so the
 * side that answers tells which interface a flow left by. EIP A is on net1 (the primary, whose
 * default route stays the main one), EIP B on net2; vpc1 is source-NATed behind A, vpc2 behind
 * B, and each EIP forwards a port to the VPC host that is NATed behind the OTHER EIP, so that a
 * DNAT reply must follow its connection back, not its source. Then each uplink in turn goes down
 * while a long-lived flow through the other keeps flowing, and commands keep working.
 */
import type { ChildProcess } from 'node:child_process';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type NsRole, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { request, startEchoServer, startLongFlow, tryRequest, type LongFlow, type ServerHandle } from '../helpers/traffic.js';
import { waitFor } from '../helpers/poll.js';
import { startCapture } from '../helpers/capture.js';
import { api, savedState, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIP_A = '172.20.0.10';
const EIP_B = '172.21.0.10';
/** Behind both external gateways (a loopback address in ext and in ext2). */
const REMOTE = '198.51.100.10';
const PORT = 9000;
const ECHO = 9100;

/** Answers every TCP connection with `<tag> peer=<ip>` and prints the same line (what this side saw). */
const TAGGED_SERVER = `
const [tag, port] = process.argv.slice(1);
require('net').createServer((s) => {
  s.on('error', () => {});
  const line = tag + ' peer=' + String(s.remoteAddress).replace(/^::ffff:/, '') + '\\n';
  process.stdout.write(line);
  s.end(line);
}).listen({ port: Number(port), host: '0.0.0.0' }, () => process.stdout.write('listening\\n'));`;

interface Tagged {
  /** Every `<tag> peer=<ip>` this side answered so far. */
  readonly seen: string[];
  readonly child: ChildProcess;
}

async function startTagged(topo: Topology, ns: NsRole, tag: string, port: number): Promise<Tagged> {
  const child = topo.spawn(ns, [process.execPath, '-e', TAGGED_SERVER, '--', tag, String(port)]);
  const seen: string[] = [];
  let listening: () => void = () => undefined;
  const ready = new Promise<void>((r) => (listening = r));
  createInterface({ input: child.stdout! }).on('line', (l) => (l === 'listening' ? listening() : seen.push(l)));
  await waitFor(() => Promise.race([ready.then(() => true), new Promise<false>((r) => setTimeout(() => r(false), 100))]), {
    what: `${tag} server in ${ns} to listen`,
    timeoutMs: 15_000,
  });
  return { seen, child };
}

const mainDefault = async (topo: Topology): Promise<string> => (await topo.exec('gw', ['ip', '-4', 'route', 'show', 'default'])).stdout.trim();

describe.each(BACKENDS)('several external interfaces on $name', (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  const servers: ServerHandle[] = [];
  let ext1: Tagged;
  let ext2: Tagged;

  beforeAll(async () => {
    topo = await createTopology({ secondUplink: true });
    Object.assign(topo.env, backend.env, { GATEWAY_V4: ADDR.extGateway, NATGW_UPLINK_GATEWAYS: `net2=${ADDR.ext2Gateway}` });
    for (const ns of ['ext', 'ext2'] as const) await topo.exec(ns, ['ip', 'addr', 'add', `${REMOTE}/32`, 'dev', 'lo']);
    // ext2's host reaches the VPC's EIP B on its own network; net2 gets an address of its own as Multus IPAM gives it.
    await topo.exec('gw', ['ip', 'addr', 'add', '172.21.0.2/24', 'dev', 'net2']);
    daemon = await startDaemon(topo);

    const init = await topo.natgwOk('init', 'eth0,net1,net2');
    expect(init).toContain('using External interface: net1,net2');
    // The controller's command lines, unchanged: the EIP's interface is found from its network.
    await topo.natgwOk('eip-add', `${EIP_A}/24`);
    await topo.natgwOk('eip-add', `${EIP_B}/24`);
    await topo.natgwOk('snat-add', `${EIP_A},${ADDR.vpc1}`);
    await topo.natgwOk('snat-add', `${EIP_B},${ADDR.vpc2}`);
    await topo.natgwOk('dnat-add', `${EIP_B},8080,tcp,${ADDR.vpc1},80`);
    await topo.natgwOk('dnat-add', `${EIP_A},8080,tcp,${ADDR.vpc2},80`);
    await waitReady(topo, daemon);

    ext1 = await startTagged(topo, 'ext', 'ext1', PORT);
    ext2 = await startTagged(topo, 'ext2', 'ext2', PORT);
    await startTagged(topo, 'vpc1', 'vpc1', 80);
    await startTagged(topo, 'vpc2', 'vpc2', 80);
    for (const ns of ['ext', 'ext2'] as const) {
      const s = startEchoServer(topo, ns, ECHO);
      servers.push(s);
      await s.ready;
    }
  }, 120_000);

  afterAll(async () => {
    for (const s of servers) await s.stop().catch(() => undefined);
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
  });

  it('puts each EIP on its own interface and keeps the primary default route the main one', async () => {
    expect(await topo.addresses('gw', 'net1', 4)).toEqual([`${EIP_A}/24`]);
    expect(await topo.addresses('gw', 'net2', 4)).toEqual(['172.21.0.2/24', `${EIP_B}/24`]);
    expect(await mainDefault(topo)).toBe(`default via ${ADDR.extGateway} dev net1 onlink`);
    // A re-add (the controller's redo) keeps each EIP where it is.
    await topo.natgwOk('eip-add', `${EIP_B}/24`);
    expect(await topo.addresses('gw', 'net1', 4)).toEqual([`${EIP_A}/24`]);
  });

  it('the API finds the interface as eip-add does, takes one named, and refuses an EIP of no uplink', async () => {
    const sock = socketOf(topo);
    const found = await api(sock, 'PUT', '/v1/eips/172.21.0.11', { prefixLength: 24 });
    expect(found.status).toBe(201);
    expect(found.body).toMatchObject({ address: '172.21.0.11', prefixLength: 24, interface: 'net2' });
    const named = await api(sock, 'PUT', '/v1/eips/172.21.0.12', { prefixLength: 32, interface: 'net1' });
    expect(named.status).toBe(201);
    expect(await topo.addresses('gw', 'net1', 4)).toEqual([`${EIP_A}/24`, '172.21.0.12/32']);
    expect(await topo.addresses('gw', 'net2', 4)).toContain('172.21.0.11/24');
    const none = await api(sock, 'PUT', '/v1/eips/10.9.9.9', { prefixLength: 24 });
    expect(none.status).toBe(400);
    expect(none.text).toContain('is in no network of the external interfaces (net1, net2)');
    const legacy = await topo.natgw('eip-add', '10.9.9.9/24');
    expect({ exit: legacy.exitCode, stderr: legacy.stderr }).toEqual({ exit: 1, stderr: '' });
    expect(legacy.stdout).toContain('Error: EIP 10.9.9.9/24 is in no network of the external interfaces (net1, net2)');
    for (const ip of ['172.21.0.11', '172.21.0.12']) expect((await api(sock, 'DELETE', `/v1/eips/${ip}`)).status).toBe(204);
    expect(await topo.addresses('gw', 'net1', 4)).toEqual([`${EIP_A}/24`]);
  });

  it("shapes each EIP's traffic on its own interface (and its IFB)", async () => {
    await topo.natgwOk('eip-egress-qos-add', `${EIP_A},1,10,1`);
    await topo.natgwOk('eip-egress-qos-add', `${EIP_B},1,10,1`);
    await topo.natgwOk('eip-ingress-qos-add', `${EIP_B},1,10,1`);
    const filters = async (dev: string) => (await topo.exec('gw', ['tc', 'filter', 'show', 'dev', dev])).stdout;
    // u32 prints the address in hex: 172.20.0.10 = ac14000a, 172.21.0.10 = ac15000a; offset 12 is the source, 16 the destination.
    const [net1, net2, ifb2] = [await filters('net1'), await filters('net2'), await filters('ifb-net2')];
    expect(net1).toContain('match ac14000a/ffffffff at 12');
    expect(net1).not.toContain('ac15000a');
    expect(net2).toContain('match ac15000a/ffffffff at 12');
    expect(net2).not.toContain('ac14000a');
    expect(ifb2).toContain('match ac15000a/ffffffff at 16');
    expect(await topo.addresses('gw', 'ifb-net1')).toBeNull();
  });

  it("sends each SNAT flow out by its EIP's interface, and nothing out by the other", async () => {
    const before = { ext1: ext1.seen.length, ext2: ext2.seen.length };
    expect(await request(topo, 'vpc1', 'tcp', REMOTE, PORT)).toBe(`ext1 peer=${EIP_A}`);
    expect(await request(topo, 'vpc2', 'tcp', REMOTE, PORT)).toBe(`ext2 peer=${EIP_B}`);
    expect(ext1.seen.slice(before.ext1)).toEqual([`ext1 peer=${EIP_A}`]);
    expect(ext2.seen.slice(before.ext2)).toEqual([`ext2 peer=${EIP_B}`]);
    // The gateway's own packets from an EIP leave by that EIP's interface too.
    expect(await request(topo, 'gw', 'tcp', REMOTE, PORT, { localAddress: EIP_B })).toBe(`ext2 peer=${EIP_B}`);
    expect(await request(topo, 'gw', 'tcp', REMOTE, PORT, { localAddress: EIP_A })).toBe(`ext1 peer=${EIP_A}`);
  });

  it('returns DNAT replies by the interface their connection came in by', async () => {
    // Behind each EIP is the VPC host NATed behind the other EIP: the reply must follow its
    // connection, not its source (the remote address exists on both sides, so a reply out of
    // the wrong interface reaches a host that resets it).
    expect(await request(topo, 'ext2', 'tcp', EIP_B, 8080, { localAddress: REMOTE })).toBe(`vpc1 peer=${REMOTE}`);
    expect(await request(topo, 'ext', 'tcp', EIP_A, 8080, { localAddress: REMOTE })).toBe(`vpc2 peer=${REMOTE}`);
    expect(await request(topo, 'ext2', 'tcp', EIP_B, 8080, { localAddress: ADDR.ext2Host })).toBe(`vpc1 peer=${ADDR.ext2Host}`);
  });

  it('a floating IP on the secondary uplink carries both directions there; hairpin through its EIP works', async () => {
    const FIP = '172.21.0.20';
    await topo.natgwOk('subnet-route-add', `${ADDR.sub2Cidr},${ADDR.rtr}`);
    await topo.natgwOk('eip-add', `${FIP}/24`);
    await topo.natgwOk('floating-ip-add', `${FIP},${ADDR.sub2}`);
    const sub2 = await startTagged(topo, 'sub2', 'sub2', 80);
    try {
      expect(await request(topo, 'sub2', 'tcp', REMOTE, PORT)).toBe(`ext2 peer=${FIP}`);
      expect(await request(topo, 'ext2', 'tcp', FIP, 80, { localAddress: REMOTE })).toBe(`sub2 peer=${REMOTE}`);
      // A VPC client through an EIP of the secondary uplink to a VPC server (hairpin).
      expect(await request(topo, 'vpc2', 'tcp', EIP_B, 8080)).toBe(`vpc1 peer=${EIP_B}`);
    } finally {
      sub2.child.kill('SIGKILL');
      await topo.natgwOk('floating-ip-del', FIP);
      await topo.natgwOk('eip-del', `${FIP}/24`);
    }
  });

  it('a full sync puts back a deleted uplink rule, and the next one finds nothing to repair', async () => {
    // Rules of one priority list in the order they were added: compared as a set.
    const rules = async () => (await topo.exec('gw', ['ip', 'rule', 'show'])).stdout.split('\n').sort().join('\n');
    const held = await rules();
    expect(held).toContain(`from ${EIP_B} lookup 7101`);
    const fullSyncs = () =>
      daemon!
        .logs()
        .split('\n')
        .filter((l) => l.includes('full sync: read back'))
        .map((l) => (JSON.parse(l) as { changes: number }).changes);
    // The log is written a moment after the command's answer.
    const nextFullSync = async (n: number) => (await waitFor(async () => fullSyncs().length > n && fullSyncs(), { what: 'the full sync in the log' })).at(-1);
    let seen = fullSyncs().length;
    await topo.exec('gw', ['ip', 'rule', 'del', 'pref', '7301', 'from', EIP_B, 'lookup', '7101']);
    // `init` without arguments is a full sync, with the interfaces the env file recorded (net1,net2);
    // the resync timer may run one first: either repairs the rule and counts it.
    await topo.natgwOk('init');
    expect(await rules()).toBe(held);
    await waitFor(async () => fullSyncs().slice(seen).includes(1), { what: 'a full sync that counted the repair' });
    expect(await request(topo, 'gw', 'tcp', REMOTE, PORT, { localAddress: EIP_B })).toBe(`ext2 peer=${EIP_B}`);
    seen = fullSyncs().length;
    await topo.natgwOk('init');
    expect(await nextFullSync(seen)).toBe(0);
  });

  it('a restart without its state file adopts each EIP on its own uplink and keeps routing it there', async () => {
    const before = (await savedState(topo)) as { eips: unknown[]; interfaces: unknown };
    await stopDaemon(daemon!, 'SIGKILL');
    for (const f of ['state.json', 'state.journal']) rmSync(join(topo.stateDir, f), { force: true });
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    const doc = (await api(socketOf(topo), 'GET', '/v1/state')).body as { desired: { eips: unknown[]; interfaces: unknown } };
    expect(doc.desired.interfaces).toEqual(before.interfaces);
    expect(doc.desired.eips).toEqual(
      expect.arrayContaining([
        { address: EIP_A, prefixLength: 24, interface: 'net1' },
        { address: EIP_B, prefixLength: 24, interface: 'net2' },
      ]),
    );
    expect(await request(topo, 'vpc2', 'tcp', REMOTE, PORT)).toBe(`ext2 peer=${EIP_B}`);
    expect(await request(topo, 'ext2', 'tcp', EIP_B, 8080, { localAddress: REMOTE })).toBe(`vpc1 peer=${REMOTE}`);
  });

  it('losing net2 keeps the flows through net1 (and commands) going; back up, net2 carries again', async () => {
    const flows: LongFlow[] = [];
    try {
      const viaA = await startLongFlow(topo, 'vpc1', REMOTE, ECHO);
      flows.push(viaA);
      expect(viaA.peer).toMatch(new RegExp(`^peer=${EIP_A.replace(/\./g, '\\.')}:`));
      const seenBefore = ext1.seen.length;
      await topo.exec('gw', ['ip', 'link', 'set', 'net2', 'down']);
      for (let i = 0; i < 5; i++) expect(await viaA.check(3000)).toBe(true);
      expect(await request(topo, 'vpc1', 'tcp', REMOTE, PORT)).toBe(`ext1 peer=${EIP_A}`);
      // vpc2's traffic has nowhere to go: it is dropped, never leaked out of net1 with another source.
      expect(await tryRequest(topo, 'vpc2', 'tcp', REMOTE, PORT, { timeoutMs: 1500 })).toBeNull();
      expect(ext1.seen.slice(seenBefore)).toEqual([`ext1 peer=${EIP_A}`]);
      expect(await mainDefault(topo)).toBe(`default via ${ADDR.extGateway} dev net1 onlink`);
      const r = await topo.natgw('snat-add', `${EIP_A},10.0.1.100`);
      expect({ exit: r.exitCode, stderr: r.stderr }).toEqual({ exit: 0, stderr: '' });
      expect(await viaA.check(3000)).toBe(true);

      const cap = await startCapture(topo, 'ext2', 'e0', ['arp']);
      try {
        await topo.exec('gw', ['ip', 'link', 'set', 'net2', 'up']);
        await waitFor(async () => (await tryRequest(topo, 'vpc2', 'tcp', REMOTE, PORT, { timeoutMs: 1000 })) === `ext2 peer=${EIP_B}`, {
          what: "vpc2's SNAT flow out of net2 again once it is back",
          timeoutMs: 20_000,
          intervalMs: 300,
        });
        // Its EIPs are announced again on it, and only its own.
        await waitFor(async () => cap.lines().some((l) => l.includes(`Request who-has ${EIP_B} `) && l.includes(`tell ${EIP_B},`)), {
          what: `gratuitous ARP for ${EIP_B} on net2 once it is back`,
        });
        expect(cap.lines().filter((l) => l.includes(`tell ${EIP_A},`))).toEqual([]);
      } finally {
        await cap.stop();
      }
      expect(await viaA.check(3000)).toBe(true);
    } finally {
      for (const f of flows) await f.close();
    }
  }, 90_000);

  it('losing net1 keeps the flows through net2 going', async () => {
    const flows: LongFlow[] = [];
    try {
      const viaB = await startLongFlow(topo, 'vpc2', REMOTE, ECHO);
      flows.push(viaB);
      expect(viaB.peer).toMatch(new RegExp(`^peer=${EIP_B.replace(/\./g, '\\.')}:`));
      await topo.exec('gw', ['ip', 'link', 'set', 'net1', 'down']);
      for (let i = 0; i < 5; i++) expect(await viaB.check(3000)).toBe(true);
      expect(await request(topo, 'vpc2', 'tcp', REMOTE, PORT)).toBe(`ext2 peer=${EIP_B}`);
      expect(await request(topo, 'ext2', 'tcp', EIP_B, 8080, { localAddress: REMOTE })).toBe(`vpc1 peer=${REMOTE}`);
      await topo.exec('gw', ['ip', 'link', 'set', 'net1', 'up']);
      // The daemon's link-event resync puts the primary's default route back.
      await waitFor(async () => (await mainDefault(topo)) === `default via ${ADDR.extGateway} dev net1 onlink`, {
        what: 'the main default route via net1 again',
        timeoutMs: 20_000,
      });
      await waitFor(async () => (await tryRequest(topo, 'vpc1', 'tcp', REMOTE, PORT, { timeoutMs: 1000 })) === `ext1 peer=${EIP_A}`, {
        what: "vpc1's SNAT flow out of net1 again",
        timeoutMs: 20_000,
        intervalMs: 300,
      });
      expect(await viaB.check(3000)).toBe(true);
    } finally {
      for (const f of flows) await f.close();
    }
  }, 90_000);

  it('back to one external interface removes every uplink rule, table and mark natgw held', async () => {
    await topo.natgwOk('eip-egress-qos-del', EIP_B);
    await topo.natgwOk('eip-ingress-qos-del', EIP_B);
    expect(await topo.exec('gw', ['tc', 'filter', 'show', 'dev', 'net2']).then((r) => r.stdout)).not.toContain('ac15000a');
    await topo.natgwOk('init', 'eth0,net1');
    // An EIP of the dropped uplink falls back to the primary, and leaves the dropped interface.
    expect(await topo.addresses('gw', 'net2', 4)).toEqual(['172.21.0.2/24']);
    expect(await topo.addresses('gw', 'net1', 4)).toEqual([`${EIP_A}/24`, `${EIP_B}/24`]);
    await topo.natgwOk('eip-del', `${EIP_B}/24`);
    expect(await topo.addresses('gw', 'net1', 4)).toEqual([`${EIP_A}/24`]);
    const rules = (await topo.exec('gw', ['ip', 'rule', 'show'])).stdout;
    expect(rules.split('\n').filter((l) => /^7[2-4]\d\d:/.test(l))).toEqual([]);
    expect((await topo.exec('gw', ['ip', 'route', 'show', 'table', '7101'])).stdout.trim()).toBe('');
    if (backend.iptablesVariant) expect(await topo.iptablesSave('mangle', backend.iptablesVariant)).not.toContain('NATGW_UPLINKS');
    else expect((await topo.exec('gw', ['nft', 'list', 'tables'])).stdout).not.toContain('natgw_uplinks');
    expect(await request(topo, 'vpc1', 'tcp', REMOTE, PORT)).toBe(`ext1 peer=${EIP_A}`);
  });
});
