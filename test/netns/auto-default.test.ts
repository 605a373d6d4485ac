/**
 * The drop-in default (SPEC §4.3): with GATEWAY_NETFILTER_MODE=auto and no evidence in the
 * namespace, natgw chooses iptables, so the unmodified Kube-OVN stack (its e2e suite, operators'
 * `iptables-save -t nat`) sees the script's layout; a gateway where natgw already owns its nft
 * table stays on nftables.
 */
import { readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { parsePeer, request, startEchoServer, type ServerHandle } from '../helpers/traffic.js';

const EIP = '172.20.0.10';
const FROM_EXT = { localAddress: ADDR.extHost } as const;

describe('GATEWAY_NETFILTER_MODE=auto', () => {
  let topo: Topology | undefined;
  let server: ServerHandle | undefined;
  afterEach(async () => {
    await server?.stop().catch(() => undefined);
    await topo?.cleanup();
    topo = undefined;
    server = undefined;
  });

  const record = async (t: Topology): Promise<unknown> => JSON.parse(await readFile(join(t.stateDir, 'backend.json'), 'utf8'));
  const nftTable = async (t: Topology): Promise<number> => (await t.exec('gw', ['nft', 'list', 'table', 'ip', 'natgw'], { reject: false })).exitCode;

  it('with no evidence chooses iptables: the script layout in iptables-save, no nft table, real DNAT traffic', async () => {
    const t = (topo = await createTopology());
    delete t.env.GATEWAY_NETFILTER_MODE;
    delete t.env.NATGW_IPTABLES_VARIANT;
    server = startEchoServer(t, 'vpc1', 80);
    await server.ready;
    await t.natgwOk('init');
    await t.natgwOk('eip-add', `${EIP}/24`);
    await t.natgwOk('dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`);

    // The variant is the script's probe's answer in this namespace.
    const probe = await t.exec('gw', ['iptables-legacy', '-t', 'nat', '-S', 'INPUT', '1'], { reject: false });
    const variant = probe.exitCode === 0 ? 'legacy' : 'nft';
    expect(await record(t)).toEqual({ kind: 'iptables', variant });
    expect(await t.iptablesSave('nat', variant)).toContain(`-A SHARED_DNAT -d ${EIP}/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination ${ADDR.vpc1}:80`);
    expect(await nftTable(t)).not.toBe(0);
    expect(parsePeer(await request(t, 'ext', 'tcp', EIP, 8080, FROM_EXT)).ip).toBe(ADDR.extHost);
  });

  it('keeps nftables where natgw already owns its nft table, even with its files lost', async () => {
    const t = (topo = await createTopology());
    t.env.GATEWAY_NETFILTER_MODE = 'nftables';
    await t.natgwOk('init');
    await t.natgwOk('eip-add', `${EIP}/24`);
    await t.natgwOk('dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`);
    expect(await nftTable(t)).toBe(0);

    // A new container: the state dir is gone, the namespace (and natgw's nft table) is not.
    for (const f of ['state.json', 'state.journal', 'backend.json']) await rm(join(t.stateDir, f), { force: true });
    t.env.GATEWAY_NETFILTER_MODE = 'auto';
    await t.natgwOk('dnat-add', `${EIP},8081,tcp,${ADDR.vpc1},80`);
    expect(await record(t)).toEqual({ kind: 'nftables' });
    const owned = (await t.exec('gw', ['nft', 'list', 'table', 'ip', 'natgw'])).stdout;
    expect(owned).toContain(`${EIP} . tcp . 8080 : ${ADDR.vpc1} . 80`);
    expect(owned).toContain(`${EIP} . tcp . 8081 : ${ADDR.vpc1} . 80`);
  });
});
