/**
 * The iptables backend puts the raw table's notrack chain first in the run that carries the NAT
 * rules (one `iptables-restore`, each table committed at its own COMMIT). A refusal of that run
 * is told apart by reading raw back, on the real kernel and the real tool behind a fault wrapper:
 * - refused in raw itself (a kernel without the raw table or the CT target; nothing after it
 *   ran): the NAT goes in alone, the command succeeds, one warning; a later full sync tries raw
 *   again and puts it in;
 * - refused after raw committed (the real tool got only the raw table): the command fails with
 *   the tool's error, and the retry puts in the NAT with raw's chain and jump there once.
 * Real TCP through a DNAT proves the NAT in both.
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { makeWrappers } from '../helpers/faults.js';
import { request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';
/** The raw table's part of a first sync's script: `*raw`, the chain, its two rules, the jump, COMMIT. */
const RAW_LINES = 6;

describe.each(BACKENDS.filter((b) => b.iptablesVariant))('the raw table first in the NAT run ($name)', (b: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let faults: ReturnType<typeof makeWrappers>;
  let server: ServerHandle | undefined;
  const variant = b.iptablesVariant as 'legacy' | 'nft';
  const restoreTool = `iptables-${variant}-restore` as const;

  const start = async () => {
    daemon = await startDaemon(topo, { PATH: `${faults.dir}:${process.env.PATH ?? ''}` });
    await waitReady(topo, daemon);
  };
  const legacy = async (command: string, ...rules: string[]) =>
    ok(await api(socketOf(topo), 'POST', '/v1/legacy', { command, rules }), `${command} ${rules.join(' ')}`).body as {
      status: number;
      stdout: string;
      stderr: string;
    };
  const raw = () => topo.iptablesSave('raw', variant);
  const setUp = async () => {
    for (const [command, rule] of [
      ['eip-add', `${EIP}/24`],
      ['dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`],
    ] as const) {
      const r = await legacy(command, rule);
      expect(r.status, `${command}: ${r.stderr}`).toBe(0);
    }
  };
  const dnatPasses = async () => expect(await request(topo, 'ext', 'tcp', EIP, 8080)).toContain('peer=');

  beforeEach(async () => {
    faults = makeWrappers();
    topo = await createTopology();
    Object.assign(topo.env, b.env, { GATEWAY_V4: ADDR.extGateway, NATGW_RESYNC_PERIOD: '1h' });
    server = startServer(topo, 'vpc1', 'tcp', 80);
    await start();
  }, 60_000);

  afterEach(async () => {
    faults?.disarm();
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    daemon = undefined;
    await server?.stop();
    await topo?.cleanup();
    faults?.remove();
  });

  it('refused in raw itself: the NAT goes in alone, one warning; a later full sync puts raw in', async () => {
    // Every run that carries the raw table fails before the tool applies anything.
    faults.arm(restoreTool, 1, 'fail', '--noflush', '^\\*raw$');
    const init = await legacy('init');
    expect(init.status, init.stderr).toBe(0);
    await setUp();
    expect(faults.fired()).toContain(restoreTool);
    expect(await raw()).not.toContain('NATGW_NOTRACK');
    expect(await topo.iptablesSave('nat', variant)).toContain(
      `-A SHARED_DNAT -d ${EIP}/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination ${ADDR.vpc1}:80`,
    );
    await dnatPasses();
    const warnings = (daemon?.logs() ?? '').split('\n').filter((l) => l.includes('iptables raw table refused'));
    expect(warnings).toHaveLength(1);
    expect(JSON.parse(warnings[0] as string)).toMatchObject({ level: 40, err: expect.stringMatching(/refused the raw table transaction: injected fault/) });

    // The kernel "gained the module": a restart's full sync reads back and adds raw's chain alone.
    faults.disarm();
    if (daemon) await stopDaemon(daemon);
    await start();
    const listing = await raw();
    expect(listing).toContain('-A OUTPUT -j NATGW_NOTRACK');
    expect(listing.match(/-A NATGW_NOTRACK /g)).toHaveLength(2);
    await dnatPasses();
  }, 60_000);

  it('refused after raw committed: the command fails whole, and its retry leaves raw once and the NAT in', async () => {
    // The real tool gets the raw table only: raw commits, then the run fails.
    faults.arm(restoreTool, 1, 'half', '--noflush', '^\\*raw$', RAW_LINES);
    const init = await legacy('init');
    expect(init.status).not.toBe(0);
    expect(init.stderr).toMatch(/refused the raw and nat and mangle table transactions: injected fault/);
    expect(faults.fired()).toContain(restoreTool);
    expect(await raw()).toContain('-A OUTPUT -j NATGW_NOTRACK');
    // No warning about raw: it was the NAT that was refused.
    expect(daemon?.logs() ?? '').not.toContain('iptables raw table refused');

    faults.disarm();
    const again = await legacy('init');
    expect(again.status, again.stderr).toBe(0);
    await setUp();
    const listing = await raw();
    expect(listing.match(/-A OUTPUT -j NATGW_NOTRACK/g)).toHaveLength(1);
    expect(listing.match(/-A NATGW_NOTRACK /g)).toHaveLength(2);
    await dnatPasses();
  }, 60_000);
});
