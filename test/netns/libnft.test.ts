/**
 * The daemon's nftables changes through its libnftables helper (NATGW_LIBNFTABLES=auto, the
 * default): a command is one transaction logged as run through libnftables, and its NAT carries
 * real traffic; a refused change names the error the `nft` tool names; a helper that dies costs no
 * change (the next ones run the tool) and is started again; `off` runs the tool and no helper.
 */
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { SystemNftClient } from '../../src/dataplane/netfilter/nft/client.js';
import { LibnftClient } from '../../src/dataplane/netfilter/nft/libnft.js';
import { ExecError, SystemExecutor } from '../../src/system/exec.js';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { waitFor } from '../helpers/poll.js';
import { childrenOf } from '../helpers/procs.js';
import { parsePeer, request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitForLog, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';
const FROM_EXT = { localAddress: ADDR.extHost } as const;

/** The daemon's libnftables helpers: its python3 children. */
const helpersOf = (pid: number): number[] =>
  childrenOf(pid, (argv) => argv.some((a) => a.endsWith('python3')) && argv.some((a) => a.includes('from nftables import Nftables')));

/** The tool runs a stretch of the daemon's log records: [command, via]. */
function runs(logText: string): [string, string][] {
  const out: [string, string][] = [];
  for (const line of logText.split('\n')) {
    if (!line.startsWith('{')) continue;
    const j = JSON.parse(line) as { msg?: string; cmd?: string; via?: string };
    if (j.msg === 'exec' && j.cmd?.startsWith('nft')) out.push([j.cmd, j.via ?? 'tool']);
  }
  return out;
}

/**
 * The distinct ways nft ran in a stretch of the log. A command's log lines may trail its answer,
 * so a stretch may hold the line of the command before it too: each way counts once.
 */
const ways = (logText: string): string[] => [...new Set(runs(logText).map(([c, via]) => `${c} via ${via}`))];

describe('nftables through libnftables', () => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;
  const servers: ServerHandle[] = [];

  const legacy = async (command: string, ...rules: string[]) => ok(await api(sock, 'POST', '/v1/legacy', { command, rules }), command).body;
  const dnat = async (port: number) => {
    const r = await api(sock, 'PUT', `/v1/dnats/${EIP},${port},tcp`, { internalIp: ADDR.vpc1, internalPort: 80 });
    expect(r.status, r.text).toBe(201);
  };
  const element = async (port: number) =>
    (await topo.exec('gw', ['nft', 'list', 'map', 'ip', 'natgw', 'port_dnat'])).stdout.includes(`${EIP} . tcp . ${port} : ${ADDR.vpc1} . 80`);

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, { GATEWAY_NETFILTER_MODE: 'nftables', GATEWAY_V4: ADDR.extGateway, NATGW_RESYNC_PERIOD: '1h', NATGW_LOG_LEVEL: 'debug' });
    sock = socketOf(topo);
    servers.push(startServer(topo, 'vpc1', 'tcp', 80));
    await Promise.all(servers.map((s) => s.ready));
  });
  afterEach(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    daemon = undefined;
  });
  afterAll(async () => {
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  });

  it('a command is one transaction through the helper, and its DNAT carries traffic', async () => {
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    await waitForLog(daemon, 'nftables through libnftables', 10_000);
    expect(helpersOf(daemon.pid)).toHaveLength(1);
    await legacy('init');
    await legacy('eip-add', `${EIP}/24`);
    const from = daemon.logs().length;
    await dnat(8080);
    await waitFor(async () => runs(daemon!.logs().slice(from)).length > 0 || undefined, { what: 'the DNAT logged' });
    expect(ways(daemon.logs().slice(from))).toEqual(['nft -f - via libnftables']);
    expect(await element(8080)).toBe(true);
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP, 8080, FROM_EXT)).ip).toBe(ADDR.extHost);
  });

  it("a helper killed mid-life costs no change: the next ones run the tool, then a new helper's", async () => {
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    await waitForLog(daemon, 'nftables through libnftables', 10_000);
    const [first] = helpersOf(daemon.pid);
    expect(first).toBeTypeOf('number');
    process.kill(first as number, 'SIGKILL');
    await waitFor(async () => !helpersOf(daemon!.pid).includes(first as number), { what: 'the helper gone' });
    let from = daemon.logs().length;
    await dnat(8081);
    expect(await element(8081)).toBe(true);
    await waitFor(async () => runs(daemon!.logs().slice(from)).some(([c]) => c === 'nft -f -') || undefined, { what: 'the DNAT logged' });
    expect(runs(daemon.logs().slice(from)).filter(([, via]) => via === 'libnftables')).toEqual([]);
    // Started again once a change finds the last start a while ago (10 s).
    await waitFor(
      async () => {
        await dnat(9000 + Math.floor(Math.random() * 1000));
        return daemon!.logs().includes('libnftables helper started again') || undefined;
      },
      { what: 'a new helper', timeoutMs: 25_000, intervalMs: 1000 },
    );
    expect(helpersOf(daemon.pid)).toHaveLength(1);
    from = daemon.logs().length;
    await dnat(8082);
    expect(await element(8082)).toBe(true);
    // The stretch may also hold the line of the loop's last change, run by the tool while the helper started.
    await waitFor(async () => ways(daemon!.logs().slice(from)).includes('nft -f - via libnftables') || undefined, {
      what: 'the DNAT run through the new helper',
    });
    expect(parsePeer(await request(topo, 'ext', 'tcp', EIP, 8082, FROM_EXT)).ip).toBe(ADDR.extHost);
  }, 60_000);

  it('a refused script names the error the nft tool names', async () => {
    // A syntax error: refused while parsed, before anything reaches any kernel (this is the test's own namespace).
    const script = 'add table ip natgw_refused\nadd chain ip natgw_refused c { type nat hook prerouting priority bogus; }\n';
    const exec = new SystemExecutor();
    const lib = new LibnftClient(exec, pino({ level: 'silent' }), 10_000);
    try {
      expect(await lib.ready(), 'the helper starts (python3-nftables installed by scripts/setup.sh)').toBe(true);
      const viaLib = await lib.run(script).then(
        () => null,
        (e: unknown) => e as ExecError,
      );
      const viaTool = await new SystemNftClient(exec).run(script).then(
        () => null,
        (e: unknown) => e as ExecError,
      );
      expect(viaLib).toBeInstanceOf(ExecError);
      expect(viaTool).toBeInstanceOf(ExecError);
      // The error itself, word for word; the tool prefixes its place in the script (/dev/stdin:2:52-65:),
      // and libnftables 1.0.6 quotes the script's first line under it where the tool quotes the refused one.
      const errorOf = (e: ExecError | null) => e?.stderr.split('\n')[0]?.replace(/^\/dev\/stdin:\d+:\d+-\d+: /, '');
      expect(errorOf(viaLib)).toBe(errorOf(viaTool));
      expect(errorOf(viaLib)).toMatch(/^Error: invalid priority/);
    } finally {
      lib.close();
    }
  });

  it('NATGW_LIBNFTABLES=off: no helper, every change through the nft tool', async () => {
    daemon = await startDaemon(topo, { NATGW_LIBNFTABLES: 'off' });
    await waitReady(topo, daemon);
    const from = daemon.logs().length;
    await dnat(8083);
    expect(await element(8083)).toBe(true);
    await waitFor(async () => runs(daemon!.logs().slice(from)).length > 0 || undefined, { what: 'the DNAT logged' });
    expect(ways(daemon.logs().slice(from))).toEqual(['nft -f - via tool']);
    expect(helpersOf(daemon.pid)).toEqual([]);
  });
});
