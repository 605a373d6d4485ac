/**
 * Restart hygiene on the real kernel, for every backend: a UDP flow through a DNAT (a packet
 * every 100 ms) keeps running while natgw's rules are flushed and the daemon restarts. The
 * packets that arrive meanwhile commit an untranslated conntrack entry; without the cleanup
 * (NATGW_CONNTRACK_CLEANUP=false, the baseline, shown once) the flow stays broken after the
 * rules are back, with it the flow resumes right after ready. A capture on the external peer
 * sees gratuitous ARP for every EIP after the restart and after net1 is recreated.
 */
import type { ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { parsePeer, request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { waitFor } from '../helpers/poll.js';
import { startCapture } from '../helpers/capture.js';
import { isTranslated } from '../../src/dataplane/conntrackStale.js';
import { parseConntrackLines } from '../../src/model/conntrackLine.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitForLog, waitReady, type Daemon } from './daemon-util.js';

const EIPS = ['172.20.0.10', '172.20.0.11'];
/** An IPv6 EIP: announced by an unsolicited neighbour advertisement (na6), not ARP. */
const EIP6 = 'fd00:20::10';
const EIP = EIPS[0]!;
const CLIENT_PORT = 41000;

/** Sends one datagram every 100 ms from a fixed port and counts sends and answers. */
const FLOW_CLIENT = `
const dgram = require('node:dgram');
const [host, port, local, lport] = process.argv.slice(1);
const s = dgram.createSocket('udp4');
let sent = 0, recv = 0;
s.on('message', () => { recv++; process.stdout.write('recv ' + recv + ' sent ' + sent + '\\n'); });
s.on('error', () => {});
s.bind(Number(lport), local, () => setInterval(() => { sent++; s.send('x', Number(port), host); process.stdout.write('sent ' + sent + ' recv ' + recv + '\\n'); }, 100));
`;

interface Flow {
  sent(): number;
  recv(): number;
  stop(): void;
}

function startFlow(topo: Topology): Flow {
  const child: ChildProcess = topo.spawn('ext', [process.execPath, '-e', FLOW_CLIENT, '--', EIP, '8080', ADDR.extHost, String(CLIENT_PORT)]);
  let sent = 0;
  let recv = 0;
  let partial = '';
  child.stdout?.setEncoding('utf8').on('data', (d: string) => {
    partial += d;
    const lines = partial.split('\n');
    partial = lines.pop() ?? '';
    for (const l of lines) {
      const m = /^(sent|recv) (\d+) (?:sent|recv) (\d+)$/.exec(l);
      if (!m) continue;
      if (m[1] === 'sent') [sent, recv] = [Number(m[2]), Number(m[3])];
      else [recv, sent] = [Number(m[2]), Number(m[3])];
    }
  });
  return { sent: () => sent, recv: () => recv, stop: () => child.kill('SIGKILL') };
}

/** The flow's conntrack entries in gw (both families are not needed: the flow is IPv4). */
async function flowEntries(topo: Topology) {
  const r = await topo.exec('gw', ['conntrack', '-L', '-p', 'udp', '--orig-port-src', String(CLIENT_PORT), '-o', 'extended'], { reject: false });
  return parseConntrackLines(r.stdout);
}

async function flushRules(topo: Topology, b: BackendCase): Promise<void> {
  if (b.iptablesVariant) await topo.exec('gw', [`iptables-${b.iptablesVariant}`, '-t', 'nat', '-F', 'SHARED_DNAT']);
  else await topo.exec('gw', ['nft', 'flush', 'table', 'ip', 'natgw']);
}

describe.each(BACKENDS)('restart hygiene on $name', (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let server: ServerHandle;
  let flow: Flow;
  let sock: string;

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env, { GATEWAY_V4: ADDR.extGateway });
    sock = socketOf(topo);
    // Something besides natgw keeps connection tracking on in the pod (Kube-OVN's own rules do):
    // without it the kernel tracks nothing while natgw's NAT rules are absent.
    await topo.exec('gw', ['nft', '-f', '-'], {
      input: 'table ip foreign_ct {\n chain c {\n type filter hook prerouting priority 0; policy accept;\n ct state new counter\n }\n}\n',
    });
    server = startServer(topo, 'vpc1', 'udp', 80);
    await server.ready;
    daemon = await startDaemon(topo);
    const init = await topo.natgw('init');
    expect(init.stderr).toBe('');
    for (const e of EIPS) ok(await api(sock, 'PUT', `/v1/eips/${e}`, { prefixLength: 24 }), 'eip');
    ok(await api(sock, 'PUT', `/v1/eips/${EIP6}`, { prefixLength: 64 }), 'eip6');
    ok(await api(sock, 'PUT', `/v1/dnats/${EIP},8080,udp`, { internalIp: ADDR.vpc1, internalPort: 80 }), 'dnat');
    await waitReady(topo, daemon);
    flow = startFlow(topo);
    await waitFor(async () => flow.recv() >= 3, { what: 'the UDP flow through the DNAT to run' });
  });
  afterAll(async () => {
    flow?.stop();
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await server?.stop().catch(() => undefined);
    await topo?.cleanup();
  });

  /** Stop natgw, flush its rules and let the running flow commit an untranslated entry. */
  async function breakWhileAway(): Promise<void> {
    if (daemon) await stopDaemon(daemon);
    daemon = undefined;
    await flushRules(topo, backend);
    await topo.exec('gw', ['conntrack', '-D', '-p', 'udp', '--orig-port-src', String(CLIENT_PORT)], { reject: false });
    await waitFor(
      async () => {
        const es = await flowEntries(topo);
        return es.length === 1 && !isTranslated(es[0]!);
      },
      { what: 'the flow to commit an untranslated conntrack entry' },
    );
  }

  /** Wait until ready; the flow's counters at that moment. */
  async function restart(env: Record<string, string>): Promise<{ sent: number; recv: number }> {
    daemon = await startDaemon(topo, env);
    await waitReady(topo, daemon);
    return { sent: flow.sent(), recv: flow.recv() };
  }

  if (backend === BACKENDS[0]) {
    it('baseline: without the cleanup the flow stays broken after the rules are back', async () => {
      await breakWhileAway();
      const at = await restart({ NATGW_CONNTRACK_CLEANUP: 'false' });
      // A new connection is translated again: the rules are back, only the old entry is stale.
      expect(parsePeer(await request(topo, 'ext', 'udp', EIP, 8080, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
      await waitFor(async () => flow.sent() >= at.sent + 20, { what: 'twenty more datagrams of the flow (2 s)' });
      expect(flow.recv()).toBe(at.recv);
      expect(isTranslated((await flowEntries(topo))[0]!)).toBe(false);
      await waitForLog(daemon!, 'NATGW_CONNTRACK_CLEANUP=false');
    });
  }

  it('with the cleanup the flow resumes within one second of ready, and every EIP is announced', async () => {
    await breakWhileAway();
    const cap = await startCapture(topo, 'ext', 'e0', ['arp', 'or', 'icmp6']);
    try {
      const at = await restart({});
      // Within ten datagrams of ready (one second at 100 ms), counted rather than timed.
      await waitFor(async () => flow.recv() > at.recv || flow.sent() >= at.sent + 10, { what: 'an answer or ten datagrams after ready', timeoutMs: 10_000 });
      expect(flow.recv()).toBeGreaterThan(at.recv);
      expect(isTranslated((await flowEntries(topo))[0]!)).toBe(true);
      await waitForLog(daemon!, /"deleted":[1-9]\d*,.*restart hygiene/);
      for (const e of EIPS) {
        await waitFor(async () => cap.lines().some((l) => l.includes(`Request who-has ${e} `) && l.includes(`tell ${e},`)), {
          what: `gratuitous ARP for ${e} after the restart`,
        });
      }
      await waitFor(async () => cap.lines().some((l) => l.includes(`${EIP6} > ff02::1`) && l.includes(`neighbor advertisement, tgt is ${EIP6}`)), {
        what: `an unsolicited neighbour advertisement for ${EIP6} after the restart`,
      });
    } finally {
      await cap.stop();
    }
  });

  it('announces every EIP again after net1 is recreated', async () => {
    await topo.exec('gw', ['ip', 'link', 'del', 'net1']);
    // Recreated down, so the capture on the new e0 runs before net1 comes up.
    await topo.exec('gw', ['ip', 'link', 'add', 'net1', 'type', 'veth', 'peer', 'name', 'e0', 'netns', topo.ns.ext]);
    await topo.exec('ext', ['ip', 'addr', 'add', `${ADDR.extGateway}/24`, 'dev', 'e0']);
    await topo.exec('ext', ['ip', 'addr', 'add', `${ADDR.extHost}/24`, 'dev', 'e0']);
    await topo.exec('ext', ['ip', 'link', 'set', 'e0', 'up']);
    const cap = await startCapture(topo, 'ext', 'e0', ['arp', 'or', 'icmp6']);
    try {
      await topo.exec('gw', ['ip', 'link', 'set', 'net1', 'up']);
      for (const e of EIPS) {
        await waitFor(async () => cap.lines().some((l) => l.includes(`Request who-has ${e} `) && l.includes(`tell ${e},`)), {
          what: `gratuitous ARP for ${e} after net1 was recreated`,
        });
      }
      await waitFor(async () => cap.lines().some((l) => l.includes(`${EIP6} > ff02::1`) && l.includes(`neighbor advertisement, tgt is ${EIP6}`)), {
        what: `an unsolicited neighbour advertisement for ${EIP6} after net1 was recreated`,
      });
      expect(parsePeer(await request(topo, 'ext', 'udp', EIP, 8080, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    } finally {
      await cap.stop();
    }
  });

  it('a flag change of net1 (promiscuous mode, as tcpdump sets it) announces nothing; net1 down and up does', async () => {
    const count = (re: RegExp) => (daemon?.logs().match(re) ?? []).length;
    const QUEUED = /gratuitous ARP \/ unsolicited NA queued for every EIP/g;
    const fullSyncs = count(/full sync: read back/g);
    const queued = count(QUEUED);
    await topo.exec('gw', ['ip', 'link', 'set', 'net1', 'promisc', 'on']);
    try {
      // The link event's resync ran: an announcement asked for by the event is queued right after
      // it, or at most a second later (announcements are a second apart at least).
      await waitFor(async () => count(/full sync: read back/g) > fullSyncs, { what: 'the resync after the flag change' });
      await new Promise((r) => setTimeout(r, 1100));
      expect(count(QUEUED)).toBe(queued);
      // The control: a real transition is announced, on the wire too.
      const cap = await startCapture(topo, 'ext', 'e0', ['arp']);
      try {
        await topo.exec('gw', ['ip', 'link', 'set', 'net1', 'down']);
        await topo.exec('gw', ['ip', 'link', 'set', 'net1', 'up']);
        await waitFor(async () => count(QUEUED) > queued, { what: 'the announcement after net1 went down and up' });
        for (const e of EIPS) {
          await waitFor(async () => cap.lines().some((l) => l.includes(`Request who-has ${e} `) && l.includes(`tell ${e},`)), {
            what: `gratuitous ARP for ${e} after net1 went down and up`,
          });
        }
      } finally {
        await cap.stop();
      }
    } finally {
      await topo.exec('gw', ['ip', 'link', 'set', 'net1', 'promisc', 'off']);
    }
  });
});
