/**
 * The shim's loopback client (src/daemon/shimListener.ts, image/nat-gateway.sh): with the
 * daemon's listener published, `bash nat-gateway.sh` reaches it through bash's own /dev/tcp,
 * starting no process at all, and prints byte for byte what the curl and Node.js paths print.
 * Wherever it cannot be sure the daemon ran the command — no file, a wrong secret either way,
 * a dead port, a short or malformed answer — it falls back to curl, then Node.js, silently.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { waitFor } from '../helpers/poll.js';
import { startDaemon, stopDaemon, socketOf, type Daemon } from './daemon-util.js';
import { EIP, SEQUENCE, requestsVia, pathWith, runSequence, shim, text, type Run } from './shim-util.js';

const shimFile = (topo: Topology) => `${socketOf(topo)}.tcp`;

/** The real sequence, plus a successful init, a command with a large non-ASCII output, and get-iptables-version. */
const TCP_SEQUENCE: readonly (readonly (string | Buffer)[])[] = [
  ...SEQUENCE,
  ['init'],
  // Each argument under the kernel's 128 KiB per argument, as the test's wrapper escapes it.
  ['dnat-add', 'é'.repeat(15_000), `${'€'.repeat(10_000)}\n`, 'ü'.repeat(15_000), ''],
  ['get-iptables-version'],
];
/** Commands natgw answers in-process on every path: they never reach a daemon. */
const IN_PROCESS = new Set(['get-iptables-version']);

const plain = (r: Run) => ({ status: r.status, stdout: text(r.stdout), stderr: text(r.stderr) });

async function waitShimFile(topo: Topology): Promise<string> {
  return waitFor(async () => existsSync(shimFile(topo)) && readFileSync(shimFile(topo), 'utf8'), {
    what: "the daemon's shim file",
    timeoutMs: 10_000,
    intervalMs: 20,
  });
}

describe("the shim's loopback client", () => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  /** A PATH with ip and bash only: a run that succeeds there started neither curl nor Node.js. */
  let bashOnly: string;
  const servers: net.Server[] = [];
  const tcpRequests = (d: Daemon) => requestsVia(socketOf(topo), d, '/v1/legacy', 'shim-tcp');
  const rawRequests = (d: Daemon) => requestsVia(socketOf(topo), d, '/v1/legacy/raw');
  const jsonRequests = (d: Daemon) => requestsVia(socketOf(topo), d, '/v1/legacy');

  beforeAll(async () => {
    bashOnly = pathWith(['ip', 'bash'], 'the loopback client test');
    topo = await createTopology();
    Object.assign(topo.env, { GATEWAY_V4: ADDR.extGateway });
    await topo.natgwOk('init');
    daemon = await startDaemon(topo);
    await waitShimFile(topo);
  });
  afterAll(async () => {
    for (const s of servers) s.close();
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
    if (bashOnly) rmSync(bashOnly, { recursive: true, force: true });
    rmSync('/tmp/natgw-pwned', { force: true });
  });

  it("listens on natgw's own loopback address only and keeps its port and secrets in a root-only file", async () => {
    const line = await waitShimFile(topo);
    expect(line).toMatch(/^\d{1,5} [0-9a-f]{64} [0-9a-f]{64} 127\.78\.71\.87\n$/);
    expect(statSync(shimFile(topo)).mode & 0o777).toBe(0o600);
    const port = line.split(' ')[0]!;
    const listening = (await topo.exec('gw', ['ss', '-Hltn'])).stdout
      .split('\n')
      .map((l) => l.trim().split(/\s+/)[3])
      .filter((local): local is string => local?.endsWith(`:${port}`) === true);
    expect(listening).toEqual([`127.78.71.87:${port}`]);
  });

  it('prints byte for byte what curl and Node.js print, starting neither', async () => {
    const d = daemon!;
    const forwarded = TCP_SEQUENCE.filter(([c]) => !IN_PROCESS.has(String(c))).length;
    const viaTcp = await runSequence(topo, { PATH: bashOnly }, TCP_SEQUENCE);
    expect(await tcpRequests(d)).toBe(forwarded);
    expect(await rawRequests(d)).toBe(0);
    expect(await jsonRequests(d)).toBe(0);

    const viaCurl = await runSequence(topo, { NATGW_SHIM_CLIENT: 'curl' }, TCP_SEQUENCE);
    expect(await rawRequests(d)).toBe(forwarded);
    const viaNode = await runSequence(topo, { NATGW_SHIM_CLIENT: 'node' }, TCP_SEQUENCE);
    expect(await jsonRequests(d)).toBe(forwarded);
    expect(await tcpRequests(d)).toBe(forwarded);

    // get-iptables-version runs in Node.js, which bashOnly lacks: compared on the other paths only.
    const last = TCP_SEQUENCE.length - 1;
    expect(viaTcp.slice(0, last)).toEqual(viaNode.slice(0, last));
    expect(viaCurl).toEqual(viaNode);
    expect(existsSync('/tmp/natgw-pwned')).toBe(false);

    // The sequence meant what it says.
    const at = (i: number) => plain(viaTcp[i]!);
    expect(at(0)).toEqual({ status: 0, stdout: `eip-add ${EIP}/24\n`, stderr: '' });
    expect(at(3).status).toBe(1);
    expect(at(3).stdout).toContain('already exists');
    expect(at(7).stdout.startsWith(`dnat-add a b it's "quoted" $(touch /tmp/natgw-pwned) \`id\`; rm -rf / line1\nline2\n  +&=%25;|*?~\\`)).toBe(true);
    expect(at(13).stdout).toContain('dnat-add 1\ufffd\ufffd,\ufffd\n');
    expect(at(16)).toMatchObject({ status: 1, stderr: 'Error: Expected two interfaces separated by a comma (e.g., net1,net2)\n' });
    expect(at(SEQUENCE.length)).toMatchObject({ status: 0, stderr: '' });
    const large = at(SEQUENCE.length + 1);
    expect(large.status).toBe(1);
    expect(Buffer.byteLength(large.stdout)).toBeGreaterThan(90_000);
    expect(large.stdout).toContain('é'.repeat(15_000));
    expect(plain(viaNode[last]!)).toMatchObject({ status: 0, stderr: '' });
    expect(viaTcp.filter((r) => r.status === 0).every((r) => r.stderr === '')).toBe(true);
  }, 180_000);

  it('falls back to curl when the secret is wrong, the answer unproven or the file gone', async () => {
    const d = daemon!;
    const file = shimFile(topo);
    const original = readFileSync(file, 'utf8');
    const [port, client, server, host] = original.trim().split(' ') as [string, string, string, string];
    const other = (hex: string) => hex.replace(/^./, (c) => (c === '0' ? '1' : '0'));
    // Deleting what is not there: success every time, and nothing changes behind natgw's back.
    const argv = ['snat-del', `${EIP},10.9.9.0/24`];
    const expected = { status: 0, stdout: `snat-del ${EIP},10.9.9.0/24\n`, stderr: '' };
    try {
      const cases = [
        // The daemon refuses the connection: it never runs the command.
        { name: 'wrong client secret', content: `${port} ${other(client)} ${server} ${host}\n`, ranOverTcp: 0 },
        // The daemon runs it, but its answer does not prove it wrote the file: not printed.
        { name: 'unexpected server secret', content: `${port} ${client} ${other(server)} ${host}\n`, ranOverTcp: 1 },
        { name: 'malformed file', content: `${port} $(touch /tmp/natgw-pwned) ${server} ${host}\n`, ranOverTcp: 0 },
        // Only a loopback address is dialled, never a name or an address elsewhere.
        { name: 'host not on loopback', content: `${port} ${client} ${server} 10.0.1.6\n`, ranOverTcp: 0 },
        { name: 'host as text', content: `${port} ${client} ${server} $(touch /tmp/natgw-pwned)\n`, ranOverTcp: 0 },
        // Nothing listens on 127.0.0.1 (a file of an older daemon would name it): no answer, curl.
        { name: 'the old three fields', content: `${port} ${client} ${server}\n`, ranOverTcp: 0 },
        { name: 'no file', content: undefined, ranOverTcp: 0 },
      ];
      for (const c of cases) {
        if (c.content === undefined) rmSync(file);
        else writeFileSync(file, c.content, { mode: 0o600 });
        const tcpBefore = await tcpRequests(d);
        const rawBefore = await rawRequests(d);
        const r = await shim(topo, argv);
        expect(plain(r), c.name).toEqual(expected);
        expect(await tcpRequests(d), c.name).toBe(tcpBefore + c.ranOverTcp);
        expect(await rawRequests(d), c.name).toBe(rawBefore + 1);
      }
      expect(d.logs()).toContain('"why":"wrong secret"');
      expect(existsSync('/tmp/natgw-pwned')).toBe(false);
    } finally {
      writeFileSync(file, original, { mode: 0o600 });
    }
    // And back on the fast path.
    const before = await tcpRequests(d);
    expect(plain(await shim(topo, argv, { PATH: bashOnly }))).toEqual(expected);
    expect(await tcpRequests(d)).toBe(before + 1);
  });

  it('falls back with the daemon gone, and without the listener (NATGW_SHIM_TCP=false)', async () => {
    await stopDaemon(daemon!, 'SIGKILL');
    daemon = undefined;
    // A killed daemon leaves its file behind: the port is dead, so curl, then Node.js in-process.
    expect(existsSync(shimFile(topo))).toBe(true);
    const argv = ['snat-add', `${EIP},${ADDR.vpcCidr}`];
    const gone = await shim(topo, argv);
    const goneNode = await shim(topo, argv, { NATGW_SHIM_CLIENT: 'node' });
    expect(gone).toEqual(goneNode);
    expect(plain(gone)).toEqual({ status: 0, stdout: `snat-add ${EIP},${ADDR.vpcCidr}\n`, stderr: '' });
    // Neither curl nor node to fall back to: nothing answered.
    expect((await shim(topo, argv, { PATH: bashOnly })).status).toBe(127);

    // A daemon without the listener removes the stale file and never writes one.
    daemon = await startDaemon(topo, { NATGW_SHIM_TCP: 'false' });
    await waitFor(async () => !existsSync(shimFile(topo)), { what: 'the stale shim file to be removed', timeoutMs: 10_000, intervalMs: 20 });
    const rawBefore = await rawRequests(daemon);
    const off = await shim(topo, ['snat-del', `${EIP},${ADDR.vpcCidr}`]);
    expect(plain(off)).toEqual({ status: 0, stdout: `snat-del ${EIP},${ADDR.vpcCidr}\n`, stderr: '' });
    expect(await rawRequests(daemon)).toBe(rawBefore + 1);
    expect(await tcpRequests(daemon)).toBe(0);
    expect(existsSync(shimFile(topo))).toBe(false);

    // Stopped cleanly, a daemon with the listener takes its file with it.
    await stopDaemon(daemon);
    daemon = await startDaemon(topo);
    await waitShimFile(topo);
    expect(await stopDaemon(daemon)).toBe(0);
    daemon = undefined;
    expect(existsSync(shimFile(topo))).toBe(false);
  }, 120_000);

  /**
   * Stand-ins on the test's own loopback for the protocol's edges. The shim runs outside gw
   * with neither curl nor node on PATH: an answer it does not print ends in `exec node`, 127.
   */
  describe('against stand-in listeners', () => {
    const CLIENT = 'c'.repeat(64);
    const SERVER = '5'.repeat(64);

    async function standIn(answer: (req: Buffer) => Buffer | undefined): Promise<{ dir: string; seen: Buffer[] }> {
      const seen: Buffer[] = [];
      const server = net.createServer((conn) => {
        const chunks: Buffer[] = [];
        conn.on('data', (c: Buffer) => {
          chunks.push(c);
          const req = Buffer.concat(chunks);
          const nl = req.indexOf(0x0a);
          if (nl < 0) return;
          const n = Number(/ (\d+)$/.exec(req.subarray(0, nl).toString('latin1'))?.[1]);
          let nuls = 0;
          for (const b of req.subarray(nl + 1)) if (b === 0) nuls++;
          if (nuls < n) return;
          seen.push(req);
          const a = answer(req);
          if (a) conn.end(a);
          else conn.destroy();
        });
        conn.on('error', () => undefined);
      });
      servers.push(server);
      await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
      const dir = mkdtempSync(join(tmpdir(), 'natgw-standin-'));
      writeFileSync(join(dir, 'natgw.sock.tcp'), `${(server.address() as net.AddressInfo).port} ${CLIENT} ${SERVER}\n`, { mode: 0o600 });
      return { dir, seen };
    }

    const answer = (status: number, stdout: Buffer, stderr: Buffer, enc = 'raw', secret = SERVER) =>
      Buffer.concat([Buffer.from(`natgw-shim/1 ${secret} ${status} ${stdout.length} ${stderr.length} ${enc}\n`), stdout, stderr]);

    const run = (dir: string, argv: readonly (string | Buffer)[]) =>
      shim(topo, argv, { PATH: bashOnly, NATGW_SOCKET: join(dir, 'natgw.sock'), NATGW_ENV_FILE: join(dir, 'none.env') }, 'host');

    it('sends the arguments as exact bytes and prints the answer exactly', async () => {
      const stdout = Buffer.from('no newline at the end: é €', 'utf8');
      const stderr = Buffer.from('Warning: ünïcode\nand a second line without one', 'utf8');
      const { dir, seen } = await standIn(() => answer(3, stdout, stderr));
      const argv = ['dnat-add', '', 'a b\n', Buffer.from([0xff, 0x2c, 0xe2, 0x82]), '$(id) `id` \\x41 %s'];
      const r = await run(dir, argv);
      expect(r).toMatchObject({ status: 3, stdout: stdout.toString('hex'), stderr: stderr.toString('hex') });
      const fields = Buffer.concat(argv.map((a) => Buffer.concat([Buffer.from(a), Buffer.from([0])])));
      expect(seen).toHaveLength(1);
      expect(seen[0]!.toString('hex')).toBe(Buffer.concat([Buffer.from(`natgw-shim/1 ${CLIENT} 5\n`), fields]).toString('hex'));
      rmSync(dir, { recursive: true, force: true });
    });

    it('prints output holding NUL bytes (escaped) and large output exactly', async () => {
      const withNul = Buffer.from([0x61, 0x00, 0x5c, 0x0a, 0xc3, 0xa9, 0x00]);
      const esc = (b: Buffer) =>
        Buffer.from(
          [...b].map((c) => (c > 0x20 && c < 0x7f && c !== 0x5c ? String.fromCharCode(c) : `\\x${c.toString(16).padStart(2, '0')}`)).join(''),
          'latin1',
        );
      const nul = await standIn(() => answer(0, esc(withNul), esc(Buffer.from('Warning: \0x')), 'esc'));
      expect(await run(nul.dir, ['snat-add', 'x'])).toMatchObject({
        status: 0,
        stdout: withNul.toString('hex'),
        stderr: Buffer.from('Warning: \0x').toString('hex'),
      });

      const big = Buffer.from(`${'ab€\n'.repeat(300_000)}tail`, 'utf8');
      const large = await standIn(() => answer(1, big, Buffer.alloc(0)));
      const r = await run(large.dir, ['dnat-add', 'x']);
      expect(r.status).toBe(1);
      expect(r.stderr).toBe('');
      expect(Buffer.from(r.stdout, 'hex').equals(big)).toBe(true);
      for (const d of [nul.dir, large.dir]) rmSync(d, { recursive: true, force: true });
    });

    it('prints nothing of an answer it cannot trust', async () => {
      const out = Buffer.from('should not show\n');
      const answers: Record<string, (req: Buffer) => Buffer | undefined> = {
        'wrong server secret': () => answer(0, out, Buffer.alloc(0), 'raw', '6'.repeat(64)),
        'short answer': () => answer(0, Buffer.concat([out, out]), Buffer.alloc(0)).subarray(0, 80),
        'no answer': () => undefined,
        'not natgw': () => Buffer.from('HTTP/1.1 200 OK\r\n\r\nshould not show\n'),
        'unknown encoding': () => answer(0, out, Buffer.alloc(0), 'b64'),
        'endless first line': () => Buffer.from(`natgw-shim/1 ${SERVER} 0 16 0 raw${' '.repeat(1_000_000)}\nshould not show\n`),
      };
      for (const [name, a] of Object.entries(answers)) {
        const { dir, seen } = await standIn(a);
        const r = await run(dir, ['snat-add', 'x']);
        expect(seen, name).toHaveLength(1);
        expect(r.status, name).toBe(127);
        expect(r.stdout, name).toBe('');
        expect(text(r.stderr), name).not.toContain('should not show');
        rmSync(dir, { recursive: true, force: true });
      }
    });
  });
});
