import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, isOneBackend, ownedLinks, ownedNetfilter, type BackendCase } from '../helpers/backends.js';
import { conntrackCount, parsePeer, ping, request, startServer, tryRequest, type ServerHandle } from '../helpers/traffic.js';
import { waitFor } from '../helpers/poll.js';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * The script's command set on the real kernel, for every backend: real TCP, UDP and ICMP
 * through a gateway namespace that natgw programs through its command line.
 */
const EIP = '172.20.0.10';
const EIP2 = '172.20.0.11';
const EIP3 = '172.20.0.12';

describe.each(BACKENDS)('legacy commands on $name', (backend: BackendCase) => {
  let topo: Topology;
  const servers: ServerHandle[] = [];

  const serve = async (ns: 'vpc1' | 'vpc2' | 'sub2' | 'ext', proto: 'tcp' | 'udp', port: number) => {
    const s = startServer(topo, ns, proto, port);
    servers.push(s);
    await s.ready;
    return s;
  };

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env, { GATEWAY_V4: ADDR.extGateway });
  });
  afterAll(async () => {
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  });

  it('refuses guarded commands before init, on stderr, changing nothing', async () => {
    for (const [cmd, rule] of [
      ['dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`],
      ['eip-add', `${EIP}/24`],
      ['snat-add', `${EIP},${ADDR.vpcCidr}`],
      ['subnet-route-del', ADDR.sub2Cidr],
    ] as const) {
      const r = await topo.natgw(cmd, rule);
      expect(r.exitCode).toBe(1);
      expect(r.stderr).toBe('nat gateway not initialized\n');
      expect(r.stdout).toBe(`${cmd} ${rule}\n`);
    }
    expect(await topo.addresses('gw', 'net1', 4)).toEqual([]);
  });

  it('init prints the interfaces, builds the skeleton and is safe to repeat', async () => {
    const out = await topo.natgwOk('init');
    expect(out).toContain('using VPC interface: eth0\n');
    expect(out).toContain('using External interface: net1\n');
    expect(out).toContain('INFO: no IPv4 address on net1');
    const first = await ownedNetfilter(topo, backend);
    if (backend.iptablesVariant) {
      const nat = await topo.iptablesSave('nat', backend.iptablesVariant);
      for (const line of [
        '-A PREROUTING -j DNAT_FILTER',
        '-A POSTROUTING -j SNAT_FILTER',
        '-A DNAT_FILTER -j EXCLUSIVE_DNAT\n-A DNAT_FILTER -j SHARED_DNAT',
        '-A SNAT_FILTER -j EXCLUSIVE_SNAT\n-A SNAT_FILTER -j SHARED_SNAT\n-A SNAT_FILTER -j HAIRPIN_SNAT',
      ])
        expect(nat).toContain(line);
      expect(await topo.iptablesSave('mangle', backend.iptablesVariant)).toContain('-A VPC_MARK -i eth0 -j MARK --set-xmark 0x1/0x1');
    } else {
      expect(first).toContain('table ip natgw');
    }
    await topo.natgwOk('init');
    expect(await ownedNetfilter(topo, backend)).toBe(first);
    const env = await topo.exec('gw', ['cat', topo.natgwEnv().NATGW_ENV_FILE ?? '']);
    expect(env.stdout).toContain('VPC_INTERFACE=eth0');
    expect(env.stdout).toContain('EXTERNAL_INTERFACE=net1');
  });

  it('get-iptables-version prints a version above 1.6.2 with an empty stderr', async () => {
    const out = await topo.natgwOk('get-iptables-version');
    const [header, version] = out.split('\n');
    expect(header).toBe('get-iptables-version ');
    const m = /v(\d+)\.(\d+)\.(\d+)/.exec(version ?? '');
    expect(m).not.toBeNull();
    expect(Number(m?.[1]) * 10000 + Number(m?.[2]) * 100 + Number(m?.[3])).toBeGreaterThan(10602);
  });

  it('eip-add puts the address up with a hairpin rule and the default route', async () => {
    await topo.natgwOk('eip-add', `${EIP}/24`);
    await topo.natgwOk('eip-add', `${EIP2}/24`, `${EIP3}/24`);
    expect(await topo.addresses('gw', 'net1', 4)).toEqual(expect.arrayContaining([`${EIP}/24`, `${EIP2}/24`, `${EIP3}/24`]));
    const route = await topo.exec('gw', ['ip', 'route', 'show', 'default']);
    expect(route.stdout).toContain(`default via ${ADDR.extGateway} dev net1 onlink`);
    if (backend.iptablesVariant) {
      expect(await topo.iptablesSave('nat', backend.iptablesVariant)).toContain(
        `-A HAIRPIN_SNAT -o eth0 -m mark --mark 0x1/0x1 -m conntrack --ctstate DNAT --ctorigdst ${EIP} -j SNAT --to-source ${EIP} --random-fully`,
      );
    }
  });

  it('SNAT: an external server sees the EIP as source (TCP and ICMP)', async () => {
    await serve('ext', 'tcp', 7001);
    await topo.natgwOk('snat-add', `${EIP},${ADDR.vpcCidr}`);
    const seen = parsePeer(await request(topo, 'vpc1', 'tcp', ADDR.extHost, 7001));
    expect(seen.ip).toBe(EIP);
    expect(await ping(topo, 'vpc1', ADDR.extHost)).toBe(true);
    // ICMP really was translated: the external side has no route back to 10.0.1.0/24.
    const noRoute = await topo.exec('ext', ['ip', 'route', 'get', ADDR.vpc1], { reject: false });
    expect(noRoute.stdout).not.toContain('via');
  });

  it('DNAT: an external client reaches a VPC server through EIP:port (TCP and UDP)', async () => {
    await serve('vpc1', 'tcp', 80);
    await serve('vpc1', 'udp', 53);
    await topo.natgwOk('dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`, `${EIP},5353,UDP,${ADDR.vpc1},53`);
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    expect(parsePeer(await request(topo, 'ext', 'udp', EIP, 5353, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    if (backend.iptablesVariant) {
      const nat = await topo.iptablesSave('nat', backend.iptablesVariant);
      expect(nat).toContain(`-A SHARED_DNAT -d ${EIP}/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination ${ADDR.vpc1}:80`);
      expect(nat).toContain(`-A SHARED_DNAT -d ${EIP}/32 -p udp -m udp --dport 5353 -j DNAT --to-destination ${ADDR.vpc1}:53`);
    }
  });

  it('hairpin: a VPC client reaching another VPC host through the EIP is seen as the EIP', async () => {
    const seen = parsePeer(await request(topo, 'vpc2', 'tcp', EIP, 8080));
    expect(seen.ip).toBe(EIP);
  });

  it('floating IP works in both directions', async () => {
    await serve('vpc2', 'tcp', 9000);
    await topo.natgwOk('floating-ip-add', `${EIP2},${ADDR.vpc2}`);
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP2, 9000, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    expect(parsePeer(await request(topo, 'vpc2', 'tcp', ADDR.extHost, 7001)).ip).toBe(EIP2);
    if (backend.iptablesVariant) {
      const nat = await topo.iptablesSave('nat', backend.iptablesVariant);
      expect(nat).toContain(`-A EXCLUSIVE_DNAT -d ${EIP2}/32 -j DNAT --to-destination ${ADDR.vpc2}`);
      expect(nat).toContain(`-A EXCLUSIVE_SNAT -s ${ADDR.vpc2}/32 -j SNAT --to-source ${EIP2}`);
    }
  });

  it('conflicts are refused on stdout with status 1 and change nothing', async () => {
    const before = await ownedNetfilter(topo, backend);
    const d = await topo.natgw('dnat-add', `${EIP},8080,TCP,${ADDR.vpc2},81`);
    expect(d.exitCode).toBe(1);
    expect(d.stderr).toBe('');
    expect(d.stdout).toContain(
      `dnat (${EIP}, 8080, tcp) already exists: -A SHARED_DNAT -d ${EIP}/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination ${ADDR.vpc1}:80, but expected ${ADDR.vpc2}:81`,
    );
    const f = await topo.natgw('floating-ip-add', `${EIP2},${ADDR.vpc1}`);
    expect(f.exitCode).toBe(1);
    expect(f.stdout).toContain(
      `eip ${EIP2} already bindTo rule: -A EXCLUSIVE_DNAT -d ${EIP2}/32 -j DNAT --to-destination ${ADDR.vpc2}, but expected internalIp ${ADDR.vpc1}`,
    );
    // A conflict in the second rule keeps the first from being applied too.
    const both = await topo.natgw('dnat-add', `${EIP},8090,tcp,${ADDR.vpc1},80`, `${EIP},8080,tcp,${ADDR.vpc2},80`);
    expect(both.exitCode).toBe(1);
    expect(await ownedNetfilter(topo, backend)).toBe(before);
  });

  it('every add run twice leaves the kernel unchanged; protocols compare case-insensitively', async () => {
    const before = await ownedNetfilter(topo, backend);
    const links = await ownedLinks(topo);
    await topo.natgwOk('eip-add', `${EIP}/24`);
    await topo.natgwOk('snat-add', `${EIP},10.0.1.99/24`);
    await topo.natgwOk('dnat-add', `${EIP},8080,TCP,${ADDR.vpc1},80`);
    await topo.natgwOk('dnat-add', `${EIP},5353,udp,${ADDR.vpc1},53`);
    await topo.natgwOk('floating-ip-add', `${EIP2},${ADDR.vpc2}`);
    expect(await ownedNetfilter(topo, backend)).toBe(before);
    expect(await ownedLinks(topo)).toBe(links);
  });

  it('subnet routes reach a second VPC subnet behind a router; deleting an absent route succeeds', async () => {
    await serve('sub2', 'tcp', 80);
    await topo.natgwOk('subnet-route-add', `${ADDR.sub2Cidr},${ADDR.rtr}`);
    await topo.natgwOk('dnat-add', `${EIP3},8081,tcp,${ADDR.sub2},80`);
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP3, 8081, { localAddress: ADDR.extHost })).ip).toBe(ADDR.extHost);
    const routes = await topo.exec('gw', ['ip', 'route', 'show', ADDR.sub2Cidr]);
    expect(routes.stdout).toContain(`${ADDR.sub2Cidr} via ${ADDR.rtr} dev eth0`);
    await topo.natgwOk('subnet-route-del', ADDR.sub2Cidr);
    expect((await topo.exec('gw', ['ip', 'route', 'show', ADDR.sub2Cidr])).stdout).toBe('');
    expect(await tryRequest(topo, 'ext', 'tcp', EIP3, 8081, { localAddress: ADDR.extHost, timeoutMs: 1000 })).toBeNull();
    await topo.natgwOk('subnet-route-del', ADDR.sub2Cidr);
    await topo.natgwOk('dnat-del', `${EIP3},8081,tcp`);
  });

  it('dnat-del and floating-ip-del flush the conntrack entries of what they removed', async () => {
    await request(topo, 'ext', 'udp', EIP, 5353, { localAddress: ADDR.extHost });
    await request(topo, 'ext', 'tcp', EIP2, 9000, { localAddress: ADDR.extHost });
    expect(await conntrackCount(topo, ['-p', 'udp', '--orig-dst', EIP, '--orig-port-dst', '5353'])).toBeGreaterThan(0);
    expect(await conntrackCount(topo, ['--orig-dst', EIP2])).toBeGreaterThan(0);
    await topo.natgwOk('dnat-del', `${EIP},5353,udp`);
    expect(await conntrackCount(topo, ['-p', 'udp', '--orig-dst', EIP, '--orig-port-dst', '5353'])).toBe(0);
    await topo.natgwOk('floating-ip-del', EIP2);
    expect(await conntrackCount(topo, ['--orig-dst', EIP2])).toBe(0);
    expect(await tryRequest(topo, 'ext', 'tcp', EIP2, 9000, { localAddress: ADDR.extHost, timeoutMs: 1000 })).toBeNull();
    // Deleting what is absent is success.
    await topo.natgwOk('dnat-del', `${EIP},5353,udp`);
    await topo.natgwOk('floating-ip-del', EIP2);
  });

  it('an idempotent floating-ip-add repairs a missing half', async () => {
    await topo.natgwOk('floating-ip-add', `${EIP2},${ADDR.vpc2}`);
    const v = backend.iptablesVariant;
    if (v) {
      await topo.exec('gw', [`iptables-${v}`, '-t', 'nat', '-D', 'EXCLUSIVE_SNAT', '-s', `${ADDR.vpc2}/32`, '-j', 'SNAT', '--to-source', EIP2]);
      expect(await topo.iptablesSave('nat', v)).not.toContain(`-A EXCLUSIVE_SNAT`);
      await topo.natgwOk('floating-ip-add', `${EIP2},${ADDR.vpc2}`);
      expect(await topo.iptablesSave('nat', v)).toContain(`-A EXCLUSIVE_SNAT -s ${ADDR.vpc2}/32 -j SNAT --to-source ${EIP2}`);
    } else {
      // nftables keeps the SNAT half as an element of fip_snat (internal → EIP): delete it behind natgw's back.
      const snatHalf = async () => (await topo.exec('gw', ['nft', 'list', 'map', 'ip', 'natgw', 'fip_snat'])).stdout;
      expect(await snatHalf()).toContain(`${ADDR.vpc2} : ${EIP2}`);
      await topo.exec('gw', ['nft', 'delete', 'element', 'ip', 'natgw', 'fip_snat', `{ ${ADDR.vpc2} }`]);
      expect(await snatHalf()).not.toContain(`${ADDR.vpc2} : ${EIP2}`);
      await topo.natgwOk('floating-ip-add', `${EIP2},${ADDR.vpc2}`);
      expect(await snatHalf()).toContain(`${ADDR.vpc2} : ${EIP2}`);
    }
    // The repaired half works: vpc2's outbound connection leaves with the FIP as its source.
    expect(parsePeer(await request(topo, 'vpc2', 'tcp', ADDR.extHost, 7001)).ip).toBe(EIP2);
    await topo.natgwOk('floating-ip-del', EIP2);
  });

  it('keeps SNAT rules in descending prefix order', async () => {
    for (const cidr of ['10.0.0.0/16', '10.0.0.0/20', '10.0.1.0/24', `${ADDR.vpc2}/32`]) await topo.natgwOk('snat-add', `${EIP3},${cidr}`);
    if (backend.iptablesVariant) {
      const nat = await topo.iptablesSave('nat', backend.iptablesVariant);
      const order = nat
        .split('\n')
        .filter((l) => l.startsWith('-A SHARED_SNAT') && l.includes(`--to-source ${EIP3}`))
        .map((l) => l.split(' ')[3]);
      expect(order).toEqual([`${ADDR.vpc2}/32`, '10.0.1.0/24', '10.0.0.0/20', '10.0.0.0/16']);
    }
    // The /32 rule wins for vpc2 over the /24 rule of EIP added earlier.
    expect(parsePeer(await request(topo, 'vpc2', 'tcp', ADDR.extHost, 7001)).ip).toBe(EIP3);
    expect(parsePeer(await request(topo, 'vpc1', 'tcp', ADDR.extHost, 7001)).ip).toBe(EIP);
    for (const cidr of ['10.0.0.0/16', '10.0.0.0/20', '10.0.1.0/24', ADDR.vpc2]) await topo.natgwOk('snat-del', `${EIP3},${cidr}`);
    await topo.natgwOk('snat-del', `${EIP3},10.0.0.0/16`);
    expect(parsePeer(await request(topo, 'vpc2', 'tcp', ADDR.extHost, 7001)).ip).toBe(EIP);
  });

  // Validation comes before any backend (test/netns/injection.test.ts refuses 471 cases on each).
  it.runIf(isOneBackend(backend))('rejects malformed rules with one line and status 1, changing nothing', async () => {
    const before = await ownedNetfilter(topo, backend);
    const links = await ownedLinks(topo);
    for (const [cmd, rule] of [
      ['dnat-add', `${EIP},0,tcp,${ADDR.vpc1},80`],
      ['dnat-add', `${EIP},65536,tcp,${ADDR.vpc1},80`],
      ['dnat-add', `${EIP},80,sctp,${ADDR.vpc1},80`],
      ['dnat-add', `${EIP},80,tcp,${ADDR.vpc1}`],
      ['snat-add', `${EIP},10.0.0.0/33`],
      ['snat-add', `${EIP},`],
      ['eip-add', '172.20.0.300/24'],
      ['floating-ip-add', `${EIP},$(reboot)`],
      ['dnat-add', `${EIP},80,tcp,${ADDR.vpc1};iptables,80`],
      ['snat-add', `${EIP},10.0.1.0/24,-j ACCEPT`],
      ['subnet-route-add', `${ADDR.sub2Cidr}`],
    ] as const) {
      const r = await topo.natgw(cmd, `${EIP},8080,tcp,${ADDR.vpc1},80`, rule);
      expect(r.exitCode, `${cmd} ${rule}`).toBe(1);
      expect(r.stderr).toBe('');
      const lines = r.stdout.trimEnd().split('\n');
      expect(lines).toHaveLength(2);
      expect(lines[1]).toMatch(/^Error: invalid /);
    }
    expect(await ownedNetfilter(topo, backend)).toBe(before);
    expect(await ownedLinks(topo)).toBe(links);
  });

  it('eip-del removes the address and its hairpin rule, keeps the default route', async () => {
    await topo.natgwOk('eip-del', `${EIP3}/24`);
    expect(await topo.addresses('gw', 'net1', 4)).not.toContain(`${EIP3}/24`);
    if (backend.iptablesVariant) expect(await topo.iptablesSave('nat', backend.iptablesVariant)).not.toContain(`--ctorigdst ${EIP3} `);
    expect((await topo.exec('gw', ['ip', 'route', 'show', 'default'])).stdout).toContain(`via ${ADDR.extGateway} dev net1`);
    await topo.natgwOk('eip-del', `${EIP3}/24`);
  });

  it('eip-del of the first EIP of a subnet leaves the others; several in one command work', async () => {
    const [a, b, c] = ['172.20.0.20', '172.20.0.21', '172.20.0.22'];
    await topo.natgwOk('eip-add', `${a}/24`, `${b}/24`, `${c}/24`);
    await topo.natgwOk('eip-del', `${a}/24`);
    expect(await topo.addresses('gw', 'net1', 4)).toEqual(expect.arrayContaining([`${b}/24`, `${c}/24`]));
    await topo.natgwOk('eip-del', `${b}/24`, `${c}/24`);
    const left = await topo.addresses('gw', 'net1', 4);
    for (const x of [a, b, c]) expect(left).not.toContain(`${x}/24`);
    expect(left).toContain(`${EIP}/24`);
  });

  it('unknown commands print the help on stdout with status 1; help exits 0', async () => {
    const u = await topo.natgw('frobnicate');
    expect(u.exitCode).toBe(1);
    expect(u.stderr).toBe('');
    expect(u.stdout.startsWith('Unknown command: frobnicate\n\nUsage:')).toBe(true);
    const h = await topo.natgw('help');
    expect(h.exitCode).toBe(0);
    expect(h.stdout.startsWith('Usage:')).toBe(true);
  });

  it('init completes a half-initialised ruleset', async () => {
    if (backend.iptablesVariant) {
      const v = backend.iptablesVariant;
      await topo.exec('gw', [`iptables-${v}`, '-t', 'nat', '-D', 'SNAT_FILTER', '-j', 'SHARED_SNAT']);
    } else {
      await topo.exec('gw', ['nft', 'delete', 'table', 'ip', 'natgw']);
    }
    const r = await topo.natgw('dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`);
    expect(r.stderr).toBe('nat gateway not initialized\n');
    await topo.natgwOk('init');
    await waitFor(async () => (await tryRequest(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost, timeoutMs: 1000 })) ?? undefined, {
      what: 'DNAT working again after init repaired the skeleton',
      timeoutMs: 5000,
    });
  });
});

describe.each(BACKENDS)('late interfaces and redo order on $name', (backend: BackendCase) => {
  it('init waits for a net1 created after it starts', async () => {
    const topo = await createTopology({ lateExternal: true });
    try {
      Object.assign(topo.env, backend.env);
      let settled = false;
      const init = topo.natgw('init').finally(() => (settled = true));
      // The scenario: Multus attaches net1 late. Attach it only once init says (in its log) that it waits for it.
      const log = join(topo.stateDir, 'natgw.log');
      await waitFor(async () => existsSync(log) && readFileSync(log, 'utf8').includes('waiting for interfaces'), {
        what: 'init to report that it waits for net1',
        timeoutMs: 20_000,
        intervalMs: 20,
      });
      expect(settled, 'init still running while net1 is missing').toBe(false);
      await topo.attachExternal();
      const r = await init;
      expect(r.stderr).toBe('');
      expect(r.exitCode).toBe(0);
      expect(r.stdout).toContain('INFO: waiting for interface(s) net1');
      await topo.natgwOk('eip-add', `${EIP}/24`);
    } finally {
      await topo.cleanup();
    }
  });

  it('init fails clearly when net1 never comes', async () => {
    const topo = await createTopology({ lateExternal: true });
    try {
      Object.assign(topo.env, backend.env, { NATGW_INTERFACE_WAIT_TIMEOUT: '500ms' });
      const r = await topo.natgw('init');
      expect(r.exitCode).toBe(1);
      expect(r.stderr).toBe("Error: External interface 'net1' not found\n");
    } finally {
      await topo.cleanup();
    }
  });

  it('a redo in shuffled order gives the same end state as the canonical order', async () => {
    const commands: [string, string][] = [
      ['eip-add', `${EIP}/24`],
      ['eip-add', `${EIP2}/24`],
      ['subnet-route-add', `${ADDR.sub2Cidr},${ADDR.rtr}`],
      ['snat-add', `${EIP},10.0.0.0/16`],
      ['snat-add', `${EIP2},10.0.1.0/24`],
      ['snat-add', `${EIP},${ADDR.vpc1}`],
      ['snat-add', `${EIP2},10.0.0.0/20`],
      ['dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`],
      ['dnat-add', `${EIP},5353,udp,${ADDR.vpc1},53`],
      ['dnat-add', `${EIP2},8081,tcp,${ADDR.sub2},80`],
      ['floating-ip-add', `${EIP3},${ADDR.vpc2}`],
    ];
    const run = async (order: [string, string][]) => {
      const topo = await createTopology();
      try {
        Object.assign(topo.env, backend.env, { GATEWAY_V4: ADDR.extGateway });
        await topo.natgwOk('init');
        for (const [c, r] of order) await topo.natgwOk(c, r);
        return { nf: await ownedNetfilter(topo, backend), links: await ownedLinks(topo) };
      } finally {
        await topo.cleanup();
      }
    };
    const canonical = await run(commands);
    // A fixed permutation keeps the test repeatable; SNAT and DNAT identities are interleaved.
    const shuffled = [10, 3, 7, 0, 5, 9, 1, 4, 8, 2, 6].map((i) => commands[i] as [string, string]);
    const redo = await run(shuffled);
    expect(redo.nf).toBe(canonical.nf);
    expect(redo.links).toBe(canonical.links);
  });
});
