/**
 * QoS against a real kernel: tc HTB + IFB layout, in-place updates, collision-free class
 * ids and handles, precedence, drift repair, adoption after a restart, and a coarse
 * shaping measurement. Three namespaces of our own (unique names, deleted in afterAll):
 *
 *   snd  s0 10.98.0.2/16 ── g0 10.98.0.1/16  gw  net1 10.99.0.1/24 ── r0 10.99.0.2/24  rcv
 *
 * natgw's QosManager runs in gw through an Executor that prefixes `ip netns exec gw`;
 * `net1` plays EXT, so EIP egress rules match the sender's source address on net1.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execa } from 'execa';
import { QosManager } from '../../src/dataplane/qos/manager.js';
import { eipFirstClassId, hex, type EipQos, type GwQos } from '../../src/model/qos.js';
import { addEipQos, addGwQos, delEipQos } from '../../src/state/qosOperations.js';
import { emptyState, type DesiredState } from '../../src/state/state.js';
import { NetnsExecutor } from '../helpers/netnsExecutor.js';

const PREFIX = `ngq${randomBytes(3).toString('hex')}-`;
const NS = { snd: `${PREFIX}snd`, gw: `${PREFIX}gw`, rcv: `${PREFIX}rcv` } as const;
const SENDER = '10.98.0.2';
const RECEIVER = '10.99.0.2';
const EXT = 'net1';

async function inNs(ns: string, argv: string[], reject = true): Promise<{ stdout: string; stderr: string; exitCode: number }> {
  const r = await execa('ip', ['netns', 'exec', ns, ...argv], { reject: false, timeout: 30_000 });
  const out = { stdout: String(r.stdout), stderr: String(r.stderr), exitCode: r.exitCode ?? 1 };
  if (reject && out.exitCode !== 0) throw new Error(`${argv.join(' ')} in ${ns}: exit ${out.exitCode}: ${out.stderr}`);
  return out;
}
const ipIn = (ns: string, args: string[]) => execa('ip', ['-n', ns, ...args], { timeout: 30_000 });
const tcGw = async (args: string[]) => (await inNs(NS.gw, ['tc', ...args])).stdout;

const outLines: string[] = [];
let mgr: QosManager;

beforeAll(async () => {
  for (const ns of Object.values(NS)) await execa('ip', ['netns', 'add', ns]);
  await ipIn(NS.snd, ['link', 'add', 's0', 'type', 'veth', 'peer', 'name', 'g0', 'netns', NS.gw]);
  await ipIn(NS.gw, ['link', 'add', EXT, 'type', 'veth', 'peer', 'name', 'r0', 'netns', NS.rcv]);
  for (const [ns, dev] of [
    [NS.snd, 's0'],
    [NS.gw, 'g0'],
    [NS.gw, EXT],
    [NS.rcv, 'r0'],
    [NS.snd, 'lo'],
    [NS.gw, 'lo'],
    [NS.rcv, 'lo'],
  ] as const) {
    await ipIn(ns, ['link', 'set', dev, 'up']);
  }
  await ipIn(NS.snd, ['addr', 'add', `${SENDER}/16`, 'dev', 's0']);
  await ipIn(NS.gw, ['addr', 'add', '10.98.0.1/16', 'dev', 'g0']);
  await ipIn(NS.gw, ['addr', 'add', '10.99.0.1/24', 'dev', EXT]);
  await ipIn(NS.rcv, ['addr', 'add', `${RECEIVER}/24`, 'dev', 'r0']);
  await ipIn(NS.snd, ['route', 'add', 'default', 'via', '10.98.0.1']);
  await ipIn(NS.rcv, ['route', 'add', 'default', 'via', '10.99.0.1']);
  await inNs(NS.gw, ['sysctl', '-q', '-w', 'net.ipv4.ip_forward=1']);
  mgr = new QosManager(new NetnsExecutor(NS.gw), undefined, (l) => outLines.push(l));
});

afterAll(async () => {
  for (const ns of Object.values(NS)) {
    const pids = await execa('ip', ['netns', 'pids', ns], { reject: false });
    for (const pid of String(pids.stdout)
      .split('\n')
      .filter((p) => /^\d+$/.test(p))) {
      try {
        process.kill(Number(pid), 'SIGKILL');
      } catch {
        // gone already
      }
    }
    await execa('ip', ['netns', 'del', ns], { reject: false });
  }
});

// ---- helpers ------------------------------------------------------------------------

const base = (): DesiredState => emptyState('g0', EXT);
const eip = (direction: 'ingress' | 'egress', ip: string, rate: string, priority = 1, burst = '1'): EipQos => ({ direction, ip, priority, rate, burst });

function withRules(eips: EipQos[], gws: GwQos[] = []): DesiredState {
  let s = base();
  for (const q of eips) s = addEipQos(s, q).state;
  for (const q of gws) s = addGwQos(s, q).state;
  return s;
}

const find = (s: DesiredState, direction: string, ip: string): EipQos => {
  const r = s.eipQos.find((q) => q.direction === direction && q.ip === ip);
  if (!r?.classId || !r.handle) throw new Error(`no allocated rule for ${direction} ${ip}`);
  return r;
};

async function classLine(dev: string, minor: number): Promise<string> {
  return (await tcGw(['class', 'show', 'dev', dev, 'classid', `1:${hex(minor)}`])).trim();
}

async function sentPackets(dev: string, minor: number): Promise<number> {
  const out = await tcGw(['-s', 'class', 'show', 'dev', dev, 'classid', `1:${hex(minor)}`]);
  return Number(/Sent \d+ bytes (\d+) pkt/.exec(out)?.[1] ?? NaN);
}

async function addSenderIp(ip: string): Promise<void> {
  await ipIn(NS.snd, ['addr', 'replace', `${ip}/16`, 'dev', 's0']);
}

async function ping(from: string): Promise<void> {
  await inNs(NS.snd, ['ping', '-c', '3', '-i', '0.2', '-W', '2', '-I', from, RECEIVER]);
}

/** Pairs of addresses in 10.98/16 whose first-choice class ids relate as `pred` says. */
function findPair(pred: (a: number, b: number) => boolean, skip: Set<string> = new Set()): [string, string] {
  const seen: { ip: string; id: number }[] = [];
  for (let i = 10; i < 65000; i++) {
    const ip = `10.98.${i >> 8}.${i & 0xff}`;
    if (skip.has(ip) || (i & 0xff) === 0 || (i & 0xff) === 255) continue;
    const id = eipFirstClassId(ip);
    const other = seen.find((x) => pred(x.id, id));
    if (other) return [other.ip, ip];
    seen.push({ ip, id });
  }
  throw new Error('no pair found');
}

/**
 * A bounded bulk TCP transfer from snd to rcv, measured at the receiver over a fixed
 * window (at most `windowMs`, at most 512 MiB): the sender writes as fast as it can
 * until the receiver hangs up, then resets, so no queue has to drain before we know.
 */
async function measureMbit(from: string, windowMs: number): Promise<number> {
  const port = 20000 + Math.floor(Math.random() * 20000);
  const sink = `
    const net = require('net');
    let bytes = 0, first = 0, done = false;
    const report = (c) => {
      if (done) return; done = true;
      console.log(JSON.stringify({ bytes, ms: Date.now() - first }));
      c.resetAndDestroy(); srv.close(); setTimeout(() => process.exit(0), 100);
    };
    const srv = net.createServer((c) => {
      c.on('data', (d) => {
        if (!first) { first = Date.now(); setTimeout(() => report(c), ${windowMs}); }
        bytes += d.length;
      });
      c.on('error', () => {});
      c.on('close', () => report(c));
    });
    srv.listen(${port}, '${RECEIVER}', () => console.log('ready'));
    setTimeout(() => process.exit(3), ${windowMs} + 20000);`;
  const source = `
    const net = require('net');
    const buf = Buffer.alloc(65536, 120); let sent = 0;
    const s = net.connect({ host: '${RECEIVER}', port: ${port}, localAddress: '${from}' }, () => {
      const pump = () => { while (sent < 512 * 1048576) { sent += buf.length; if (!s.write(buf)) return; } s.end(); };
      s.on('drain', pump); pump();
    });
    const quit = () => { s.resetAndDestroy(); process.exit(0); };
    s.on('error', quit); s.on('close', quit);
    setTimeout(quit, ${windowMs} + 10000);`;
  const rx = spawn('ip', ['netns', 'exec', NS.rcv, process.execPath, '-e', sink], { stdio: ['ignore', 'pipe', 'inherit'] });
  let text = '';
  rx.stdout.setEncoding('utf8');
  const done = new Promise<string>((resolve) => rx.on('close', () => resolve(text)));
  await new Promise<void>((resolve) => rx.stdout.on('data', (d: string) => ((text += d), text.includes('ready') && resolve())));
  await inNs(NS.snd, [process.execPath, '-e', source]);
  const lines = (await done).trim().split('\n');
  const { bytes, ms } = JSON.parse(lines[lines.length - 1] ?? '{}') as { bytes: number; ms: number };
  return (bytes * 8) / (Math.max(ms, 1) / 1000) / 1e6;
}

// ---- tests -------------------------------------------------------------------------

describe('QoS on a real kernel', () => {
  it('builds the HTB + IFB layout with the configured rates, and says what the kernel lacks on stdout', async () => {
    const s = withRules([eip('egress', SENDER, '10'), eip('ingress', SENDER, '0.5')]);
    const r = await mgr.sync(s);
    expect(r.changes).toBeGreaterThan(0);

    const eg = find(s, 'egress', SENDER);
    const ing = find(s, 'ingress', SENDER);
    expect(await classLine(EXT, eg.classId!)).toMatch(/rate 10Mbit ceil 10Mbit burst (1Mb|1024Kb) cburst (1Mb|1024Kb)/);
    expect(await classLine(`ifb-${EXT}`, ing.classId!)).toMatch(/rate 500Kbit ceil 500Kbit/);

    const qdiscs = await tcGw(['qdisc', 'show']);
    expect(qdiscs).toMatch(new RegExp(`qdisc htb 1: dev ${EXT} root .*default 0x9999`));
    expect(qdiscs).toMatch(new RegExp(`qdisc htb 1: dev ifb-${EXT} root .*default 0x9999`));
    expect(qdiscs).toMatch(new RegExp(`qdisc ingress ffff: dev ${EXT} `));
    expect(await classLine(EXT, 0x9999)).toMatch(/rate 10Gbit/);
    expect(await classLine(`ifb-${EXT}`, 0x9999)).toMatch(/rate 10Gbit/);
    const redirect = await tcGw(['filter', 'show', 'dev', EXT, 'parent', 'ffff:']);
    expect(redirect).toMatch(/pref 65535 u32/);
    expect(redirect).toContain(`Redirect to device ifb-${EXT}`);
    const egFilters = await tcGw(['filter', 'show', 'dev', EXT, 'parent', '1:']);
    expect(egFilters).toMatch(new RegExp(`pref 1 u32 .*fh [0-9a-f]+::${eg.handle!.toString(16)} .*flowid 1:${eg.classId!.toString(16)}`));

    // Both directions classify: pings out hit the egress class, replies hit the IFB class.
    await ping(SENDER);
    expect(await sentPackets(EXT, eg.classId!)).toBeGreaterThanOrEqual(3);
    expect(await sentPackets(`ifb-${EXT}`, ing.classId!)).toBeGreaterThanOrEqual(3);

    // This development kernel lacks fq_codel and matchall: said on stdout (never stderr).
    const probe = outLines.join('\n');
    console.log(`kernel probe: ${probe}`);
    expect(probe).toMatch(/INFO: QoS kernel probe: /);

    // Idempotent: a second sync finds nothing to do.
    expect((await mgr.sync(s)).changes).toBe(0);
  });

  it('re-adding updates the rate in place (same class, counters kept)', async () => {
    const s1 = withRules([eip('egress', SENDER, '10')]);
    await mgr.sync(s1);
    const before = find(s1, 'egress', SENDER);
    await ping(SENDER);
    const sentBefore = await sentPackets(EXT, before.classId!);
    expect(sentBefore).toBeGreaterThan(0);

    const s2 = addEipQos(s1, eip('egress', SENDER, '20', 1, '2')).state;
    const after = find(s2, 'egress', SENDER);
    expect(after.classId).toBe(before.classId);
    expect(after.handle).toBe(before.handle);
    const r = await mgr.sync(s2);
    expect(r.commands.some((c) => c.startsWith(`tc class change dev ${EXT} parent 1: classid 1:${hex(after.classId!)}`))).toBe(true);
    expect(r.commands.some((c) => c.includes('class del') || c.includes('filter del'))).toBe(false);
    expect(await classLine(EXT, after.classId!)).toMatch(/rate 20Mbit ceil 20Mbit burst (2Mb|2048Kb) cburst (2Mb|2048Kb)/);
    expect(await sentPackets(EXT, after.classId!)).toBeGreaterThanOrEqual(sentBefore);
  });

  it('two EIPs whose first-choice class ids collide get distinct working classes; deleting one leaves the other', async () => {
    const [a, b] = findPair((x, y) => x === y);
    expect(eipFirstClassId(a)).toBe(eipFirstClassId(b));
    await addSenderIp(a);
    await addSenderIp(b);
    const s = withRules([eip('egress', a, '10'), eip('egress', b, '20')]);
    await mgr.sync(s);
    const ra = find(s, 'egress', a);
    const rb = find(s, 'egress', b);
    expect(ra.classId).toBe(eipFirstClassId(a));
    expect(rb.classId).not.toBe(ra.classId);
    expect(await classLine(EXT, ra.classId!)).toMatch(/rate 10Mbit/);
    expect(await classLine(EXT, rb.classId!)).toMatch(/rate 20Mbit/);
    await ping(a);
    await ping(b);
    expect(await sentPackets(EXT, ra.classId!)).toBeGreaterThanOrEqual(3);
    expect(await sentPackets(EXT, rb.classId!)).toBeGreaterThanOrEqual(3);

    // Deleting the first leaves exactly the second (the script's formula delete removed a neighbour here).
    const s2 = delEipQos(s, 'egress', a).state;
    await mgr.sync(s2);
    expect(await classLine(EXT, ra.classId!)).toBe('');
    expect(await classLine(EXT, rb.classId!)).toMatch(/rate 20Mbit/);
    const filters = await tcGw(['filter', 'show', 'dev', EXT, 'parent', '1:']);
    expect(filters).toContain(`flowid 1:${rb.classId!.toString(16)}`);
    expect(filters).not.toContain(`flowid 1:${ra.classId!.toString(16)} `);
    const before = await sentPackets(EXT, rb.classId!);
    await ping(b);
    expect(await sentPackets(EXT, rb.classId!)).toBeGreaterThan(before);
  });

  it('two EIPs whose first-choice ids differ only above bit 12 both work (no "No space left on device")', async () => {
    const [a, b] = findPair((x, y) => x !== y && (x & 0xfff) === (y & 0xfff));
    await addSenderIp(a);
    await addSenderIp(b);
    const s = withRules([eip('egress', a, '5'), eip('egress', b, '6')]);
    await mgr.sync(s);
    const ra = find(s, 'egress', a);
    const rb = find(s, 'egress', b);
    console.log(`ids ${hex(ra.classId!)} and ${hex(rb.classId!)}, handles ${ra.handle} and ${rb.handle}`);
    expect(ra.classId! & 0xfff).toBe(rb.classId! & 0xfff);
    await ping(a);
    await ping(b);
    expect(await sentPackets(EXT, ra.classId!)).toBeGreaterThanOrEqual(3);
    expect(await sentPackets(EXT, rb.classId!)).toBeGreaterThanOrEqual(3);
  });

  it('gateway matchall + u32 + EIP rules together: the EIP rule has the better priority and wins', async () => {
    const other = '10.98.7.7';
    await addSenderIp(other);
    const gwU32: GwQos = {
      direction: 'egress',
      dev: EXT,
      priority: 2,
      classifier: 'u32',
      matchType: 'ip',
      matchDirection: 'src',
      cidr: '10.98.0.0/16',
      rate: '30',
      burst: '1',
    };
    const gwAll: GwQos = {
      direction: 'egress',
      dev: EXT,
      priority: 3,
      classifier: 'matchall',
      matchType: '',
      matchDirection: '',
      cidr: '',
      rate: '40',
      burst: '1',
    };
    const s = withRules([eip('egress', SENDER, '10', 1)], [gwU32, gwAll]);
    await mgr.sync(s);
    const e = find(s, 'egress', SENDER);
    const u = s.qos.find((q) => q.classifier === 'u32')!;
    const m = s.qos.find((q) => q.classifier === 'matchall')!;
    expect(u.classId! >= 0x8000 && u.classId! <= 0xfeff).toBe(true);
    expect(m.classId).toBe(0xff03);

    const filters = await tcGw(['filter', 'show', 'dev', EXT, 'parent', '1:']);
    const prefOf = (minor: number) => Number(new RegExp(`pref (\\d+) \\S+ .*flowid 1:${minor.toString(16)}\\b`).exec(filters)?.[1]);
    expect(prefOf(e.classId!)).toBe(1);
    expect(prefOf(u.classId!)).toBe(2);
    expect(prefOf(m.classId!)).toBe(3);

    const [eBefore, uBefore] = [await sentPackets(EXT, e.classId!), await sentPackets(EXT, u.classId!)];
    await ping(SENDER);
    expect(await sentPackets(EXT, e.classId!)).toBeGreaterThanOrEqual(eBefore + 3);
    expect(await sentPackets(EXT, u.classId!)).toBe(uBefore);
    await ping(other);
    expect(await sentPackets(EXT, u.classId!)).toBeGreaterThanOrEqual(uBefore + 3);
    // Traffic the gateway itself sends is caught by the matchall (or its u32 stand-in).
    const mBefore = await sentPackets(EXT, m.classId!);
    await inNs(NS.gw, ['ping', '-c', '2', '-i', '0.2', '-W', '2', RECEIVER]);
    expect(await sentPackets(EXT, m.classId!)).toBeGreaterThanOrEqual(mBefore + 2);
  });

  it("a class and filter deleted behind natgw's back come back after sync", async () => {
    const s = withRules([eip('egress', SENDER, '10'), eip('ingress', SENDER, '0.5')]);
    await mgr.sync(s);
    const e = find(s, 'egress', SENDER);
    const i = find(s, 'ingress', SENDER);
    await tcGw(['filter', 'del', 'dev', EXT, 'parent', '1:', 'prio', '1']);
    await tcGw(['class', 'del', 'dev', EXT, 'classid', `1:${hex(e.classId!)}`]);
    await tcGw(['filter', 'del', 'dev', `ifb-${EXT}`, 'parent', '1:', 'prio', '1']);
    await tcGw(['class', 'del', 'dev', `ifb-${EXT}`, 'classid', `1:${hex(i.classId!)}`]);
    await tcGw(['filter', 'del', 'dev', EXT, 'parent', 'ffff:', 'prio', '65535']);
    expect(await classLine(EXT, e.classId!)).toBe('');

    const r = await mgr.sync(s);
    expect(r.changes).toBeGreaterThan(0);
    expect(await classLine(EXT, e.classId!)).toMatch(/rate 10Mbit/);
    expect(await classLine(`ifb-${EXT}`, i.classId!)).toMatch(/rate 500Kbit/);
    expect(await tcGw(['filter', 'show', 'dev', EXT, 'parent', 'ffff:'])).toContain(`Redirect to device ifb-${EXT}`);
    expect((await mgr.sync(s)).changes).toBe(0);
  });

  it('a restart without the state file keeps the allocations (read back from the kernel)', async () => {
    const [a, b] = findPair((x, y) => x === y, new Set([SENDER]));
    await addSenderIp(a);
    await addSenderIp(b);
    const gwU32: GwQos = {
      direction: 'ingress',
      dev: EXT,
      priority: 5,
      classifier: 'u32',
      matchType: 'ip',
      matchDirection: 'dst',
      cidr: '10.98.0.0/16',
      rate: '1.5',
      burst: '0.5',
    };
    const s = withRules([eip('egress', a, '10'), eip('egress', b, '0.5'), eip('ingress', a, '7', 2, '1.5')], [gwU32]);
    await mgr.sync(s);

    const fresh = new QosManager(new NetnsExecutor(NS.gw));
    const back = await fresh.readBack(EXT, []);
    const norm = <T extends object>(xs: T[]) =>
      xs.map((x) => JSON.stringify(Object.fromEntries(Object.entries(x).sort(([a], [b]) => a.localeCompare(b))))).sort();
    expect(norm(back.eipQos)).toEqual(norm(s.eipQos));
    expect(norm(back.qos)).toEqual(norm(s.qos));

    // A state that lost its ids (written without them) adopts the kernel's: nothing changes.
    const stripped: DesiredState = {
      ...s,
      eipQos: [...s.eipQos].reverse().map(({ classId: _c, handle: _h, ...q }) => q),
      qos: s.qos.map(({ classId: _c, handle: _h, ...q }) => q),
    };
    const r = await fresh.sync(stripped);
    expect(r.commands).toEqual([]);
  });

  it("an empty state removes natgw's classes and filters but leaves the shared pieces", async () => {
    await mgr.sync(withRules([eip('egress', SENDER, '10'), eip('ingress', SENDER, '10')]));
    await mgr.sync(base());
    for (const dev of [EXT, `ifb-${EXT}`]) {
      const classes = (await tcGw(['class', 'show', 'dev', dev])).trim().split('\n');
      expect(classes).toHaveLength(1);
      expect(classes[0]).toMatch(/^class htb 1:9999 /);
      expect((await tcGw(['filter', 'show', 'dev', dev, 'parent', '1:'])).trim()).toBe('');
    }
    expect(await tcGw(['filter', 'show', 'dev', EXT, 'parent', 'ffff:'])).toContain(`Redirect to device ifb-${EXT}`);
  });

  it('shapes for real: a bulk TCP transfer shaped to 2 Mbit is far below the unshaped one', async () => {
    await mgr.sync(base());
    const unshaped = await measureMbit(SENDER, 1000);
    await mgr.sync(withRules([eip('egress', SENDER, '2', 1, '0.05')]));
    const shaped = await measureMbit(SENDER, 3000);
    console.log(`bulk TCP ${SENDER} → ${RECEIVER}: unshaped ${unshaped.toFixed(1)} Mbit/s, shaped to 2 Mbit/s: ${shaped.toFixed(2)} Mbit/s`);
    expect(shaped).toBeLessThan(4);
    expect(shaped).toBeLessThan(unshaped * 0.5);
    expect(shaped).toBeGreaterThan(0.5);
  });
});
