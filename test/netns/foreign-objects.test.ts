/**
 * natgw touches only what it owns (SPEC §5): someone else's nft table, someone else's chain
 * and set inside the shared `table ip kube-ovn`, and someone else's iptables chains (with jumps
 * from the built-in chains) in nat, mangle and filter of both iptables variants come through a
 * full command sequence — init, every add, share DNAT, a backend switch, every delete — exactly
 * as they were.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, normalizeIptablesSave, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { parsePeer, request, startServer, type ServerHandle } from '../helpers/traffic.js';

const EIP = '172.20.0.10';
const EIP2 = '172.20.0.11';
const FROM_EXT = { localAddress: ADDR.extHost } as const;
const VARIANTS = ['legacy', 'nft'] as const;
const IPT_TABLES = ['nat', 'mangle', 'filter'] as const;

const NFT_FOREIGN = `table ip foreign {
  set blocked {
    type ipv4_addr
    elements = { 192.0.2.1, 192.0.2.2 }
  }
  chain c {
    type filter hook prerouting priority 0; policy accept;
    counter
  }
  chain d {
    ip saddr @blocked counter drop
  }
}
`;
const KUBE_OVN_FOREIGN = `table ip kube-ovn {
  set their-set {
    type ipv4_addr
    elements = { 198.51.100.7 }
  }
  chain their-chain {
    ip saddr @their-set counter return
  }
}
`;

/** The backend to switch to from `b`: nftables from iptables, iptables-legacy from nftables. */
function switchTarget(b: BackendCase): BackendCase {
  return b.iptablesVariant
    ? { name: 'nftables', env: { GATEWAY_NETFILTER_MODE: 'nftables' } }
    : { name: 'iptables-legacy', env: { GATEWAY_NETFILTER_MODE: 'iptables', NATGW_IPTABLES_VARIANT: 'legacy' }, iptablesVariant: 'legacy' };
}

/** Counters move with traffic; the objects are what must not change. */
const stripCounters = (s: string): string => s.replace(/counter packets \d+ bytes \d+/g, 'counter');

describe.each(BACKENDS)('foreign objects survive natgw starting on $name', (backend: BackendCase) => {
  let topo: Topology;
  const servers: ServerHandle[] = [];

  const run = async (argv: string[]): Promise<void> => {
    await topo.exec('gw', argv);
  };

  /** Everything foreign, as comparable text. */
  const snapshot = async (): Promise<Record<string, string>> => {
    const snap: Record<string, string> = {};
    snap['nft ip foreign'] = stripCounters((await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'foreign'])).stdout);
    snap['nft kube-ovn their-chain'] = stripCounters((await topo.exec('gw', ['nft', 'list', 'chain', 'ip', 'kube-ovn', 'their-chain'])).stdout);
    snap['nft kube-ovn their-set'] = (await topo.exec('gw', ['nft', 'list', 'set', 'ip', 'kube-ovn', 'their-set'])).stdout;
    for (const v of VARIANTS) {
      for (const t of IPT_TABLES) {
        const save = normalizeIptablesSave((await topo.exec('gw', [`iptables-${v}-save`, '-t', t])).stdout);
        snap[`iptables-${v} ${t}`] = save
          .split('\n')
          .filter((l) => l.includes('FOREIGN'))
          .join('\n');
      }
    }
    return snap;
  };

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env, { GATEWAY_V4: ADDR.extGateway });
    servers.push(startServer(topo, 'ext', 'tcp', 7001), startServer(topo, 'vpc1', 'tcp', 80), startServer(topo, 'vpc2', 'tcp', 9000));
    await Promise.all(servers.map((s) => s.ready));

    await topo.exec('gw', ['nft', '-f', '-'], { input: NFT_FOREIGN });
    await topo.exec('gw', ['nft', '-f', '-'], { input: KUBE_OVN_FOREIGN });
    for (const v of VARIANTS) {
      const ipt = `iptables-${v}`;
      const up = v.toUpperCase();
      // nat: a chain with a rule, reached from a built-in chain natgw also jumps from.
      await run([ipt, '-t', 'nat', '-N', `FOREIGN_NAT_${up}`]);
      await run([ipt, '-t', 'nat', '-A', `FOREIGN_NAT_${up}`, '-s', '192.0.2.0/24', '-j', 'RETURN']);
      await run([ipt, '-t', 'nat', '-A', 'PREROUTING', '-j', `FOREIGN_NAT_${up}`]);
      await run([ipt, '-t', 'nat', '-I', 'POSTROUTING', '1', '-d', '192.0.2.9/32', '-j', 'RETURN', '-m', 'comment', '--comment', `FOREIGN_${up}`]);
      // mangle: natgw's VPC_MARK lives here too.
      await run([ipt, '-t', 'mangle', '-N', `FOREIGN_MANGLE_${up}`]);
      await run([ipt, '-t', 'mangle', '-A', `FOREIGN_MANGLE_${up}`, '-s', '192.0.2.0/24', '-j', 'RETURN']);
      await run([ipt, '-t', 'mangle', '-A', 'PREROUTING', '-j', `FOREIGN_MANGLE_${up}`]);
      // filter: a table natgw never uses.
      await run([ipt, '-t', 'filter', '-N', `FOREIGN_FILTER_${up}`]);
      await run([ipt, '-t', 'filter', '-A', `FOREIGN_FILTER_${up}`, '-p', 'tcp', '--dport', '9999', '-j', 'ACCEPT']);
      await run([ipt, '-t', 'filter', '-A', 'FORWARD', '-j', `FOREIGN_FILTER_${up}`]);
    }
  });
  afterAll(async () => {
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  });

  it('a full command sequence, with a backend switch, leaves every foreign object as it was', async () => {
    const before = await snapshot();
    // The snapshot really holds the foreign objects (a broken dump must not compare equal by being empty).
    expect(before['nft ip foreign']).toContain('chain c {');
    expect(before['nft kube-ovn their-chain']).toContain('ip saddr @their-set counter return');
    expect(before['nft kube-ovn their-set']).toContain('198.51.100.7');
    for (const v of VARIANTS) {
      const up = v.toUpperCase();
      expect(before[`iptables-${v} nat`]).toContain(`-A FOREIGN_NAT_${up} -s 192.0.2.0/24 -j RETURN`);
      expect(before[`iptables-${v} nat`]).toContain(`-A PREROUTING -j FOREIGN_NAT_${up}`);
      expect(before[`iptables-${v} nat`]).toContain(`--comment FOREIGN_${up}`);
      expect(before[`iptables-${v} mangle`]).toContain(`-A PREROUTING -j FOREIGN_MANGLE_${up}`);
      expect(before[`iptables-${v} filter`]).toContain(`-A FOREIGN_FILTER_${up} -p tcp -m tcp --dport 9999 -j ACCEPT`);
    }

    await topo.natgwOk('init');
    await topo.natgwOk('eip-add', `${EIP}/24`, `${EIP2}/24`);
    await topo.natgwOk('subnet-route-add', `${ADDR.sub2Cidr},${ADDR.rtr}`);
    await topo.natgwOk('snat-add', `${EIP},${ADDR.vpcCidr}`, `${EIP2},${ADDR.sub2Cidr},--random-fully`);
    await topo.natgwOk('dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`, `${EIP},5353,udp,${ADDR.vpc1},53`);
    await topo.natgwOk('floating-ip-add', `${EIP2},${ADDR.vpc2}`);
    await topo.natgwOk('nft-dnat-map-add', `${EIP},9090,tcp,${ADDR.vpc1}:80@${ADDR.vpc2}:9000`);
    // natgw works next to them: SNAT, DNAT and share DNAT carry traffic.
    expect(parsePeer(await request(topo, 'vpc1', 'tcp', ADDR.extHost, 7001)).ip).toBe(EIP);
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP, 8080, FROM_EXT)).ip).toBe(ADDR.extHost);
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP, 9090, FROM_EXT)).ip).toBe(ADDR.extHost);
    expect(await snapshot()).toEqual(before);

    const target = switchTarget(backend);
    delete topo.env.NATGW_IPTABLES_VARIANT;
    Object.assign(topo.env, target.env);
    await topo.natgwOk('init');
    // The switch completed around the foreign objects: nothing is left pending.
    expect(JSON.parse((await topo.exec('gw', ['cat', `${topo.stateDir}/backend.json`])).stdout)).not.toHaveProperty('pendingCleanup');
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP2, 9000, FROM_EXT)).ip).toBe(ADDR.extHost);
    expect(await snapshot()).toEqual(before);

    await topo.natgwOk('nft-dnat-map-del', `${EIP},9090,tcp`);
    await topo.natgwOk('floating-ip-del', EIP2);
    await topo.natgwOk('dnat-del', `${EIP},8080,tcp`, `${EIP},5353,udp`);
    await topo.natgwOk('snat-del', `${EIP},${ADDR.vpcCidr}`, `${EIP2},${ADDR.sub2Cidr}`);
    await topo.natgwOk('subnet-route-del', ADDR.sub2Cidr);
    // One at a time, secondary address first: deleting the primary of a subnet takes the kernel's
    // secondaries with it where promote_secondaries is off (fresh namespaces), see the report.
    await topo.natgwOk('eip-del', `${EIP2}/24`);
    await topo.natgwOk('eip-del', `${EIP}/24`);
    // The shared table keeps its foreign objects; natgw's own share-DNAT chains are gone.
    const kubeOvn = (await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'kube-ovn'])).stdout;
    expect(kubeOvn).not.toMatch(/dnat-[0-9a-f]{12}/);
    expect(await snapshot()).toEqual(before);
  });
});
