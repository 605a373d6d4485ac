/**
 * The shim's client (SPEC §4.1): with a daemon answering, `bash nat-gateway.sh` reaches it
 * through `nc -U` without starting Node.js, and prints byte for byte what the Node.js path prints
 * (stdout, stderr, exit status) for successes, conflicts, validation errors, unknown commands
 * and arguments no shell should see. Wherever the daemon does not run the command — no daemon,
 * a socket file left by a killed one, a 4xx, a 503, an answer that is not natgw's — the shim
 * falls back to Node.js with nothing of nc's showing.
 */
import { existsSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { startDaemon, stopDaemon, socketOf, type Daemon } from './daemon-util.js';
import { EIP, SEQUENCE, SHORT, requestsVia, pathWith, runSequence, shim, text } from './shim-util.js';

/** The sequence, plus a successful init and a command whose output is large and not ASCII. */
const NC_SEQUENCE: readonly (readonly (string | Buffer)[])[] = [
  ...SEQUENCE,
  ['init'],
  // Each argument under the kernel's 128 KiB per argument, as the test's wrapper escapes it.
  ['dnat-add', 'é'.repeat(15_000), `${'€'.repeat(10_000)}\n`, 'ü'.repeat(15_000), ''],
];

describe("the shim's nc client", () => {
  let topo: Topology;
  const requestsTo = (d: Daemon, path: string) => requestsVia(socketOf(topo), d, path);
  let daemon: Daemon | undefined;
  /** A PATH with ip, bash and nc but no node: a run that succeeds there never started Node.js. */
  let noNode: string;
  const fakes: http.Server[] = [];

  beforeAll(async () => {
    noNode = pathWith(['ip', 'bash', 'nc'], 'the nc client test');
    topo = await createTopology();
    Object.assign(topo.env, { GATEWAY_V4: ADDR.extGateway });
    await topo.natgwOk('init');
    daemon = await startDaemon(topo);
  });
  afterAll(async () => {
    for (const f of fakes) f.close();
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
    if (noNode) rmSync(noNode, { recursive: true, force: true });
    rmSync('/tmp/natgw-pwned', { force: true });
  });

  it('prints byte for byte what the Node.js path prints, without starting Node.js', async () => {
    const d = daemon!;
    const viaNc = await runSequence(topo, { PATH: noNode }, NC_SEQUENCE);
    expect(await requestsTo(d, '/v1/legacy/raw')).toBe(NC_SEQUENCE.length);
    expect(await requestsTo(d, '/v1/legacy')).toBe(0);

    const viaNode = await runSequence(topo, { NATGW_SHIM_CLIENT: 'node' }, NC_SEQUENCE);
    expect(await requestsTo(d, '/v1/legacy')).toBe(NC_SEQUENCE.length);
    expect(await requestsTo(d, '/v1/legacy/raw')).toBe(NC_SEQUENCE.length);

    expect(viaNc).toEqual(viaNode);
    expect(existsSync('/tmp/natgw-pwned')).toBe(false);

    // The sequence meant what it says.
    const at = (i: number) => ({ ...viaNc[i]!, stdout: text(viaNc[i]!.stdout), stderr: text(viaNc[i]!.stderr) });
    expect(at(0)).toMatchObject({ status: 0, stdout: `eip-add ${EIP}/24\n`, stderr: '' });
    expect(at(3)).toMatchObject({ status: 1, stderr: '' });
    expect(at(3).stdout).toContain('already exists');
    expect(at(4).status).toBe(1);
    expect(at(7).stdout.startsWith(`dnat-add a b it's "quoted" $(touch /tmp/natgw-pwned) \`id\`; rm -rf / line1\nline2\n  +&=%25;|*?~\\`)).toBe(true);
    expect(at(9)).toMatchObject({ status: 1, stderr: '' });
    expect(at(9).stdout).toMatch(/^Unknown command: frobnicate\n\n/);
    expect(at(10).stdout).toMatch(/^Unknown command: frob nic"ate\$\(id\)\n\n/);
    expect(at(13).stdout).toContain('dnat-add 1\ufffd\ufffd,\ufffd\n');
    expect(at(16)).toMatchObject({ status: 1, stderr: 'Error: Expected two interfaces separated by a comma (e.g., net1,net2)\n' });
    expect(at(17)).toMatchObject({ status: 1, stderr: 'Error: Interface names cannot be empty\n' });
    expect(at(SEQUENCE.length)).toMatchObject({ status: 0, stderr: '' });
    const large = at(SEQUENCE.length + 1);
    expect(large.status).toBe(1);
    expect(Buffer.byteLength(large.stdout)).toBeGreaterThan(90_000);
    expect(large.stdout).toContain('é'.repeat(15_000));
    expect(viaNc.filter((r) => r.status === 0).every((r) => r.stderr === '')).toBe(true);
    expect(viaNc.some((r) => r.status === 0)).toBe(true);
    expect(viaNc.some((r) => r.status === 1 && r.stderr === '')).toBe(true);
  }, 120_000);

  it('takes the socket from the env file before the environment, parsed and never executed', async () => {
    const d = daemon!;
    const envFile = join(topo.stateDir, 'nat-gateway.env');
    const original = readFileSync(envFile, 'utf8');
    try {
      writeFileSync(envFile, `${original}# NATGW_SOCKET=/nowhere\nNATGW_SOCKET=/nowhere/else\nexport NATGW_SOCKET = "${socketOf(topo)}"  \n`);
      const before = await requestsTo(d, '/v1/legacy/raw');
      const r = await shim(topo, ['snat-del', `${EIP},10.9.9.0/24`], { PATH: noNode, NATGW_SOCKET: '/nowhere/at/all.sock' });
      expect(await requestsTo(d, '/v1/legacy/raw')).toBe(before + 1);
      expect({ status: r.status, stdout: text(r.stdout), stderr: text(r.stderr) }).toEqual({ status: 0, stdout: `snat-del ${EIP},10.9.9.0/24\n`, stderr: '' });
      writeFileSync(envFile, `${original}NATGW_SOCKET='$(touch /tmp/natgw-pwned)' # not a command\n`);
      const fallback = await shim(topo, ['snat-del', `${EIP},10.9.9.0/24`], { PATH: noNode, NATGW_SOCKET: socketOf(topo) });
      // The file's socket does not exist: Node.js is the only way on, and it is not on PATH.
      expect(fallback.status).toBe(127);
      expect(existsSync('/tmp/natgw-pwned')).toBe(false);
      expect(await requestsTo(d, '/v1/legacy/raw')).toBe(before + 1);
    } finally {
      writeFileSync(envFile, original);
    }
  });

  it('falls back to Node.js, silently, when the daemon refuses the request (4xx)', async () => {
    const d = daemon!;
    const rawBefore = await requestsTo(d, '/v1/legacy/raw');
    const jsonBefore = await requestsTo(d, '/v1/legacy');
    // Longer than a rule may be: both endpoints answer 400, and natgw runs the command in-process.
    const huge = `${EIP},${'9'.repeat(70_000)},tcp,${ADDR.vpc1},80`;
    const viaNc = await shim(topo, ['dnat-add', huge]);
    const viaNode = await shim(topo, ['dnat-add', huge], { NATGW_SHIM_CLIENT: 'node' });
    expect(await requestsTo(d, '/v1/legacy/raw')).toBe(rawBefore + 1);
    // Node.js asks once (its first answer is what the forwarding acts on), then runs it itself:
    // once for the nc client's fallback, once for the Node.js client.
    expect(await requestsTo(d, '/v1/legacy')).toBe(jsonBefore + 2);
    expect(viaNc).toEqual(viaNode);
    expect(viaNc.status).toBe(1);
    expect(text(viaNc.stderr)).toBe('');
  });

  it("falls back to Node.js, silently, on a 503 or an answer that is not natgw's", async () => {
    // Stand-ins for a daemon that is shutting down and for something else on the socket. Node.js
    // gets the same answers, gives up on the daemon and runs the command in-process.
    const answers: Record<string, (res: http.ServerResponse) => void> = {
      'shutting-down': (res) =>
        res.writeHead(503, { 'content-type': 'application/json', connection: 'close' }).end('{"error":"shutting-down","message":"natgw is shutting down"}'),
      'not-natgw': (res) => res.writeHead(200, { 'content-type': 'text/plain' }).end('hello\n'),
      'bad-status': (res) => res.writeHead(200, { 'X-Natgw-Status': 'zero', 'X-Natgw-Stderr': '' }).end('dnat-add\n'),
      // A daemon dying mid-answer: fewer bytes than its Content-Length, then the connection gone.
      'cut-short': (res) => {
        res.writeHead(200, { 'X-Natgw-Status': '0', 'X-Natgw-Stderr': '', 'Content-Length': '100' });
        res.write('dnat-add\n', () => res.socket?.destroy());
      },
    };
    for (const [name, answer] of Object.entries(answers)) {
      const sock = join(topo.stateDir, `fake-${name}.sock`);
      const seen: string[] = [];
      const fake = http.createServer((req, res) => {
        seen.push(req.url ?? '');
        req.resume();
        req.on('end', () => answer(res));
      });
      fakes.push(fake);
      await new Promise<void>((r) => fake.listen(sock, r));
      const env = { NATGW_SOCKET: sock };
      // Deleting what is not there: success, and nothing changes behind the real daemon's back.
      const argv = ['snat-del', `${EIP},10.9.9.0/24`];
      const viaNc = await shim(topo, argv, env);
      expect(seen.slice(0, 2), name).toEqual(['/v1/legacy/raw', '/v1/legacy']);
      const viaNode = await shim(topo, argv, { ...env, NATGW_SHIM_CLIENT: 'node' });
      expect(
        seen.filter((u) => u === '/v1/legacy/raw'),
        name,
      ).toHaveLength(1);
      expect(seen.filter((u) => u === '/v1/legacy').length, name).toBeGreaterThan(1);
      expect(viaNc, name).toEqual(viaNode);
      expect(text(viaNc.stderr), name).toBe('');
      expect(viaNc.status, name).toBe(0);
      await new Promise((r) => fake.close(r));
    }
  });

  it('falls back to Node.js with a stopped daemon, its socket file left behind, and with none at all', async () => {
    const d = daemon!;
    await stopDaemon(d, 'SIGKILL');
    daemon = undefined;
    const sock = socketOf(topo);
    expect(statSync(sock).isSocket()).toBe(true);

    expect(SHORT.map((a) => a[0])).toEqual(['eip-add', 'dnat-add', 'dnat-add', 'dnat-add', 'frobnicate', 'init', 'dnat-del', 'eip-del']);
    const stale = await runSequence(topo, {}, SHORT);
    const staleNode = await runSequence(topo, { NATGW_SHIM_CLIENT: 'node' }, SHORT);
    expect(stale).toEqual(staleNode);
    expect(stale.filter((r) => r.status === 0).every((r) => r.stderr === '')).toBe(true);
    expect(stale.some((r) => r.status === 0)).toBe(true);
    // Without node on PATH nothing answers at all: proof that the nc path was not taken.
    expect((await shim(topo, ['eip-add', `${EIP}/24`], { PATH: noNode })).status).toBe(127);

    rmSync(sock);
    const none = await runSequence(topo, {}, SHORT);
    expect(none).toEqual(staleNode);
    expect(existsSync(sock)).toBe(false);
  }, 120_000);
});
