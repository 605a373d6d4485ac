/**
 * ShareDnatTable against a real kernel, in the netns topology: the SPEC's objects in
 * `table ip kube-ovn`, load spread over the backends, an update that keeps an established
 * flow, stale chains cleaned, idempotence, read-back, and someone else's objects left alone.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ShareDnat } from '../../src/model/rules.js';
import { ShareDnatTable } from '../../src/dataplane/netfilter/shareDnat.js';
import { shareDnatChainName } from '../../src/model/shareDnatName.js';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { parseLocal, request, startEchoServer, startLongFlow, startServer, type ServerHandle } from '../helpers/traffic.js';
import { NetnsExecutor } from '../helpers/netnsExecutor.js';

const HOOK_TIMEOUT = 60_000;

const EIP = '172.20.0.10';
const LB: ShareDnat = {
  eip: EIP,
  port: 8080,
  protocol: 'tcp',
  protocolText: 'TCP',
  backends: [
    { ip: ADDR.vpc1, port: 80 },
    { ip: ADDR.vpc2, port: 80 },
  ],
};
const ECHO: ShareDnat = { eip: EIP, port: 9090, protocol: 'tcp', protocolText: 'tcp', backends: [{ ip: ADDR.vpc1, port: 90 }] };

/** The backend (reply source) of each conntrack entry for EIP:port. */
async function backendsSeen(topo: Topology, port: number): Promise<string[]> {
  const r = await topo.exec('gw', ['conntrack', '-L', '-p', 'tcp', '--orig-dst', EIP, '--dport', String(port)], { reject: false });
  return r.stdout
    .split('\n')
    .filter((l) => l.includes(`dport=${port}`))
    .map((l) => [...l.matchAll(/src=(\S+)/g)][1]?.[1] ?? '');
}

describe('ShareDnatTable in a network namespace', () => {
  let topo: Topology;
  let share: ShareDnatTable;
  const servers: ServerHandle[] = [];
  const list = async (): Promise<string> => (await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'kube-ovn'])).stdout;
  const chains = async (): Promise<string[]> => [...(await list()).matchAll(/chain (\S+) \{/g)].map((m) => m[1] ?? '');

  beforeAll(async () => {
    topo = await createTopology();
    share = new ShareDnatTable(new NetnsExecutor(topo.ns.gw));
    await topo.exec('gw', ['ip', 'addr', 'add', `${EIP}/24`, 'dev', 'net1']);
    servers.push(
      // Each answer names the backend that served it.
      startServer(topo, 'vpc1', 'tcp', 80, '0.0.0.0', { reportLocal: true }),
      startServer(topo, 'vpc2', 'tcp', 80, '0.0.0.0', { reportLocal: true }),
      startEchoServer(topo, 'vpc1', 90),
      startEchoServer(topo, 'vpc2', 90),
    );
    await Promise.all(servers.map((s) => s.ready));
    // Someone else's objects in the same table: never touched.
    await topo.exec('gw', ['nft', '-f', '-'], {
      input: 'add table ip kube-ovn\nadd chain ip kube-ovn theirs\nadd rule ip kube-ovn theirs counter\nadd set ip kube-ovn their-set { type ipv4_addr; }\n',
    });
  }, HOOK_TIMEOUT);

  afterAll(async () => {
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  }, HOOK_TIMEOUT);

  it('writes the SPEC objects exactly', async () => {
    const r = await share.sync([LB]);
    expect(r.changes).toBeGreaterThan(0);
    const chain = shareDnatChainName(LB);
    expect(chain).toMatch(/^dnat-[0-9a-f]{12}$/);
    const text = await list();
    expect(text).toContain('map service-ips {');
    expect(text).toContain('type ipv4_addr . inet_proto . inet_service : verdict');
    expect(text).toContain(`elements = { 172.20.0.10 . tcp . 8080 : goto ${chain} }`);
    expect(text).toMatch(
      /chain prerouting \{\s+type nat hook prerouting priority mangle; policy accept;\s+ip daddr \. meta l4proto \. th dport vmap @service-ips\s+\}/,
    );
    expect(text).toContain(`chain ${chain} {\n\t\tmeta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.0.1.6 . 80, 1 : 10.0.1.7 . 80 }\n\t}`);
    const prio = await topo.exec('gw', ['nft', '-j', 'list', 'chain', 'ip', 'kube-ovn', 'prerouting']);
    expect(prio.stdout).toContain('"prio": -150');
  });

  it('a second sync changes nothing; read-back returns the items', async () => {
    expect(await share.sync([LB])).toEqual({ changes: 0, script: '' });
    expect(await share.readBack()).toEqual([LB]);
  });

  it('spreads 30 TCP connections over both backends', async () => {
    // Counted from the answers, not from conntrack: a source port reused by a later connection
    // replaces its entry there, and the listing would show 29.
    const seen: string[] = [];
    for (let batch = 0; batch < 3; batch++) {
      const answers = await Promise.all(Array.from({ length: 10 }, () => request(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost })));
      seen.push(...answers.map((a) => parseLocal(a).ip));
    }
    expect(seen).toHaveLength(30);
    expect(seen.filter((b) => b === ADDR.vpc1).length).toBeGreaterThan(0);
    expect(seen.filter((b) => b === ADDR.vpc2).length).toBeGreaterThan(0);
    expect(seen.every((b) => b === ADDR.vpc1 || b === ADDR.vpc2)).toBe(true);
  });

  it('an update replaces the backends and keeps an established flow alive', async () => {
    await share.sync([LB, ECHO]);
    const flow = await startLongFlow(topo, 'ext', EIP, 9090, { localAddress: ADDR.extHost });
    try {
      expect(await flow.check()).toBe(true);
      const moved: ShareDnat = { ...ECHO, backends: [{ ip: ADDR.vpc2, port: 90 }] };
      const r = await share.sync([LB, moved]);
      const chain = shareDnatChainName(ECHO);
      expect(r).toEqual({
        changes: 2,
        script: `flush chain ip kube-ovn ${chain}\nadd rule ip kube-ovn ${chain} meta l4proto tcp dnat ip addr . port to numgen random mod 1 map { 0 : 10.0.1.7 . 90 }\n`,
      });
      // The old flow still talks to vpc1 through its conntrack entry; a new one goes to vpc2.
      expect(await flow.check()).toBe(true);
      await request(topo, 'ext', 'tcp', EIP, 9090, { localAddress: ADDR.extHost });
      const seen = await backendsSeen(topo, 9090);
      expect(seen).toContain(ADDR.vpc1);
      expect(seen).toContain(ADDR.vpc2);
    } finally {
      await flow.close();
    }
  });

  it('removing an identity deletes its element and its chain', async () => {
    const chain = shareDnatChainName(ECHO);
    const r = await share.sync([LB]);
    expect(r.changes).toBe(2);
    expect(await chains()).not.toContain(chain);
    expect(await list()).not.toContain('. 9090 :');
    expect(await share.sync([LB])).toEqual({ changes: 0, script: '' });
  });

  it('cleans a stale chain left behind by an earlier refused delete', async () => {
    // What a kernel before 6.2 leaves: a flushed dnat-* chain no element jumps to.
    const stale = shareDnatChainName({ eip: EIP, port: 1, protocolText: 'udp' });
    await topo.exec('gw', ['nft', 'add', 'chain', 'ip', 'kube-ovn', stale]);
    expect(await chains()).toContain(stale);
    const r = await share.sync([LB]);
    expect(r).toEqual({ changes: 1, script: `delete chain ip kube-ovn ${stale}\n` });
    expect(await chains()).not.toContain(stale);
  });

  it('repairs a chain flushed behind its back', async () => {
    await topo.exec('gw', ['nft', 'flush', 'chain', 'ip', 'kube-ovn', shareDnatChainName(LB)]);
    expect((await share.sync([LB])).changes).toBe(1);
    expect(await share.readBack()).toEqual([LB]);
  });

  it('never touched the foreign objects; removing every share DNAT leaves them and the table', async () => {
    const before = await list();
    expect(before).toContain('chain theirs');
    expect(before).toContain('set their-set');
    await share.sync([]);
    const after = await list();
    expect(after).toContain('chain theirs');
    expect(after).toContain('set their-set');
    expect(after).not.toMatch(/dnat-[0-9a-f]{12}/);
    expect(await share.readBack()).toEqual([]);
    expect(await share.sync([])).toEqual({ changes: 0, script: '' });
  });
});
