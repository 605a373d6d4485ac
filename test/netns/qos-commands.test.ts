/**
 * QoS end to end through the command line (SPEC §2 QoS, §3.4): natgw is driven through the
 * real shim in the gw namespace of the harness topology, exactly as the controller runs it,
 * and every assertion is made on what the kernel holds (`tc … show`) and on real traffic.
 *
 *   vpc1 10.0.1.6 ── eth0 10.0.1.1  gw  net1 (EIPs 172.20.0.x/24) ── ext 172.20.0.100
 *
 * EXT is `net1`: EIP egress rules classify on net1 by source address (after SNAT), EIP
 * ingress rules on `ifb-net1` (net1's ingress is redirected there) by destination address.
 */
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { bulkTransfer, startSinkServer, type ServerHandle, type TransferResult } from '../helpers/traffic.js';
import { waitFor } from '../helpers/poll.js';
import { CLASS_RANGES, eipFirstClassId } from '../../src/model/qos.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { startDaemon, stopDaemon, waitForLog, waitReady, type Daemon } from './daemon-util.js';
import { StateStore } from '../../src/state/store.js';

const EXT = 'net1';
const IFB = `ifb-${EXT}`;
const EIP_A = '172.20.0.10';
const EIP_B = '172.20.0.11';
const PROBE_LINE = /^INFO: QoS kernel probe: .+$/m;
/** Tests that run many commands: each is a fresh node process through the shim (about a second on a busy machine). */
const LONG_MS = 180_000;

// ---------------------------------------------------------------------------------
// Reading tc's text, independently of natgw's own parsers
// ---------------------------------------------------------------------------------

interface ShownFilter {
  readonly pref: number;
  readonly protocol: string;
  readonly kind: string;
  /** u32 `800::1`; matchall `0x1` (iproute2's f_matchall.c prints `handle 0x…`, never `fh`). */
  readonly fh: string;
  readonly flowid?: number;
  readonly keys: { value: number; mask: number; off: number }[];
  readonly redirectTo?: string;
}

const ipToInt = (ip: string): number => ip.split('.').reduce((a, o) => ((a << 8) | Number(o)) >>> 0, 0);

/** Classifying filters (not priority headers or u32 hash-table lines) of `tc filter show`. */
function parseFilters(text: string): ShownFilter[] {
  const out: { pref: number; protocol: string; kind: string; fh: string; flowid?: number; keys: ShownFilter['keys']; redirectTo?: string }[] = [];
  let cur: (typeof out)[number] | undefined;
  for (const line of text.split('\n')) {
    const head = /^filter (?:parent \S+ )?protocol (\S+) pref (\d+) (\S+) .*\b(?:fh|handle) (\S+)/.exec(line);
    if (line.startsWith('filter ')) {
      cur = undefined;
      if (head && !/ ht divisor /.test(line)) {
        const flow = /\bflowid 1:([0-9a-f]+)/.exec(line)?.[1];
        cur = { protocol: head[1]!, pref: Number(head[2]), kind: head[3]!, fh: head[4]!, keys: [], ...(flow ? { flowid: parseInt(flow, 16) } : {}) };
        out.push(cur);
      }
      continue;
    }
    const key = /^\s+match ([0-9a-f]{8})\/([0-9a-f]{8}) at (\d+)/.exec(line);
    if (cur && key) cur.keys.push({ value: parseInt(key[1]!, 16) >>> 0, mask: parseInt(key[2]!, 16) >>> 0, off: Number(key[3]) });
    const redirect = /Redirect to device (\S+?)\)/.exec(line);
    if (cur && redirect) cur.redirectTo = redirect[1]!;
  }
  return out;
}

/** Whether a filter's u32 keys match an IPv4 packet with these addresses (offset 12 = src, 16 = dst). */
function keysMatch(f: ShownFilter, pkt: { src: string; dst: string }): boolean {
  return f.keys.every((k) => {
    if (k.mask === 0) return true;
    const word = k.off === 12 ? ipToInt(pkt.src) : k.off === 16 ? ipToInt(pkt.dst) : undefined;
    return word !== undefined && (word & k.mask) >>> 0 === k.value;
  });
}

const hex = (n: number): string => n.toString(16);

describe.each(BACKENDS)('QoS through the command line ($name)', (b: BackendCase) => {
  let topo: Topology;
  let probeSeen = false;

  const gw = async (...argv: string[]): Promise<string> => (await topo.exec('gw', argv)).stdout;
  const tc = (...args: string[]): Promise<string> => gw('tc', ...args);
  const classLine = async (dev: string, minor: number): Promise<string> => (await tc('class', 'show', 'dev', dev, 'classid', `1:${hex(minor)}`)).trim();
  const filters = async (dev: string, parent = '1:'): Promise<ShownFilter[]> => parseFilters(await tc('filter', 'show', 'dev', dev, 'parent', parent));
  /** The u32 filter natgw made for one address: src on EXT (egress), dst on the IFB (ingress). */
  const eipFilter = async (direction: 'egress' | 'ingress', ip: string): Promise<ShownFilter | undefined> => {
    const dev = direction === 'egress' ? EXT : IFB;
    const off = direction === 'egress' ? 12 : 16;
    return (await filters(dev)).find(
      (f) => f.keys.length === 1 && f.keys[0]!.off === off && f.keys[0]!.mask === 0xffffffff && f.keys[0]!.value === ipToInt(ip),
    );
  };
  const eipClass = async (direction: 'egress' | 'ingress', ip: string): Promise<number> => {
    const f = await eipFilter(direction, ip);
    if (f?.flowid === undefined) throw new Error(`no ${direction} filter for ${ip}`);
    return f.flowid;
  };
  const sentPackets = async (dev: string, minor: number): Promise<number> => {
    const out = await tc('-s', 'class', 'show', 'dev', dev, 'classid', `1:${hex(minor)}`);
    const m = /Sent \d+ bytes (\d+) pkt/.exec(out);
    if (!m) throw new Error(`no class 1:${hex(minor)} on ${dev}`);
    return Number(m[1]);
  };
  /** Wait until a class has counted `atLeast` packets. */
  const waitSent = (dev: string, minor: number, atLeast: number): Promise<number> =>
    waitFor(
      async () => {
        const n = await sentPackets(dev, minor);
        return n >= atLeast ? n : undefined;
      },
      { what: `class 1:${hex(minor)} on ${dev} to count ${atLeast} packets`, timeoutMs: 5000, intervalMs: 50 },
    );
  /** Three echoes from gw with an EIP as source to the external host: egress on EXT, replies through the IFB. */
  const pingFrom = async (src: string): Promise<void> => {
    await topo.exec('gw', ['ping', '-c', '3', '-i', '0.2', '-W', '2', '-I', src, ADDR.extHost]);
  };
  /** Everything natgw shapes on EXT and its IFB, as comparable text (counters left out). */
  const tcSnapshot = async (): Promise<string> => {
    const parts = await Promise.all([
      tc('qdisc', 'show', 'dev', EXT),
      tc('qdisc', 'show', 'dev', IFB),
      tc('class', 'show', 'dev', EXT),
      tc('class', 'show', 'dev', IFB),
      tc('filter', 'show', 'dev', EXT, 'parent', '1:'),
      tc('filter', 'show', 'dev', IFB, 'parent', '1:'),
      tc('filter', 'show', 'dev', EXT, 'parent', 'ffff:'),
    ]);
    return parts.join('\n--\n');
  };

  /** A QoS command that must succeed: status 0, EMPTY stderr, the header line first, the probe line only on stdout. */
  const qos = async (command: string, ...rules: string[]): Promise<string> => {
    const r = await topo.natgw(command, ...rules);
    const what = `${command} ${rules.join(' ')}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`;
    expect(r.exitCode, what).toBe(0);
    expect(r.stderr, what).toBe('');
    expect(r.stdout.split('\n')[0], what).toBe(`${command} ${rules.join(' ')}`);
    if (PROBE_LINE.test(r.stdout)) probeSeen = true;
    return r.stdout;
  };

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, b.env);
    topo.env.GATEWAY_V4 = ADDR.extGateway;
    await topo.natgwOk('init');
    await topo.natgwOk('eip-add', `${EIP_A}/24`);
    await topo.natgwOk('eip-add', `${EIP_B}/24`);
  });
  afterAll(async () => {
    await topo?.cleanup();
  });

  it('eip-egress/ingress-qos-add build the HTB + IFB layout at the given rates; the probe speaks on stdout only', async () => {
    const out = await qos('eip-egress-qos-add', `${EIP_A},1,10,1`);
    // This kernel lacks fq_codel and matchall: natgw says so on stdout, never on stderr.
    expect(out).toMatch(PROBE_LINE);
    console.log(`kernel probe: ${PROBE_LINE.exec(out)?.[0]}`);

    const eg = await eipClass('egress', EIP_A);
    expect(eg).toBeGreaterThanOrEqual(CLASS_RANGES.eip.min);
    expect(eg).toBeLessThanOrEqual(CLASS_RANGES.eip.max);
    const egClasses = await tc('class', 'show', 'dev', EXT);
    expect(egClasses).toMatch(new RegExp(`^class htb 1:${hex(eg)} root .*rate 10Mbit ceil 10Mbit burst (1Mb|1024Kb) cburst (1Mb|1024Kb)`, 'm'));
    expect(egClasses).toMatch(/^class htb 1:9999 root .*rate 10Gbit/m);
    expect(await tc('qdisc', 'show', 'dev', EXT)).toMatch(/qdisc htb 1: root .*default 0x9999/);
    expect((await eipFilter('egress', EIP_A))?.pref).toBe(1);

    await qos('eip-ingress-qos-add', `${EIP_A},1,0.5,1`);
    const ing = await eipClass('ingress', EIP_A);
    expect(await tc('class', 'show', 'dev', IFB)).toMatch(new RegExp(`^class htb 1:${hex(ing)} root .*rate 500Kbit ceil 500Kbit`, 'm'));
    expect(await tc('qdisc', 'show', 'dev', IFB)).toMatch(/qdisc htb 1: root .*default 0x9999/);
    // The ingress redirect: an ingress qdisc on net1 and a catch-all at prio 65535 into the IFB.
    expect(await tc('qdisc', 'show', 'dev', EXT)).toMatch(/qdisc ingress ffff: /);
    const redirects = await filters(EXT, 'ffff:');
    expect(redirects).toHaveLength(1);
    expect(redirects[0]).toMatchObject({ pref: 65535, redirectTo: IFB });

    // Both directions classify: echoes leave through the egress class, replies pass the IFB class.
    await pingFrom(EIP_A);
    await waitSent(EXT, eg, 3);
    await waitSent(IFB, ing, 3);
    expect(probeSeen).toBe(true);
  });

  it('re-adding with another rate changes the class in place (same class id, counters kept); the same rule again changes nothing', async () => {
    const before = await eipClass('egress', EIP_A);
    const classesBefore = (await tc('class', 'show', 'dev', EXT)).trim().split('\n').length;
    const sent = await sentPackets(EXT, before);
    expect(sent).toBeGreaterThan(0);

    await qos('eip-egress-qos-add', `${EIP_A},1,20,1`);
    expect(await eipClass('egress', EIP_A)).toBe(before);
    expect(await classLine(EXT, before)).toMatch(/rate 20Mbit ceil 20Mbit/);
    expect((await tc('class', 'show', 'dev', EXT)).trim().split('\n')).toHaveLength(classesBefore);
    // A class that was replaced rather than changed would have started counting from zero.
    expect(await sentPackets(EXT, before)).toBeGreaterThanOrEqual(sent);

    const snap = await tcSnapshot();
    await qos('eip-egress-qos-add', `${EIP_A},1,20,1`);
    await qos('eip-ingress-qos-add', `${EIP_A},1,0.5,1`);
    expect(await tcSnapshot()).toBe(snap);
  });

  it('two EIPs whose first-choice class ids collide get distinct working classes; deleting one leaves the other', { timeout: LONG_MS }, async () => {
    // No two addresses of 172.20.0.0/24 share a first choice (checked with the allocator's own
    // hash), so the collision is forced through the state: B holds A's first choice already.
    const firstA = eipFirstClassId(EIP_A);
    const taken = new Map<number, string>();
    for (let i = 1; i < 255; i++) taken.set(eipFirstClassId(`172.20.0.${i}`), `172.20.0.${i}`);
    console.log(`first choices: ${EIP_A} → 0x${hex(firstA)}, ${EIP_B} → 0x${hex(eipFirstClassId(EIP_B))}; distinct in the /24: ${taken.size}/254`);

    await qos('eip-egress-qos-del', EIP_A);
    expect(await classLine(EXT, firstA)).toBe('');
    expect(await eipFilter('egress', EIP_A)).toBeUndefined();

    await qos('eip-egress-qos-add', `${EIP_B},1,7,1`);
    const store = new StateStore(topo.stateDir);
    const s = await store.load();
    if (!s) throw new Error('no state file');
    await store.save({ ...s, eipQos: s.eipQos.map((q) => (q.direction === 'egress' && q.ip === EIP_B ? { ...q, classId: firstA } : q)) });
    // Any QoS command reconciles: B's class moves to the forced id.
    await qos('eip-egress-qos-add', `${EIP_B},1,7,1`);
    expect(await eipClass('egress', EIP_B)).toBe(firstA);
    expect(await classLine(EXT, firstA)).toMatch(/rate 7Mbit/);

    // A's first choice is taken: it gets another id, silently (stdout and stderr have no word of it).
    const out = await qos('eip-egress-qos-add', `${EIP_A},1,10,1`);
    expect(out).not.toMatch(/collision|taken|conflict/i);
    const a = await eipClass('egress', EIP_A);
    expect(a).not.toBe(firstA);
    expect(a).toBeGreaterThanOrEqual(CLASS_RANGES.eip.min);
    expect(a).toBeLessThanOrEqual(CLASS_RANGES.eip.max);
    expect(await classLine(EXT, a)).toMatch(/rate 10Mbit/);
    expect(await classLine(EXT, firstA)).toMatch(/rate 7Mbit/);

    const [a0, b0] = [await sentPackets(EXT, a), await sentPackets(EXT, firstA)];
    await pingFrom(EIP_A);
    await waitSent(EXT, a, a0 + 3);
    expect(await sentPackets(EXT, firstA)).toBe(b0);
    await pingFrom(EIP_B);
    await waitSent(EXT, firstA, b0 + 3);

    // Deleting B removes exactly B's filter and class (the script's formula delete removed a neighbour here).
    await qos('eip-egress-qos-del', EIP_B);
    expect(await classLine(EXT, firstA)).toBe('');
    expect(await eipFilter('egress', EIP_B)).toBeUndefined();
    expect(await classLine(EXT, a)).toMatch(/rate 10Mbit/);
    expect((await eipFilter('egress', EIP_A))?.flowid).toBe(a);
    const a1 = await sentPackets(EXT, a);
    await pingFrom(EIP_A);
    await waitSent(EXT, a, a1 + 3);
    // Absent is success.
    await qos('eip-egress-qos-del', EIP_B);
  });

  it('two EIPs whose first choices agree in the low 12 bits both work (the script got "No space left on device")', { timeout: LONG_MS }, async () => {
    const seen = new Map<number, string>();
    let pair: [string, string] | undefined;
    for (let i = 2; i < 255 && !pair; i++) {
      const ip = `172.20.0.${i}`;
      if ([EIP_A, EIP_B, ADDR.extHost, ADDR.extGateway].includes(ip)) continue;
      const low = eipFirstClassId(ip) & 0xfff;
      const other = seen.get(low);
      if (other) pair = [other, ip];
      else seen.set(low, ip);
    }
    if (!pair) throw new Error('no pair in the /24');
    const [c, d] = pair;
    for (const ip of pair) await topo.natgwOk('eip-add', `${ip}/24`);
    await qos('eip-egress-qos-add', `${c},1,5,1`, `${d},1,6,1`);
    const [cc, dc] = [await eipClass('egress', c), await eipClass('egress', d)];
    console.log(`${c} → 1:${hex(cc)}, ${d} → 1:${hex(dc)}`);
    expect(cc & 0xfff).toBe(dc & 0xfff);
    expect(cc).not.toBe(dc);
    await pingFrom(c);
    await pingFrom(d);
    await waitSent(EXT, cc, 3);
    await waitSent(EXT, dc, 3);
    await qos('eip-egress-qos-del', c, d);
    expect(await classLine(EXT, cc)).toBe('');
    expect(await classLine(EXT, dc)).toBe('');
    for (const ip of pair) await topo.natgwOk('eip-del', `${ip}/24`);
  });

  it('gateway matchall + u32 + EIP rule together: the EIP rule has the best priority for its address and its class counts; qos-del removes exactly one rule', {
    timeout: LONG_MS,
  }, async () => {
    const matchall = 'egress,net1,10,matchall,,,,5,1';
    const u32 = 'egress,net1,5,u32,ip,src,10.0.1.0/24,3,1';
    await qos('qos-add', matchall);
    await qos('qos-add', u32);
    await topo.natgwOk('snat-add', `${EIP_A},${ADDR.vpcCidr}`);

    const all = await filters(EXT);
    const byClass = (f: ShownFilter) => f.flowid ?? -1;
    const m = all.find((f) => f.pref === 10);
    const u = all.find((f) => f.pref === 5);
    const e = await eipFilter('egress', EIP_A);
    if (!m || !u || !e) throw new Error(`filters missing:\n${await tc('filter', 'show', 'dev', EXT, 'parent', '1:')}`);
    // matchall, or its `match u32 0 0` stand-in on this kernel; its class is 0xff00 + (10 mod 255).
    expect(byClass(m)).toBe(0xff0a);
    expect(await classLine(EXT, 0xff0a)).toMatch(/rate 5Mbit/);
    expect(byClass(u)).toBeGreaterThanOrEqual(CLASS_RANGES.gw.min);
    expect(byClass(u)).toBeLessThanOrEqual(CLASS_RANGES.gw.max);
    expect(await classLine(EXT, byClass(u))).toMatch(/rate 3Mbit/);

    // For a packet from the EIP, the first filter that matches (lowest pref) is the EIP rule's.
    const fromEip = { src: EIP_A, dst: ADDR.extHost };
    const matching = all.filter((f) => keysMatch(f, fromEip)).sort((x, y) => x.pref - y.pref);
    expect(matching[0]?.fh).toBe(e.fh);
    expect(matching[0]?.pref).toBe(1);
    expect(matching.map((f) => f.pref)).toContain(10);

    // And on the wire: vpc1's traffic, SNAT'd to the EIP, is counted by the EIP class only.
    const ec = byClass(e);
    const [e0, m0, u0] = [await sentPackets(EXT, ec), await sentPackets(EXT, 0xff0a), await sentPackets(EXT, byClass(u))];
    await topo.exec('vpc1', ['ping', '-c', '3', '-i', '0.2', '-W', '2', ADDR.extHost]);
    await waitSent(EXT, ec, e0 + 3);
    expect(await sentPackets(EXT, 0xff0a)).toBe(m0);
    expect(await sentPackets(EXT, byClass(u))).toBe(u0);
    // The catch-all is live: traffic from an EIP without a rule of its own lands there.
    await pingFrom(EIP_B);
    await waitSent(EXT, 0xff0a, m0 + 3);

    // qos-del with the nine fields removes the u32 rule, and only it.
    await qos('qos-del', u32);
    expect(await classLine(EXT, byClass(u))).toBe('');
    let now = await filters(EXT);
    expect(now.some((f) => f.pref === 5)).toBe(false);
    expect(now.find((f) => f.pref === 10)?.flowid).toBe(0xff0a);
    expect((await eipFilter('egress', EIP_A))?.flowid).toBe(ec);
    expect(await classLine(EXT, 0xff0a)).toMatch(/rate 5Mbit/);
    expect(await classLine(EXT, ec)).toMatch(/rate 10Mbit/);

    // The seven-field form removes the matchall rule, and only it.
    await qos('qos-del', 'egress,net1,10,matchall,,,');
    expect(await classLine(EXT, 0xff0a)).toBe('');
    now = await filters(EXT);
    expect(now.some((f) => f.pref === 10)).toBe(false);
    expect((await eipFilter('egress', EIP_A))?.flowid).toBe(ec);
    expect(await classLine(EXT, ec)).toMatch(/rate 10Mbit/);
    // Deleting what is absent is success.
    await qos('qos-del', u32);
    await topo.natgwOk('snat-del', `${EIP_A},${ADDR.vpcCidr}`);
  });

  it("a class deleted behind natgw's back is back after the next QoS command", async () => {
    const ec = await eipClass('egress', EIP_A);
    const before = await tcSnapshot();
    const f = await eipFilter('egress', EIP_A);
    // The kernel refuses to delete a class a filter points at: the filter goes first.
    await tc('filter', 'del', 'dev', EXT, 'parent', '1:', 'protocol', 'ip', 'prio', String(f!.pref), 'handle', f!.fh, 'u32');
    await tc('class', 'del', 'dev', EXT, 'classid', `1:0x${hex(ec)}`);
    expect(await classLine(EXT, ec)).toBe('');

    // A re-add of an existing, unchanged rule is enough.
    await qos('eip-ingress-qos-add', `${EIP_A},1,0.5,1`);
    expect(await classLine(EXT, ec)).toMatch(/rate 10Mbit ceil 10Mbit/);
    expect((await eipFilter('egress', EIP_A))?.flowid).toBe(ec);
    expect(await tcSnapshot()).toBe(before);
    await pingFrom(EIP_A);
    await waitSent(EXT, ec, 3);
  });

  it('without the state file the allocations are read back from the kernel and nothing changes', { timeout: LONG_MS }, async () => {
    // A gateway rule and a second EIP's rules too, so there is something on every device, with
    // values the kernel can only approximate: tc prints 9999.999 Mbit/s as 9999Mbit and keeps the
    // burst as whole µs (1.25 KB at that rate); 4095 MB at 0.5 Mbit/s is more than its 32-bit buffer holds.
    await qos('qos-add', 'ingress,net1,3,u32,ip,dst,10.0.1.0/24,1.5,0.25');
    const capped = await qos('eip-egress-qos-add', `${EIP_B},2,0.5,4095`);
    expect(capped).toMatch(/^INFO: QoS: a burst of 4095 MB at 0.5 Mbit\/s is more than the kernel can hold .*$/m);
    await qos('eip-ingress-qos-add', `${EIP_B},2,9999.999,1`);
    const store = new StateStore(topo.stateDir);
    const saved = await store.load();
    const before = await tcSnapshot();

    rmSync(join(topo.stateDir, 'state.json'));
    await qos('eip-egress-qos-add', `${EIP_A},1,10,1`);
    expect(await tcSnapshot()).toBe(before);

    // The rebuilt state holds the same rules with the same class ids and handles.
    const adopted = await store.load();
    const ids = (s: typeof saved) =>
      [
        ...(s?.eipQos ?? []).map((q) => `${q.direction} ${q.ip} ${q.classId} ${q.handle}`),
        ...(s?.qos ?? []).map((q) => `${q.direction} ${q.dev} ${q.cidr} ${q.classId} ${q.handle}`),
      ].sort();
    expect(ids(adopted)).toEqual(ids(saved));

    // Once more without the file, with a command for a new rule elsewhere: existing rules stay untouched.
    rmSync(join(topo.stateDir, 'state.json'));
    await qos('qos-add', 'egress,eth0,3,u32,ip,dst,10.0.1.0/24,7,2');
    expect(await tcSnapshot()).toBe(before);
    expect(await tc('class', 'show', 'dev', 'eth0')).toMatch(/rate 7Mbit/);
    await qos('qos-del', 'egress,eth0,3,u32,ip,dst,10.0.1.0/24,7,2');
    expect(await tc('class', 'show', 'dev', 'eth0')).not.toMatch(/rate 7Mbit/);
    expect(await tcSnapshot()).toBe(before);
  });

  it('bad input: one line on stdout, status 1, and tc unchanged', { timeout: LONG_MS }, async () => {
    const before = await tcSnapshot();
    const bad: [string, string][] = [
      ['eip-egress-qos-add', `${EIP_A},1,0,1`],
      ['eip-egress-qos-add', `${EIP_A},1,-1,1`],
      ['eip-egress-qos-add', `${EIP_A},1,abc,1`],
      ['eip-egress-qos-add', `${EIP_A},1,10,1e3`],
      ['eip-ingress-qos-add', `${EIP_A},1,0,1`],
      ['eip-ingress-qos-add', `${EIP_A},1,10,1e3`],
      // Below one byte per second: tc cannot express it ("rate" is required).
      ['eip-egress-qos-add', `${EIP_A},1,0.000001,1`],
      ['qos-add', 'egress,net1,5,u32,ip,src,10.0.1.0/24,0,1'],
      ['qos-add', 'egress,net1,5,u32,ip,src,10.0.1.0/24,-1,1'],
      ['qos-add', 'egress,net1,5,u32,ip,src,10.0.1.0/24,abc,1'],
      ['qos-add', 'egress,net1,5,u32,ip,src,10.0.1.0/24,3,1e3'],
      ['qos-add', 'sideways,net1,5,u32,ip,src,10.0.1.0/24,3,1'],
      ['qos-add', 'egress,net1,5,fw,ip,src,10.0.1.0/24,3,1'],
      ['qos-add', 'egress,abcdefghijklmnop,5,u32,ip,src,10.0.1.0/24,3,1'],
      ['qos-add', 'ingress,abcdefghijkl,1,u32,ip,dst,10.0.1.0/24,1,1'],
      ['qos-del', 'sideways,net1,5,u32,ip,src,10.0.1.0/24,3,1'],
      ['qos-del', 'egress,net1,5,fw,ip,src,10.0.1.0/24'],
      ['qos-del', 'egress,abcdefghijklmnop,5,u32,ip,src,10.0.1.0/24'],
      ['eip-ingress-qos-del', '172.20.0.300'],
    ];
    for (const [cmd, rule] of bad) {
      const r = await topo.natgw(cmd, rule);
      const what = `${cmd} ${rule}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`;
      expect(r.exitCode, what).toBe(1);
      expect(r.stderr, what).toBe('');
      const lines = r.stdout.trimEnd().split('\n');
      expect(lines, what).toHaveLength(2);
      expect(lines[0]).toBe(`${cmd} ${rule}`);
      expect(lines[1], what).toMatch(/^Error: invalid /);
    }
    // A bad rule next to a good one: nothing of either is applied.
    const mixed = await topo.natgw('eip-egress-qos-add', `${EIP_B},1,9,1`, `${EIP_A},1,abc,1`);
    expect(mixed.exitCode).toBe(1);
    expect(mixed.stderr).toBe('');
    expect(await tcSnapshot()).toBe(before);
  });
});

/**
 * Through a running daemon every QoS command is a partial sync: it reads back only the devices
 * it changes and names the u32 tables by the ids the kernel gave them. Priorities are emptied
 * and made again, so the kernel's table ids (800:, 801:, …, handed out cyclically) no longer
 * follow the priorities; every delete must still remove exactly its own rule.
 */
describe.each(BACKENDS)('QoS through a running daemon ($name)', (b: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  const ips = { a: '172.20.0.30', b: '172.20.0.31', c: '172.20.0.32', d: '172.20.0.33', e: '172.20.0.34', f: '172.20.0.35', g: '172.20.0.36' };

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, b.env);
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    await topo.natgwOk('init');
  });
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
  });

  const ok = async (command: string, rule: string): Promise<void> => {
    const r = await topo.natgw(command, rule);
    expect(r.exitCode, `${command} ${rule}: ${r.stdout}${r.stderr}`).toBe(0);
    expect(r.stderr).toBe('');
  };
  /** Per address: the priority and class of its egress filter on EXT. */
  const shaped = async (): Promise<Map<string, { pref: number; flowid: number | undefined }>> => {
    const fs = parseFilters((await topo.exec('gw', ['tc', 'filter', 'show', 'dev', EXT, 'parent', '1:'])).stdout);
    const byIp = new Map<string, { pref: number; flowid: number | undefined }>();
    for (const f of fs) {
      const k = f.keys[0];
      if (f.keys.length === 1 && k?.off === 12 && k.mask === 0xffffffff)
        byIp.set([24, 16, 8, 0].map((b) => (k.value >>> b) & 0xff).join('.'), { pref: f.pref, flowid: f.flowid });
    }
    return byIp;
  };
  const classes = async (): Promise<number[]> =>
    [...(await topo.exec('gw', ['tc', 'class', 'show', 'dev', EXT])).stdout.matchAll(/^class htb 1:([0-9a-f]+) /gm)]
      .map((m) => parseInt(m[1]!, 16))
      .sort((x, y) => x - y);

  it('deletes remove exactly their rule in u32 tables whose ids the kernel chose after priorities came and went', { timeout: LONG_MS }, async () => {
    await ok('eip-egress-qos-add', `${ips.a},1,10,1`);
    await ok('eip-egress-qos-add', `${ips.b},2,10,1`);
    await ok('eip-egress-qos-add', `${ips.c},3,10,1`);
    // Priority 2 goes whole, and with it its table; priority 4's table takes the next id, not its.
    await ok('eip-egress-qos-del', ips.b);
    await ok('eip-egress-qos-add', `${ips.d},4,10,1`);
    await ok('eip-egress-qos-add', `${ips.e},4,10,1`);
    await ok('eip-egress-qos-add', `${ips.f},2,10,1`);
    await ok('eip-egress-qos-add', `${ips.g},2,10,1`);
    const before = await shaped();
    expect([...before.keys()].sort()).toEqual([ips.a, ips.c, ips.d, ips.e, ips.f, ips.g].sort());
    const tables = (await topo.exec('gw', ['tc', 'filter', 'show', 'dev', EXT, 'parent', '1:'])).stdout;
    // The kernel's ids no longer follow the priorities (prio 4 made before prio 2 came back).
    expect(tables).toMatch(/pref 4 u32 chain 0 fh 803: ht divisor 1/);
    expect(tables).toMatch(/pref 2 u32 chain 0 fh 804: ht divisor 1/);

    // One node of each of the two newest tables.
    await ok('eip-egress-qos-del', ips.d);
    await ok('eip-egress-qos-del', ips.f);
    const after = await shaped();
    expect([...after.keys()].sort()).toEqual([ips.a, ips.c, ips.e, ips.g].sort());
    for (const ip of after.keys()) expect(after.get(ip), ip).toEqual(before.get(ip));
    // Their classes went with them; every other class stayed.
    const kept = [...after.values()].map((f) => f.flowid!);
    expect(await classes()).toEqual([...kept, 0x9999].sort((x, y) => x - y));

    // These were partial syncs in the daemon, each reading back what it changed.
    await waitForLog(daemon!, /"msg":"qos sync".*"partial":true|"partial":true.*"msg":"qos sync"/);
  });
});

describe('QoS shapes real traffic through the gateway', () => {
  const EIP = '172.20.0.20';
  const PORT = 7100;
  let topo: Topology;
  let sink: ServerHandle;

  beforeAll(async () => {
    topo = await createTopology();
    await topo.natgwOk('init');
    await topo.natgwOk('eip-add', `${EIP}/24`);
    await topo.natgwOk('snat-add', `${EIP},${ADDR.vpcCidr}`);
    sink = startSinkServer(topo, 'ext', PORT, ADDR.extHost);
    await sink.ready;
  });
  afterAll(async () => {
    await sink?.stop().catch(() => undefined);
    await topo?.cleanup();
  });

  /**
   * One bounded measurement from vpc1 to the external host through the SNAT'd EIP. A class
   * starts with a full bucket (burst 1 MB), which a transfer of that size would cross at line
   * rate; a first transfer of 1.25 MB empties it, the second (1 MB) is the one measured.
   */
  const measure = async (): Promise<TransferResult> => {
    await bulkTransfer(topo, 'vpc1', ADDR.extHost, PORT, 1_310_720, { timeoutMs: 20_000 });
    return bulkTransfer(topo, 'vpc1', ADDR.extHost, PORT, 1_048_576, { timeoutMs: 20_000 });
  };

  it('a bulk TCP transfer through an EIP shaped to 2 Mbit egress is far below the same transfer unshaped', { timeout: LONG_MS }, async () => {
    const unshaped = await measure();
    const out = await topo.natgwOk('eip-egress-qos-add', `${EIP},1,2,1`);
    expect(out).toMatch(PROBE_LINE);
    expect(await topo.exec('gw', ['tc', 'class', 'show', 'dev', EXT]).then((r) => r.stdout)).toMatch(/rate 2Mbit ceil 2Mbit/);
    const shaped = await measure();
    const mbit = (t: TransferResult) => t.bitsPerSecond / 1e6;
    console.log(
      `bulk TCP vpc1 → ${ADDR.extHost} via SNAT ${EIP}, 1 MiB: unshaped ${mbit(unshaped).toFixed(1)} Mbit/s (${unshaped.elapsedMs.toFixed(0)} ms), ` +
        `shaped to 2 Mbit/s: ${mbit(shaped).toFixed(2)} Mbit/s (${shaped.elapsedMs.toFixed(0)} ms)`,
    );
    expect(shaped.bytes).toBe(1_048_576);
    expect(mbit(shaped)).toBeLessThan(4);
    expect(mbit(shaped)).toBeLessThan(mbit(unshaped) * 0.5);
  });
});
