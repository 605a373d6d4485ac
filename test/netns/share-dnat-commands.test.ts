/**
 * Share DNAT (SPEC §2 nft-dnat-map-add/-del) through the shim, for every backend: the objects
 * in `table ip kube-ovn` exactly, load spread over the backends with real TCP from ext, an
 * update that keeps an established flow, a delete that flushes the identity's conntrack
 * entries, every validation message, and the init guard.
 */
import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, isOneBackend, ownedNetfilter, type BackendCase } from '../helpers/backends.js';
import {
  conntrackCount,
  parseLocal,
  parsePeer,
  request,
  startEchoServer,
  startLongFlow,
  tryRequest,
  type LongFlow,
  type ServerHandle,
} from '../helpers/traffic.js';
import { waitFor } from '../helpers/poll.js';

const EIP = '172.20.0.10';
const PORT = 9090;
const BACKEND_PORT = 81;
const RULE = `${EIP},${PORT},tcp,${ADDR.vpc1}:${BACKEND_PORT}@${ADDR.vpc2}:${BACKEND_PORT}`;

/** SPEC §2: `dnat-` + the first 12 hex digits of md5(`<eip>:<port>:<protocol as received>`), computed here independently. */
const chainOf = (eip: string, port: number, protocolText: string): string =>
  `dnat-${createHash('md5').update(`${eip}:${port}:${protocolText}`).digest('hex').slice(0, 12)}`;

const CHAIN = chainOf(EIP, PORT, 'tcp');
const FROM_EXT = { localAddress: ADDR.extHost } as const;

describe.each(BACKENDS)('share DNAT commands on $name', (backend: BackendCase) => {
  let topo: Topology;
  const servers: ServerHandle[] = [];
  const flows: LongFlow[] = [];

  /** `nft list table ip kube-ovn`, or null when the table does not exist. */
  const kubeOvn = async (): Promise<string | null> => {
    const r = await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'kube-ovn'], { reject: false });
    return r.exitCode === 0 ? r.stdout : null;
  };
  /** The backend (server address) that answered one new TCP connection from ext. */
  const backendOf = async (port = PORT): Promise<string> => parseLocal(await request(topo, 'ext', 'tcp', EIP, port, FROM_EXT)).ip;
  const connections = async (n: number, port = PORT): Promise<string[]> => {
    const seen: string[] = [];
    // Batches of 10 in parallel: quick, and still 30 separate connections (separate conntrack entries).
    for (let done = 0; done < n; done += 10) {
      seen.push(...(await Promise.all(Array.from({ length: Math.min(10, n - done) }, () => backendOf(port)))));
    }
    return seen;
  };

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env, { GATEWAY_V4: ADDR.extGateway });
    // Echo servers answer a request() with their first line too; they tell which backend answered.
    for (const ns of ['vpc1', 'vpc2'] as const) servers.push(startEchoServer(topo, ns, BACKEND_PORT, '0.0.0.0', { reportLocal: true }));
    await Promise.all(servers.map((s) => s.ready));
  });
  afterAll(async () => {
    await Promise.all(flows.map((f) => f.close().catch(() => undefined)));
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  });

  it('is guarded before init: stderr, status 1, nothing created', async () => {
    for (const [cmd, rule] of [
      ['nft-dnat-map-add', RULE],
      ['nft-dnat-map-del', `${EIP},${PORT},tcp`],
    ] as const) {
      const r = await topo.natgw(cmd, rule);
      expect(r.exitCode).toBe(1);
      expect(r.stderr).toBe('nat gateway not initialized\n');
      expect(r.stdout).toBe(`${cmd} ${rule}\n`);
    }
    expect(await kubeOvn()).toBeNull();
  });

  it('nft-dnat-map-add writes exactly the SPEC objects and prints the chain', async () => {
    await topo.natgwOk('init');
    await topo.natgwOk('eip-add', `${EIP}/24`);
    const out = await topo.natgwOk('nft-dnat-map-add', RULE);
    expect(out).toBe(
      `nft-dnat-map-add ${RULE}\n` +
        `Updated nft share dnat: ${EIP}:${PORT} (tcp) -> ${ADDR.vpc1}:${BACKEND_PORT}@${ADDR.vpc2}:${BACKEND_PORT} (chain=${CHAIN})\n`,
    );
    // nft 1.0.6 prints priority -150 by its standard name (`mangle`); the number is checked below.
    expect(await kubeOvn()).toBe(
      'table ip kube-ovn {\n' +
        '\tmap service-ips {\n' +
        '\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n' +
        `\t\telements = { ${EIP} . tcp . ${PORT} : goto ${CHAIN} }\n` +
        '\t}\n\n' +
        '\tchain prerouting {\n' +
        '\t\ttype nat hook prerouting priority mangle; policy accept;\n' +
        '\t\tip daddr . meta l4proto . th dport vmap @service-ips\n' +
        '\t}\n\n' +
        `\tchain ${CHAIN} {\n` +
        `\t\tmeta l4proto tcp dnat ip to numgen random mod 2 map { 0 : ${ADDR.vpc1} . ${BACKEND_PORT}, 1 : ${ADDR.vpc2} . ${BACKEND_PORT} }\n` +
        '\t}\n' +
        '}\n',
    );
    const json = JSON.parse((await topo.exec('gw', ['nft', '-j', 'list', 'chain', 'ip', 'kube-ovn', 'prerouting'])).stdout) as {
      nftables: Array<{ chain?: { type: string; hook: string; prio: number; policy: string } }>;
    };
    const chain = json.nftables.find((o) => o.chain)?.chain;
    expect(chain).toMatchObject({ type: 'nat', hook: 'prerouting', prio: -150, policy: 'accept' });
  });

  it('spreads 30 TCP connections from ext over both backends, each reached', async () => {
    const seen = await connections(30);
    expect(seen).toHaveLength(30);
    expect(seen.every((ip) => ip === ADDR.vpc1 || ip === ADDR.vpc2)).toBe(true);
    // P(one backend never chosen in 30 uniform draws) = 2^-29.
    expect(seen.filter((ip) => ip === ADDR.vpc1).length).toBeGreaterThan(0);
    expect(seen.filter((ip) => ip === ADDR.vpc2).length).toBeGreaterThan(0);
    // The client is not source-NATed on the way in.
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP, PORT, FROM_EXT)).ip).toBe(ADDR.extHost);
  });

  it('re-adding the same rule changes nothing', async () => {
    const before = await kubeOvn();
    const nf = await ownedNetfilter(topo, backend);
    await topo.natgwOk('nft-dnat-map-add', RULE);
    expect(await kubeOvn()).toBe(before);
    expect(await ownedNetfilter(topo, backend)).toBe(nf);
  });

  it('names the chain after the protocol as received (TCP), and a re-add spelled tcp renames it', async () => {
    const upper = chainOf(EIP, 9091, 'TCP');
    const lower = chainOf(EIP, 9091, 'tcp');
    expect(upper).not.toBe(lower);
    const out = await topo.natgwOk('nft-dnat-map-add', `${EIP},9091,TCP,${ADDR.vpc2}:${BACKEND_PORT}`);
    expect(out).toContain(`Updated nft share dnat: ${EIP}:9091 (TCP) -> ${ADDR.vpc2}:${BACKEND_PORT} (chain=${upper})\n`);
    let text = (await kubeOvn()) ?? '';
    // The element's key holds the protocol as nft knows it; the chain name keeps the received spelling.
    expect(text).toContain(`${EIP} . tcp . 9091 : goto ${upper}`);
    expect(text).toContain(`chain ${upper} {\n\t\tmeta l4proto tcp dnat ip to numgen random mod 1 map { 0 : ${ADDR.vpc2} . ${BACKEND_PORT} }\n\t}`);
    expect(await backendOf(9091)).toBe(ADDR.vpc2);

    // Same identity (protocols compare case-insensitively), new spelling: one element, one chain.
    const again = await topo.natgwOk('nft-dnat-map-add', `${EIP},9091,tcp,${ADDR.vpc2}:${BACKEND_PORT}`);
    expect(again).toContain(`(chain=${lower})`);
    text = (await kubeOvn()) ?? '';
    expect(text).toContain(`${EIP} . tcp . 9091 : goto ${lower}`);
    expect(text).not.toContain(upper);
    expect(text.match(/ \. 9091 : /g)).toHaveLength(1);
    expect(await backendOf(9091)).toBe(ADDR.vpc2);

    const del = await topo.natgwOk('nft-dnat-map-del', `${EIP},9091,TCP`);
    expect(del).toBe(`nft-dnat-map-del ${EIP},9091,TCP\nDeleted nft share dnat: ${EIP}:9091 (TCP)\n`);
    text = (await kubeOvn()) ?? '';
    expect(text).not.toContain('9091');
    expect(text).not.toContain(lower);
  });

  it('an update keeps an established flow to the removed backend while new connections go to the remaining one', async () => {
    // Open long-lived flows until one lands on vpc2 (each does with probability 1/2).
    let toVpc2: LongFlow | undefined;
    for (let i = 0; i < 30 && !toVpc2; i++) {
      const f = await startLongFlow(topo, 'ext', EIP, PORT, FROM_EXT);
      flows.push(f);
      if (f.peer.endsWith(` local=${ADDR.vpc2}:${BACKEND_PORT}`)) toVpc2 = f;
    }
    expect(toVpc2, 'a long flow that reached vpc2').toBeDefined();
    const flow = toVpc2 as LongFlow;
    expect(await flow.check()).toBe(true);

    const rule = `${EIP},${PORT},tcp,${ADDR.vpc1}:${BACKEND_PORT}`;
    const out = await topo.natgwOk('nft-dnat-map-add', rule);
    expect(out).toContain(`Updated nft share dnat: ${EIP}:${PORT} (tcp) -> ${ADDR.vpc1}:${BACKEND_PORT} (chain=${CHAIN})\n`);
    expect(await kubeOvn()).toContain(`chain ${CHAIN} {\n\t\tmeta l4proto tcp dnat ip to numgen random mod 1 map { 0 : ${ADDR.vpc1} . ${BACKEND_PORT} }\n\t}`);

    // The established connection keeps its conntrack entry and so its backend.
    expect(await flow.check()).toBe(true);
    const seen = await connections(20);
    expect(new Set(seen)).toEqual(new Set([ADDR.vpc1]));
    expect(await flow.check()).toBe(true);
  });

  it("nft-dnat-map-del flushes the identity's conntrack entries and removes element and chain", async () => {
    await request(topo, 'ext', 'tcp', EIP, PORT, FROM_EXT);
    const identity = ['-p', 'tcp', '--orig-dst', EIP, '--orig-port-dst', String(PORT)];
    expect(await conntrackCount(topo, identity)).toBeGreaterThan(0);
    // Another identity's entries stay.
    await topo.natgwOk('nft-dnat-map-add', `${EIP},9092,tcp,${ADDR.vpc1}:${BACKEND_PORT}`);
    await request(topo, 'ext', 'tcp', EIP, 9092, FROM_EXT);
    const other = ['-p', 'tcp', '--orig-dst', EIP, '--orig-port-dst', '9092'];
    const otherBefore = await conntrackCount(topo, other);
    expect(otherBefore).toBeGreaterThan(0);

    const out = await topo.natgwOk('nft-dnat-map-del', `${EIP},${PORT},tcp`);
    expect(out).toBe(`nft-dnat-map-del ${EIP},${PORT},tcp\nDeleted nft share dnat: ${EIP}:${PORT} (tcp)\n`);
    // The flows' next segments may create fresh (un-NATed) entries; none may remain NATed to a backend.
    const natted = async (): Promise<number> => {
      const r = await topo.exec('gw', ['conntrack', '-L', ...identity], { reject: false });
      return r.stdout.split('\n').filter((l) => l.includes(`src=${ADDR.vpc1} `) || l.includes(`src=${ADDR.vpc2} `)).length;
    };
    expect(await natted()).toBe(0);
    expect(await conntrackCount(topo, other)).toBeGreaterThanOrEqual(otherBefore);

    const text = (await kubeOvn()) ?? '';
    expect(text).not.toContain(`. ${PORT} :`);
    expect(text).not.toContain(CHAIN);
    expect(text).toContain(`${EIP} . tcp . 9092 : goto ${chainOf(EIP, 9092, 'tcp')}`);
    expect(await tryRequest(topo, 'ext', 'tcp', EIP, PORT, { ...FROM_EXT, timeoutMs: 1000 })).toBeNull();
    expect(await backendOf(9092)).toBe(ADDR.vpc1);

    // Absent is success.
    await topo.natgwOk('nft-dnat-map-del', `${EIP},${PORT},tcp`);
    await topo.natgwOk('nft-dnat-map-del', `${EIP},9092,tcp`);
    await waitFor(async () => !((await kubeOvn()) ?? '').includes('dnat-'), { what: 'every identity chain gone', timeoutMs: 5000 });
  });

  // Validation comes before any backend (test/netns/injection.test.ts refuses 471 cases on each).
  it.runIf(isOneBackend(backend))('rejects every invalid rule with the SPEC message on stdout, status 1, changing nothing', async () => {
    await topo.natgwOk('nft-dnat-map-add', RULE);
    const before = await kubeOvn();
    const nf = await ownedNetfilter(topo, backend);
    const good = `${EIP},9093,tcp,${ADDR.vpc1}:${BACKEND_PORT}`;
    const cases: Array<[string, string, string]> = [
      ['nft-dnat-map-add', `${EIP},${PORT},tcp`, `Error: invalid nft-dnat-map rule: ${EIP},${PORT},tcp`],
      ['nft-dnat-map-add', `${EIP},,tcp,${ADDR.vpc1}:81`, `Error: invalid nft-dnat-map rule: ${EIP},,tcp,${ADDR.vpc1}:81`],
      ['nft-dnat-map-add', `,${PORT},tcp,${ADDR.vpc1}:81`, `Error: invalid nft-dnat-map rule: ,${PORT},tcp,${ADDR.vpc1}:81`],
      ['nft-dnat-map-add', `172.20.0.300,${PORT},tcp,${ADDR.vpc1}:81`, 'Error: invalid eip in nft-dnat-map rule: 172.20.0.300'],
      ['nft-dnat-map-add', `${EIP}/32,${PORT},tcp,${ADDR.vpc1}:81`, `Error: invalid eip in nft-dnat-map rule: ${EIP}/32`],
      ['nft-dnat-map-add', `${EIP},0,tcp,${ADDR.vpc1}:81`, 'Error: invalid external port in nft-dnat-map rule: 0'],
      ['nft-dnat-map-add', `${EIP},65536,tcp,${ADDR.vpc1}:81`, 'Error: invalid external port in nft-dnat-map rule: 65536'],
      ['nft-dnat-map-add', `${EIP},http,tcp,${ADDR.vpc1}:81`, 'Error: invalid external port in nft-dnat-map rule: http'],
      ['nft-dnat-map-add', `${EIP},${PORT},sctp,${ADDR.vpc1}:81`, 'Error: invalid protocol in nft-dnat-map rule: sctp'],
      ['nft-dnat-map-add', `${EIP},${PORT},Tcp,${ADDR.vpc1}:81`, 'Error: invalid protocol in nft-dnat-map rule: Tcp'],
      ['nft-dnat-map-add', `${EIP},${PORT},tcp,`, `Error: no backends specified in rule: ${EIP},${PORT},tcp,`],
      ['nft-dnat-map-add', `${EIP},${PORT},tcp,@`, `Error: no backends specified in rule: ${EIP},${PORT},tcp,@`],
      ['nft-dnat-map-add', `${EIP},${PORT},tcp,10.0.1.300:81`, 'Error: invalid backend ip in nft-dnat-map rule: 10.0.1.300'],
      ['nft-dnat-map-add', `${EIP},${PORT},tcp,${ADDR.vpc1}:81@vpc2:81`, 'Error: invalid backend ip in nft-dnat-map rule: vpc2'],
      ['nft-dnat-map-add', `${EIP},${PORT},tcp,${ADDR.vpc1}:0`, 'Error: invalid backend port in nft-dnat-map rule: 0'],
      ['nft-dnat-map-add', `${EIP},${PORT},tcp,${ADDR.vpc1}:65536`, 'Error: invalid backend port in nft-dnat-map rule: 65536'],
      ['nft-dnat-map-add', `${EIP},${PORT},tcp,${ADDR.vpc1}:81@${ADDR.vpc2}:x`, 'Error: invalid backend port in nft-dnat-map rule: x'],
      ['nft-dnat-map-del', `${EIP},${PORT}`, `Error: invalid nft-dnat-map rule: ${EIP},${PORT}`],
      ['nft-dnat-map-del', `300.1.1.1,${PORT},tcp`, 'Error: invalid eip in nft-dnat-map rule: 300.1.1.1'],
      ['nft-dnat-map-del', `${EIP},99999,tcp`, 'Error: invalid external port in nft-dnat-map rule: 99999'],
      ['nft-dnat-map-del', `${EIP},${PORT},icmp`, 'Error: invalid protocol in nft-dnat-map rule: icmp'],
    ];
    for (const [cmd, rule, message] of cases) {
      // A valid rule first: the bad one after it must keep it from being applied too.
      const r = await topo.natgw(cmd, good, rule);
      expect(r.stderr, `${cmd} ${rule}`).toBe('');
      expect(r.exitCode, `${cmd} ${rule}`).toBe(1);
      expect(r.stdout, `${cmd} ${rule}`).toBe(`${cmd} ${good} ${rule}\n${message}\n`);
    }
    expect(await kubeOvn()).toBe(before);
    expect(await ownedNetfilter(topo, backend)).toBe(nf);
    expect(await backendOf()).toMatch(/^10\.0\.1\.[67]$/);
  });
});
