import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { ADDR, createTopology, type ExecResult, REPO_ROOT, type Topology } from '../helpers/netns.js';
import { parsePeer, request, type ServerHandle, startServer } from '../helpers/traffic.js';

/**
 * Kube-OVN's LoadBalancer-service pod (`bash /kube-ovn/lb-svc.sh …`, image/lb-svc.sh) on the
 * real kernel, for every backend. gw is the LB-service pod: eth0 in the VPC, where the
 * service's address (sub2, behind rtr: the pod's default gateway) is; net1 outside, where a
 * remote client (beyond the upstream gateway, so that only table 100 routes the replies)
 * connects to eip:port.
 */
const SHIM = join(REPO_ROOT, 'image', 'lb-svc.sh');
const EIP = '172.20.0.10';
const CLIENT = '198.51.100.7';
const PORT = 80;
const BACKEND_PORT = 8080;
const EIP_RULE = `${EIP}/24,${ADDR.extGateway}`;
const DNAT_RULE = `${EIP},${PORT},tcp,${ADDR.sub2},${BACKEND_PORT},${ADDR.rtr}`;
const DEL_RULE = `${EIP},${PORT},tcp,${ADDR.sub2},${BACKEND_PORT}`;

interface NftElems {
  readonly name: string;
  readonly elem?: readonly unknown[];
}

describe.each(BACKENDS)('lb-svc.sh on $name', (backend: BackendCase) => {
  let topo: Topology;
  const servers: ServerHandle[] = [];

  const lb = (...argv: string[]): Promise<ExecResult> => topo.exec('gw', ['bash', SHIM, ...argv], { env: topo.natgwEnv(), reject: false, timeoutMs: 45_000 });

  /** A command that must succeed: status 0, empty stderr, its command line first. */
  const lbOk = async (...argv: string[]): Promise<string> => {
    const r = await lb(...argv);
    expect({ status: r.exitCode, stderr: r.stderr }).toEqual({ status: 0, stderr: '' });
    expect(r.stdout.split('\n')[0]).toBe(`${argv[0]} ${argv.slice(1).join(' ')}`);
    return r.stdout;
  };

  /** A listing in gw; an absent table 100 lists nothing. */
  const gw = async (...argv: string[]): Promise<string> => (await topo.exec('gw', argv, { reject: false })).stdout;

  /** natgw's NAT objects: the nat table (iptables) or natgw's LB-service table (nftables). */
  const netfilter = async (): Promise<string> => {
    if (backend.iptablesVariant) return topo.iptablesSave('nat', backend.iptablesVariant);
    const r = await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'natgw_lbsvc'], { reject: false });
    return r.stdout;
  };

  /** Everything the commands touch, as comparable text. */
  const snapshot = async (): Promise<string> =>
    [
      await netfilter(),
      await gw('ip', '-4', 'rule', 'show'),
      await gw('ip', '-4', 'route', 'show', 'table', '100'),
      (await gw('ip', '-4', '-o', 'addr', 'show', 'dev', 'net1')).replace(/\s+valid_lft.*$/gm, ''),
      (await gw('ip', '-o', 'link', 'show', 'dev', 'net1')).replace(/ state .*$/m, ''),
    ].join('\n--\n');

  /** How often each NAT object is in the kernel. */
  const counts = async (): Promise<{ dnat: number; masq: number }> => {
    if (backend.iptablesVariant) {
      const text = await netfilter();
      return {
        dnat: text.split('\n').filter((l) => l.includes('-j DNAT')).length,
        masq: text.split('\n').filter((l) => l.includes('-j MASQUERADE')).length,
      };
    }
    const r = await topo.exec('gw', ['nft', '-j', 'list', 'table', 'ip', 'natgw_lbsvc']);
    const items = (JSON.parse(r.stdout) as { nftables: Array<{ map?: NftElems; set?: NftElems }> }).nftables;
    return {
      dnat: items.find((o) => o.map?.name === 'lb_dnat')?.map?.elem?.length ?? 0,
      masq: items.find((o) => o.set?.name === 'lb_masq')?.set?.elem?.length ?? 0,
    };
  };

  const connect = () => request(topo, 'ext', 'tcp', EIP, PORT, { localAddress: CLIENT });

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env);
    // The remote client: an address beyond the upstream gateway, which gw's main table cannot reach.
    await topo.exec('ext', ['ip', 'addr', 'add', `${CLIENT}/32`, 'dev', 'e0']);
    const s = startServer(topo, 'sub2', 'tcp', BACKEND_PORT);
    servers.push(s);
    await s.ready;
  });
  afterAll(async () => {
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  });

  it('answers an unknown or missing command with the usage, status 1', async () => {
    for (const argv of [['frobnicate', 'x'], [], ['']]) {
      const r = await lb(...argv);
      expect(r.exitCode).toBe(1);
      expect(r.stderr).toBe('');
      expect(r.stdout).toMatch(/^Usage: lb-svc\.sh \[init\|eip-add\|dnat-add\|dnat-del\] \.\.\.\n$/);
    }
  });

  it('init: net1 up with ARP off, an ip rule from net1 and from eth0 to table 100; repeatable', async () => {
    expect(await lbOk('init')).toBe('init \n');
    const rules = await gw('ip', '-4', 'rule', 'show');
    expect(rules).toMatch(/iif net1 lookup 100/);
    expect(rules).toMatch(/iif eth0 lookup 100/);
    expect(await gw('ip', 'link', 'show', 'dev', 'net1')).toMatch(/<[^>]*NOARP[^>]*UP[^>]*>/);
    if (!backend.iptablesVariant) {
      // natgw's own table from the start, its base chains at the NAT hooks.
      const table = await netfilter();
      expect(table).toMatch(/chain prerouting \{\n\t\ttype nat hook prerouting priority dstnat; policy accept;/);
      expect(table).toMatch(/chain postrouting \{\n\t\ttype nat hook postrouting priority srcnat; policy accept;/);
    }
    const before = await snapshot();
    await lbOk('init');
    expect(await snapshot()).toBe(before);
    expect(rules.match(/lookup 100/g)).toHaveLength(2);
  });

  it('eip-add: the address on net1, its network and a default route in table 100, ARP on; repeatable', async () => {
    await lbOk('eip-add', EIP_RULE);
    expect(await topo.addresses('gw', 'net1', 4)).toEqual([`${EIP}/24`]);
    const t100 = await gw('ip', '-4', 'route', 'show', 'table', '100');
    expect(t100).toContain(`default via ${ADDR.extGateway} dev net1`);
    expect(t100).toContain('172.20.0.0/24 dev net1');
    expect(await gw('ip', 'link', 'show', 'dev', 'net1')).not.toContain('NOARP');
    // The announcement reached the gateway: it knows the EIP's MAC without having asked.
    expect(await topo.exec('ext', ['ip', 'neigh', 'show', EIP]).then((r) => r.stdout)).toMatch(/lladdr/);
    const before = await snapshot();
    await lbOk('eip-add', EIP_RULE);
    // init re-sent after eip-add (the controller re-sends both) leaves the EIP answering ARP.
    await lbOk('init');
    expect(await snapshot()).toBe(before);
  });

  it('dnat-add: a remote client reaches the backend through eip:port, masqueraded, replies via table 100', async () => {
    await lbOk('dnat-add', DNAT_RULE);
    // Only table 100 routes the client's address: gw's main table has no default route.
    expect(await gw('ip', '-4', 'route', 'show', 'default')).toBe('');
    const answer = parsePeer(await connect());
    expect(answer.ip).toBe(ADDR.gw);
    expect(await counts()).toEqual({ dnat: 1, masq: 1 });
    expect(await gw('ip', '-4', 'route', 'show', 'table', '100')).toContain(`${ADDR.sub2} via ${ADDR.rtr} dev eth0`);
    // One backend only: nothing of natgw's in the other.
    if (backend.iptablesVariant) expect((await topo.exec('gw', ['nft', 'list', 'table', 'ip', 'natgw_lbsvc'], { reject: false })).exitCode).not.toBe(0);
    else expect(await topo.iptablesSave('nat', 'nft')).not.toContain('-j DNAT');
    if (backend.iptablesVariant) {
      // The script's layout, as `iptables-save` prints it.
      const nat = await netfilter();
      expect(nat).toContain(`-A PREROUTING -d ${EIP}/32 -p tcp -m tcp --dport ${PORT} -j DNAT --to-destination ${ADDR.sub2}:${BACKEND_PORT}`);
      expect(nat).toContain(`-A POSTROUTING -d ${ADDR.sub2}/32 -j MASQUERADE`);
    }
  });

  it('repeating every command leaves each object once, and traffic flowing', async () => {
    const before = await snapshot();
    for (const argv of [['dnat-add', DNAT_RULE], ['init'], ['eip-add', EIP_RULE], ['dnat-add', DNAT_RULE, DNAT_RULE]]) await lbOk(...argv);
    expect(await snapshot()).toBe(before);
    expect(await counts()).toEqual({ dnat: 1, masq: 1 });
    expect(parsePeer(await connect()).ip).toBe(ADDR.gw);
    if (!backend.iptablesVariant) {
      // Someone empties natgw's chains: the next init (or any command) puts them back.
      await topo.exec('gw', ['nft', 'flush', 'chain', 'ip', 'natgw_lbsvc', 'prerouting']);
      await lbOk('init');
      expect(await snapshot()).toBe(before);
      expect(parsePeer(await connect()).ip).toBe(ADDR.gw);
    }
  });

  it('a bad rule among good ones: errors on stdout, status 1, nothing applied', async () => {
    const before = await snapshot();
    const other = `${EIP},81,udp,${ADDR.vpc1},53,${ADDR.rtr}`;
    const r = await lb('dnat-add', other, `${EIP},99999,tcp,${ADDR.vpc1},80,${ADDR.rtr}`, 'x,y');
    expect(r.exitCode).toBe(1);
    expect(r.stderr).toBe('');
    expect(r.stdout.split('\n')).toEqual([
      `dnat-add ${other} ${EIP},99999,tcp,${ADDR.vpc1},80,${ADDR.rtr} x,y`,
      `Error: invalid port in dnat-add rule '${EIP},99999,tcp,${ADDR.vpc1},80,${ADDR.rtr}': '99999' is not a port from 1 to 65535`,
      "Error: invalid dnat-add rule 'x,y': expected eip,port,protocol,internalIp,internalPort,defaultGateway",
      '',
    ]);
    const eip = await lb('eip-add', `${EIP}/24,10.9.9.9`);
    expect(eip.exitCode).toBe(1);
    expect(eip.stdout).toContain("Error: invalid gateway in eip-add rule '172.20.0.10/24,10.9.9.9': '10.9.9.9' must be another address inside the EIP network");
    expect(await snapshot()).toBe(before);
  });

  it('a route the kernel refuses: the tool status and its reason on stderr, nothing applied', async () => {
    const before = await snapshot();
    // A default gateway that no interface reaches: the kernel refuses its route.
    const r = await lb('dnat-add', `${EIP},82,tcp,${ADDR.vpc2},80,192.0.2.1`);
    expect(r.exitCode).not.toBe(0);
    expect(r.stdout).toBe(`dnat-add ${EIP},82,tcp,${ADDR.vpc2},80,192.0.2.1\n`);
    expect(r.stderr).toMatch(/^Error: ip -batch - refused dnat-add routes: .+\n$/);
    expect(await snapshot()).toBe(before);
  });

  it('dnat-del removes the DNAT, its MASQUERADE and route; traffic is then refused; repeatable', async () => {
    await lbOk('dnat-del', DEL_RULE);
    // Nothing forwards eip:port any more: gw's own stack refuses it. (Its refusal reaches only an
    // on-link client: gw's own packets are routed by the main table, which has no way to the remote one.)
    await expect(request(topo, 'ext', 'tcp', EIP, PORT, { localAddress: ADDR.extHost })).rejects.toThrow(/ECONNREFUSED/);
    await expect(connect()).rejects.toThrow(/timeout/);
    expect(await counts()).toEqual({ dnat: 0, masq: 0 });
    expect(await gw('ip', '-4', 'route', 'show', 'table', '100')).not.toContain(ADDR.sub2);
    const after = await snapshot();
    await lbOk('dnat-del', DEL_RULE);
    expect(await snapshot()).toBe(after);
  });

  it('a re-added identity with another target replaces it; a target still in use keeps its MASQUERADE', async () => {
    await lbOk('dnat-add', DNAT_RULE, `${EIP},443,tcp,${ADDR.sub2},${BACKEND_PORT},${ADDR.rtr}`);
    // The Service's target port changed: the same (eip, protocol, port), a new backend.
    await lbOk('dnat-add', `${EIP},${PORT},tcp,${ADDR.vpc1},${BACKEND_PORT},${ADDR.rtr}`);
    const text = await netfilter();
    if (backend.iptablesVariant) {
      expect(text.split('\n').filter((l) => l.includes('-j DNAT'))).toHaveLength(2);
      expect(text).toContain(`--dport ${PORT} -j DNAT --to-destination ${ADDR.vpc1}:${BACKEND_PORT}`);
      expect(text).toContain(`-A POSTROUTING -d ${ADDR.sub2}/32 -j MASQUERADE`);
      expect(text).toContain(`-A POSTROUTING -d ${ADDR.vpc1}/32 -j MASQUERADE`);
    } else {
      expect(text).toContain(`${EIP} . tcp . ${PORT} : ${ADDR.vpc1} . ${BACKEND_PORT}`);
      expect(text).toContain(`${EIP} . tcp . 443 : ${ADDR.sub2} . ${BACKEND_PORT}`);
    }
    // The old target's delete finds nothing of the new one's.
    await lbOk('dnat-del', DEL_RULE);
    expect(await netfilter()).toContain(ADDR.vpc1);
    for (const rule of [`${EIP},${PORT},tcp,${ADDR.vpc1},${BACKEND_PORT}`, `${EIP},443,tcp,${ADDR.sub2},${BACKEND_PORT}`]) await lbOk('dnat-del', rule);
    expect(await counts()).toEqual({ dnat: 0, masq: 0 });
  });
  it('UDP the same way: a datagram to eip:port reaches the backend and its answer returns', async () => {
    const s = startServer(topo, 'sub2', 'udp', 5353);
    servers.push(s);
    await s.ready;
    const rule = `${EIP},53,UDP,${ADDR.sub2},5353,${ADDR.rtr}`;
    await lbOk('dnat-add', rule);
    expect(parsePeer(await request(topo, 'ext', 'udp', EIP, 53, { localAddress: CLIENT })).ip).toBe(ADDR.gw);
    await lbOk('dnat-del', `${EIP},53,udp,${ADDR.sub2},5353`);
    expect(await counts()).toEqual({ dnat: 0, masq: 0 });
  });

  it.runIf(backend.iptablesVariant !== undefined)('adopts what the script left: its duplicate rules become one', async () => {
    const iptables = `iptables-${backend.iptablesVariant}`;
    // What the script runs for a dnat-add, twice (its checks grep for substrings and can miss).
    for (let i = 0; i < 2; i++) {
      await topo.exec('gw', [
        iptables,
        '-t',
        'nat',
        '-A',
        'PREROUTING',
        '-p',
        'tcp',
        '-d',
        EIP,
        '--dport',
        String(PORT),
        '-j',
        'DNAT',
        '--to-destination',
        `${ADDR.sub2}:${BACKEND_PORT}`,
      ]);
      await topo.exec('gw', [iptables, '-t', 'nat', '-I', 'POSTROUTING', '-d', ADDR.sub2, '-j', 'MASQUERADE']);
    }
    expect(await counts()).toEqual({ dnat: 2, masq: 2 });
    await lbOk('dnat-add', DNAT_RULE);
    expect(await counts()).toEqual({ dnat: 1, masq: 1 });
    expect(parsePeer(await connect()).ip).toBe(ADDR.gw);
    await lbOk('dnat-del', DEL_RULE);
    expect(await counts()).toEqual({ dnat: 0, masq: 0 });
  });
});
