/**
 * The shim's three paths (SPEC §4.1) give byte-identical output and status: forwarded to a
 * running daemon (through nc where it is installed; shim-nc.test.ts compares the two
 * clients), forwarded to a daemon it autostarted (NATGW_AUTOSTART=true, none running),
 * and run in-process (no daemon, autostart off). Concurrent autostarts start one daemon.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, REPO_ROOT, type ExecResult, type Topology } from '../helpers/netns.js';
import { waitFor } from '../helpers/poll.js';
import { api, socketOf, startDaemon, stopDaemon, type Daemon } from './daemon-util.js';
import { settleLogs } from './shim-util.js';

const EIP = '172.20.0.10';
const EIP2 = '172.20.0.11';

/** Every kind of answer: success, idempotent repeat, conflict, validation error, help, unknown; ends where it began. */
const SEQUENCE: readonly (readonly string[])[] = [
  ['init'],
  ['eip-add', `${EIP}/24`],
  ['dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`],
  ['dnat-add', `${EIP},8080,TCP,${ADDR.vpc1},80`],
  ['dnat-add', `${EIP},8080,tcp,${ADDR.vpc2},80`],
  ['dnat-add', `${EIP},http,tcp,${ADDR.vpc1},80`],
  ['dnat-add', `${EIP},8081,udp,${ADDR.vpc1},53`, `${EIP},8082,tcp,${ADDR.vpc2},80`],
  ['snat-add', `${EIP},${ADDR.vpcCidr}`],
  ['snat-add', `${EIP},10.0.1.77/24,--random-fully`],
  ['floating-ip-add', `${EIP2},${ADDR.vpc2}`],
  ['floating-ip-add', `${EIP2},${ADDR.vpc1}`],
  ['nft-dnat-map-add', `${EIP},9000,tcp,${ADDR.vpc1}:80@${ADDR.vpc2}:80`],
  ['nft-dnat-map-add', `${EIP},9000,tcp`],
  ['subnet-route-add', `${ADDR.sub2Cidr},${ADDR.rtr}`],
  ['subnet-route-add', 'not-a-cidr'],
  ['get-iptables-version'],
  ['help'],
  ['frobnicate', 'x'],
  [''],
  ['nft-dnat-map-del', `${EIP},9000,tcp`],
  ['subnet-route-del', ADDR.sub2Cidr],
  ['subnet-route-del', ADDR.sub2Cidr],
  ['floating-ip-del', EIP2],
  ['snat-del', `${EIP},${ADDR.vpcCidr}`],
  ['dnat-del', `${EIP},8080,tcp`, `${EIP},8081,udp`, `${EIP},8082,tcp`],
  ['eip-del', `${EIP}/24`],
  ['eip-del', `${EIP}/24`],
];

type Outputs = { argv: string; exitCode: number; stdout: string; stderr: string }[];

async function runSequence(topo: Topology): Promise<Outputs> {
  const out: Outputs = [];
  for (const [cmd = '', ...rules] of SEQUENCE) {
    const r: ExecResult = await topo.natgw(cmd, ...rules);
    out.push({ argv: [cmd, ...rules].join(' '), exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr });
  }
  return out;
}

function isAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}

/** The pid of the daemon answering on the socket, if any. */
async function daemonPid(topo: Topology): Promise<number | undefined> {
  const r = await api(socketOf(topo), 'GET', '/healthz', undefined, {}, 1000).catch(() => undefined);
  return r?.status === 200 ? (r.body.pid as number) : undefined;
}

/** Stop an autostarted daemon by its own pid (this test caused it to start). */
async function stopAutostarted(topo: Topology): Promise<void> {
  const pid = await daemonPid(topo);
  if (pid === undefined) return;
  process.kill(pid, 'SIGTERM');
  await waitFor(async () => !isAlive(pid), { what: `autostarted daemon ${pid} to exit`, timeoutMs: 10_000 });
}

describe('the shim on every path', () => {
  let topo: Topology;
  let daemon: Daemon | undefined;

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, { GATEWAY_V4: ADDR.extGateway });
    // One init first, so that every path starts from the same initialised gateway.
    await topo.natgwOk('init');
  });
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await stopAutostarted(topo).catch(() => undefined);
    await topo?.cleanup();
  });

  it('prints byte-identical output with the daemon running, autostarted and absent', async () => {
    // In-process: no daemon, autostart off.
    expect(await daemonPid(topo)).toBeUndefined();
    const inProcess = await runSequence(topo);
    expect(await daemonPid(topo)).toBeUndefined();

    // Forwarded to a running daemon.
    daemon = await startDaemon(topo);
    const forwarded = await runSequence(topo);
    await settleLogs(socketOf(topo), daemon);
    // Through nc (/v1/legacy/raw) where it is installed, else through Node.js (/v1/legacy).
    const requests = daemon
      .logs()
      .split('\n')
      .filter((l) => l.includes('"path":"/v1/legacy"') || l.includes('"path":"/v1/legacy/raw"')).length;
    expect(requests).toBe(SEQUENCE.filter(([c]) => !['get-iptables-version', 'help'].includes(c ?? '')).length);
    expect(await stopDaemon(daemon)).toBe(0);
    daemon = undefined;

    // Autostarted by the first command, then forwarded to.
    topo.env.NATGW_AUTOSTART = 'true';
    const autostarted = await runSequence(topo);
    delete topo.env.NATGW_AUTOSTART;
    const pid = await daemonPid(topo);
    expect(pid).toBeTypeOf('number');
    // Started as the shim's `serve` starts it: bin/natgw.js serve.
    expect(readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')).toEqual(expect.arrayContaining([join(REPO_ROOT, 'bin', 'natgw.js'), 'serve']));
    await stopAutostarted(topo);

    expect(forwarded).toEqual(inProcess);
    expect(autostarted).toEqual(inProcess);
    // The sequence meant what it says: successes, a conflict, validation errors.
    const at = (argv: string) => inProcess.find((o) => o.argv === argv)!;
    expect(at(`dnat-add ${EIP},8080,tcp,${ADDR.vpc2},80`)).toMatchObject({ exitCode: 1, stderr: '' });
    expect(at(`dnat-add ${EIP},8080,tcp,${ADDR.vpc2},80`).stdout).toContain('already exists');
    expect(at(`eip-add ${EIP}/24`)).toEqual({ argv: `eip-add ${EIP}/24`, exitCode: 0, stdout: `eip-add ${EIP}/24\n`, stderr: '' });
    expect(inProcess.filter((o) => o.exitCode === 0).every((o) => o.stderr === '')).toBe(true);
  }, 240_000);

  it('starts exactly one daemon when several shims autostart at once', async () => {
    expect(await daemonPid(topo)).toBeUndefined();
    topo.env.NATGW_AUTOSTART = 'true';
    const results = await Promise.all(Array.from({ length: 6 }, (_, i) => topo.natgw('dnat-add', `${EIP},${7000 + i},tcp,${ADDR.vpc1},80`)));
    delete topo.env.NATGW_AUTOSTART;
    for (const r of results) expect({ code: r.exitCode, stderr: r.stderr }).toEqual({ code: 0, stderr: '' });
    const pid = await daemonPid(topo);
    expect(pid).toBeTypeOf('number');
    // Started as the shim's `serve` starts it: bin/natgw.js serve.
    expect(readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')).toEqual(expect.arrayContaining([join(REPO_ROOT, 'bin', 'natgw.js'), 'serve']));
    // A shim that lost the race may have started a daemon that is still loading; it must give
    // way to the one serving (the single-daemon guard) rather than serve too.
    const serving = async () => {
      const pids = await topo.exec('gw', ['ip', 'netns', 'pids', topo.ns.gw]).catch(() => undefined);
      return (pids?.stdout ?? '')
        .split('\n')
        .map(Number)
        .filter((p) => p > 0 && isAlive(p))
        .filter((p) => {
          try {
            return readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0').includes('serve');
          } catch {
            return false;
          }
        });
    };
    await waitFor(async () => ((await serving()).length === 1 ? true : undefined), { what: 'one natgw serve process left', timeoutMs: 15_000 });
    expect(await serving()).toEqual([pid]);
    const state = (await api(socketOf(topo), 'GET', '/v1/state')).body.desired;
    expect(state.dnats.filter((d: { port: number }) => d.port >= 7000 && d.port < 7006)).toHaveLength(6);
    await stopAutostarted(topo);
  });
});
