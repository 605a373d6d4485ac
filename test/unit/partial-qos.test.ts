/**
 * QosManager, full and partial (SyncOptions): a partial sync plans against the view kept from
 * the last apply (KernelQos after the plan, qosViewAfter) and runs only `tc -batch -`, and
 * renders exactly what a full sync renders against the kernel's listing after that apply. The
 * listings are what iproute2 6.1 printed on Linux 6.18 (no fq_codel, no matchall) after a real
 * QosManager applied S1, S2 and S3; S2_REAL and S3_REAL are the commands it ran there.
 */
import { describe, expect, it } from 'vitest';
import { QosManager, qosViewAfter, type QosView } from '../../src/dataplane/qos/manager.js';
import type { EipQos, GwQos } from '../../src/model/qos.js';
import { addEipQos, addGwQos, delEipQos, delGwQos } from '../../src/state/qosOperations.js';
import { emptyState, type DesiredState } from '../../src/state/state.js';
import { type ExecRequest, type ExecResult, RecordingExecutor } from '../../src/system/exec.js';

type Listing = Readonly<Record<string, string>>;

const INITIAL: Listing = {
  'ip -j link show': `[{"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"]},{"ifname":"eth0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]},{"ifname":"net1","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]}]`,
  'tc qdisc show': `qdisc noqueue 0: dev lo root refcnt 2 
qdisc noqueue 0: dev eth0 root refcnt 2 
qdisc noqueue 0: dev net1 root refcnt 2 
`,
};

const AFTER_S1: Listing = {
  'ip -j link show': `[{"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"]},{"ifname":"eth0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]},{"ifname":"net1","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]},{"ifname":"ifb-net1","flags":["BROADCAST","NOARP","UP","LOWER_UP"]}]`,
  'tc qdisc show': `qdisc noqueue 0: dev lo root refcnt 2 
qdisc noqueue 0: dev eth0 root refcnt 2 
qdisc htb 1: dev net1 root refcnt 3 r2q 10 default 0x9999 direct_packets_stat 0 direct_qlen 1000
qdisc ingress ffff: dev net1 parent ffff:fff1 ---------------- 
qdisc htb 1: dev ifb-net1 root refcnt 2 r2q 10 default 0x9999 direct_packets_stat 0 direct_qlen 1000
`,
  'tc -d -raw class show dev net1': `class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
class htb 1:37fa root prio 0 quantum 125000 rate 10Mbit ceil 10Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [00c7fff3] cbuffer [00c7fff3] 
class htb 1:ff03 root prio 0 quantum 200000 rate 50Mbit ceil 50Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [0027fffd] cbuffer [0027fffd] 
class htb 1:c112 root prio 0 quantum 200000 rate 100Mbit ceil 100Mbit linklayer ethernet burst 2Mb/1 mpu 0b cburst 2Mb/1 mpu 0b level 0 buffer [0027fffd] cbuffer [0027fffd] 
`,
  'tc filter show dev net1 parent 1:': `filter protocol ip pref 1 u32 chain 0 
filter protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 
filter protocol ip pref 1 u32 chain 0 fh 800::1 order 1 key ht 800 bkt 0 *flowid 1:37fa not_in_hw 
  match 0a620002/ffffffff at 12
filter protocol ip pref 2 u32 chain 0 
filter protocol ip pref 2 u32 chain 0 fh 801: ht divisor 1 
filter protocol ip pref 2 u32 chain 0 fh 801::800 order 2048 key ht 801 bkt 0 *flowid 1:c112 not_in_hw 
  match 0a000000/ffff0000 at 12
filter protocol ip pref 3 u32 chain 0 
filter protocol ip pref 3 u32 chain 0 fh 802: ht divisor 1 
filter protocol ip pref 3 u32 chain 0 fh 802::fff order 4095 key ht 802 bkt 0 *flowid 1:ff03 not_in_hw 
  match 00000000/00000000 at 0
`,
  'tc filter show dev net1 parent ffff:': `filter protocol all pref 65535 u32 chain 0 
filter protocol all pref 65535 u32 chain 0 fh 800: ht divisor 1 
filter protocol all pref 65535 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 terminal flowid not_in_hw 
  match 00000000/00000000 at 0
	action order 1: mirred (Egress Redirect to device ifb-net1) stolen
	index 1 ref 1 bind 1

`,
  'tc -d -raw class show dev ifb-net1': `class htb 1:3267 root prio 0 quantum 62500 rate 5Mbit ceil 5Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [018ffff6] cbuffer [018ffff6] 
class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
`,
  'tc filter show dev ifb-net1 parent 1:': `filter protocol ip pref 1 u32 chain 0 
filter protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 
filter protocol ip pref 1 u32 chain 0 fh 800::1 order 1 key ht 800 bkt 0 *flowid 1:3267 not_in_hw 
  match 0a620003/ffffffff at 16
`,
};

const AFTER_S2: Listing = {
  'ip -j link show': `[{"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"]},{"ifname":"eth0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]},{"ifname":"net1","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]},{"ifname":"ifb-net1","flags":["BROADCAST","NOARP","UP","LOWER_UP"]}]`,
  'tc qdisc show': `qdisc noqueue 0: dev lo root refcnt 2 
qdisc noqueue 0: dev eth0 root refcnt 2 
qdisc htb 1: dev net1 root refcnt 3 r2q 10 default 0x9999 direct_packets_stat 0 direct_qlen 1000
qdisc ingress ffff: dev net1 parent ffff:fff1 ---------------- 
qdisc htb 1: dev ifb-net1 root refcnt 2 r2q 10 default 0x9999 direct_packets_stat 0 direct_qlen 1000
`,
  'tc -d -raw class show dev net1': `class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
class htb 1:37fa root prio 0 quantum 200000 rate 20Mbit ceil 20Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [0063fff9] cbuffer [0063fff9] 
class htb 1:10f5 root prio 0 quantum 87500 rate 7Mbit ceil 7Mbit linklayer ethernet burst 512Kb/1 mpu 0b cburst 512Kb/1 mpu 0b level 0 buffer [008edb69] cbuffer [008edb69] 
class htb 1:ff03 root prio 0 quantum 200000 rate 50Mbit ceil 50Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [0027fffd] cbuffer [0027fffd] 
class htb 1:1688 root prio 0 quantum 125000 rate 10Mbit ceil 10Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [00c7fff3] cbuffer [00c7fff3] 
`,
  'tc filter show dev net1 parent 1:': `filter protocol ip pref 1 u32 chain 0 
filter protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 
filter protocol ip pref 1 u32 chain 0 fh 800::1 order 1 key ht 800 bkt 0 *flowid 1:37fa not_in_hw 
  match 0a620002/ffffffff at 12
filter protocol ip pref 1 u32 chain 0 fh 800::2 order 2 key ht 800 bkt 0 *flowid 1:1688 not_in_hw 
  match 0a620004/ffffffff at 12
filter protocol ip pref 3 u32 chain 0 
filter protocol ip pref 3 u32 chain 0 fh 802: ht divisor 1 
filter protocol ip pref 3 u32 chain 0 fh 802::fff order 4095 key ht 802 bkt 0 *flowid 1:ff03 not_in_hw 
  match 00000000/00000000 at 0
filter protocol ip pref 4 u32 chain 0 
filter protocol ip pref 4 u32 chain 0 fh 803: ht divisor 1 
filter protocol ip pref 4 u32 chain 0 fh 803::1 order 1 key ht 803 bkt 0 *flowid 1:10f5 not_in_hw 
  match 0a620005/ffffffff at 12
`,
  'tc filter show dev net1 parent ffff:': `filter protocol all pref 65535 u32 chain 0 
filter protocol all pref 65535 u32 chain 0 fh 800: ht divisor 1 
filter protocol all pref 65535 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 terminal flowid not_in_hw 
  match 00000000/00000000 at 0
	action order 1: mirred (Egress Redirect to device ifb-net1) stolen
	index 1 ref 1 bind 1

`,
  'tc -d -raw class show dev ifb-net1': `class htb 1:3267 root prio 0 quantum 62500 rate 5Mbit ceil 5Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [018ffff6] cbuffer [018ffff6] 
class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
`,
  'tc filter show dev ifb-net1 parent 1:': `filter protocol ip pref 1 u32 chain 0 
filter protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 
filter protocol ip pref 1 u32 chain 0 fh 800::1 order 1 key ht 800 bkt 0 *flowid 1:3267 not_in_hw 
  match 0a620003/ffffffff at 16
`,
};

const AFTER_S3: Listing = {
  'ip -j link show': `[{"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"]},{"ifname":"eth0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]},{"ifname":"net1","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]},{"ifname":"ifb-net1","flags":["BROADCAST","NOARP","UP","LOWER_UP"]}]`,
  'tc qdisc show': `qdisc noqueue 0: dev lo root refcnt 2 
qdisc noqueue 0: dev eth0 root refcnt 2 
qdisc htb 1: dev net1 root refcnt 3 r2q 10 default 0x9999 direct_packets_stat 0 direct_qlen 1000
qdisc ingress ffff: dev net1 parent ffff:fff1 ---------------- 
qdisc htb 1: dev ifb-net1 root refcnt 2 r2q 10 default 0x9999 direct_packets_stat 0 direct_qlen 1000
`,
  'tc -d -raw class show dev net1': `class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
class htb 1:37fa root prio 0 quantum 200000 rate 20Mbit ceil 20Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [0063fff9] cbuffer [0063fff9] 
class htb 1:ff03 root prio 0 quantum 200000 rate 50Mbit ceil 50Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [0027fffd] cbuffer [0027fffd] 
class htb 1:f7ae root prio 0 quantum 200000 rate 30Mbit ceil 30Mbit linklayer ethernet burst 2Mb/1 mpu 0b cburst 2Mb/1 mpu 0b level 0 buffer [0085554d] cbuffer [0085554d] 
`,
  'tc filter show dev net1 parent 1:': `filter protocol ip pref 1 u32 chain 0 
filter protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 
filter protocol ip pref 1 u32 chain 0 fh 800::1 order 1 key ht 800 bkt 0 *flowid 1:37fa not_in_hw 
  match 0a620002/ffffffff at 12
filter protocol ip pref 2 u32 chain 0 
filter protocol ip pref 2 u32 chain 0 fh 804: ht divisor 1 
filter protocol ip pref 2 u32 chain 0 fh 804::800 order 2048 key ht 804 bkt 0 *flowid 1:f7ae not_in_hw 
  match 0a010000/ffff0000 at 16
filter protocol ip pref 3 u32 chain 0 
filter protocol ip pref 3 u32 chain 0 fh 802: ht divisor 1 
filter protocol ip pref 3 u32 chain 0 fh 802::fff order 4095 key ht 802 bkt 0 *flowid 1:ff03 not_in_hw 
  match 00000000/00000000 at 0
`,
  'tc filter show dev net1 parent ffff:': `filter protocol all pref 65535 u32 chain 0 
filter protocol all pref 65535 u32 chain 0 fh 800: ht divisor 1 
filter protocol all pref 65535 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 terminal flowid not_in_hw 
  match 00000000/00000000 at 0
	action order 1: mirred (Egress Redirect to device ifb-net1) stolen
	index 1 ref 1 bind 1

`,
  'tc -d -raw class show dev ifb-net1': `class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
`,
};

const S2_REAL = [
  'tc class change dev net1 parent 1: classid 1:0x37fa htb rate 20mbit ceil 20mbit burst 1048576 cburst 1048576',
  'tc class add dev net1 parent 1: classid 1:0x1688 htb rate 10mbit ceil 10mbit burst 1048576 cburst 1048576',
  'tc class add dev net1 parent 1: classid 1:0x10f5 htb rate 7mbit ceil 7mbit burst 524288 cburst 524288',
  'tc filter add dev net1 parent 1: protocol ip prio 1 handle ::0x2 u32 match ip src 10.98.0.4/32 flowid 1:0x1688',
  'tc filter add dev net1 parent 1: protocol ip prio 4 handle ::0x1 u32 match ip src 10.98.0.5/32 flowid 1:0x10f5',
  'tc filter del dev net1 parent 1: prio 2',
  'tc class del dev net1 classid 1:0xc112',
];
const S3_REAL = [
  'tc class add dev net1 parent 1: classid 1:0xf7ae htb rate 30mbit ceil 30mbit burst 2097152 cburst 2097152',
  'tc filter add dev net1 parent 1: protocol ip prio 2 handle ::0x800 u32 match ip dst 10.1.0.0/16 flowid 1:0xf7ae',
  'tc filter del dev ifb-net1 parent 1: prio 1',
  'tc filter del dev net1 parent 1: protocol ip prio 1 handle 800::2 u32',
  'tc filter del dev net1 parent 1: prio 4',
  'tc class del dev ifb-net1 classid 1:0x3267',
  'tc class del dev net1 classid 1:0x10f5',
  'tc class del dev net1 classid 1:0x1688',
];

const eip = (direction: 'egress' | 'ingress', ip: string, priority: number, rate: string, burst = '1'): EipQos => ({ direction, ip, priority, rate, burst });
const gw = (priority: number, over: Partial<GwQos>): GwQos => ({
  direction: 'egress',
  dev: 'net1',
  priority,
  classifier: 'u32',
  matchType: 'ip',
  matchDirection: 'src',
  cidr: '10.0.0.0/16',
  rate: '100',
  burst: '2',
  ...over,
});
const GW2 = gw(2, {});
const GW3 = gw(3, { classifier: 'matchall', matchType: '', matchDirection: '', cidr: '', rate: '50', burst: '1' });
const GW2B = gw(2, { matchDirection: 'dst', cidr: '10.1.0.0/16', rate: '30' });
const withEips = (s: DesiredState, qs: EipQos[]): DesiredState => qs.reduce((acc, q) => addEipQos(acc, q).state, s);

/** Two EIPs, one ingress (an IFB), a u32 gateway rule and a catch-all (u32 0 0 here). */
const S1 = [GW2, GW3].reduce(
  (s, q) => addGwQos(s, q).state,
  withEips(emptyState('eth0', 'net1'), [eip('egress', '10.98.0.2', 1, '10'), eip('ingress', '10.98.0.3', 1, '5')]),
);
/** Another EIP at priority 1, a rate change, a new priority (a new u32 table), a gateway rule deleted. */
const S2 = delGwQos(
  withEips(S1, [eip('egress', '10.98.0.4', 1, '10'), eip('egress', '10.98.0.2', 1, '20'), eip('egress', '10.98.0.5', 4, '7', '0.5')]),
  GW2,
).state;
/** One node of priority 1 deleted (its table's id named), priority 4 emptied, the IFB's rule gone, priority 2 back. */
const S3 = addGwQos(
  ['10.98.0.4', '10.98.0.5'].reduce((s, ip) => delEipQos(s, 'egress', ip).state, delEipQos(S2, 'ingress', '10.98.0.3').state),
  GW2B,
).state;

const cmd = (c: ExecRequest): string => [c.file, ...c.args].join(' ');
const BATCH = 'tc -batch -';
const isRead = (c: string): boolean => / show( |$)/.test(c);

/** A kernel that answers natgw's reads from `listing()` and, like the dev machines, has neither fq_codel nor matchall. */
function fakeKernel(listing: () => Listing, refuse: (req: ExecRequest) => boolean = () => false) {
  return new RecordingExecutor((req): Partial<ExecResult> | undefined => {
    const c = cmd(req);
    if (refuse(req)) return { exitCode: 2, stderr: 'Error: Specified filter handle not found.\nCommand failed -:3\n' };
    if (c.includes('ngprobe') && (c.endsWith(' fq_codel') || c.includes(' matchall ')))
      return { exitCode: 2, stderr: 'Error: Specified qdisc kind is unknown.\n' };
    if (isRead(c)) return { stdout: listing()[c] ?? '' };
    return undefined;
  });
}

const batch = (x: RecordingExecutor): string | undefined => x.calls.find((c) => cmd(c) === BATCH)?.input;

/** The commands a full sync renders against a kernel that lists `listing` (not a dry run, which would not probe). */
async function fullCommands(s: DesiredState, listing: Listing): Promise<string[]> {
  return (await new QosManager(fakeKernel(() => listing)).sync(s)).commands;
}

describe('QosManager: partial sync', () => {
  it('after a full sync, partial syncs run only tc -batch and render what a full sync (and the real kernel) would', async () => {
    const x = fakeKernel(() => INITIAL);
    const m = new QosManager(x);
    await m.sync(S1);
    expect(x.calls.some((c) => isRead(cmd(c)))).toBe(true);

    x.calls.length = 0;
    const r2 = await m.sync(S2, { mode: 'partial' });
    expect(x.calls.map(cmd)).toEqual([BATCH]);
    expect(r2.commands).toEqual(await fullCommands(S2, AFTER_S1));
    expect(r2.commands).toEqual(S2_REAL);

    x.calls.length = 0;
    const r3 = await m.sync(S3, { mode: 'partial' });
    expect(x.calls.map(cmd)).toEqual([BATCH]);
    expect(r3.commands).toEqual(await fullCommands(S3, AFTER_S2));
    expect(r3.commands).toEqual(S3_REAL);
    expect(batch(x)).toBe(S3_REAL.map((l) => `${l.slice(3)}\n`).join(''));

    x.calls.length = 0;
    expect((await m.sync(S3, { mode: 'partial' })).changes).toBe(0);
    expect(x.calls).toEqual([]);
    expect(await fullCommands(S3, AFTER_S3)).toEqual([]);
  });

  it('a u32 table made from an empty qdisc has a known id, so deleting one of its nodes needs no read', async () => {
    const x = fakeKernel(() => INITIAL);
    const m = new QosManager(x);
    for (const s of [S1, S2, S3]) await m.sync(s, { mode: 'partial' });
    // Tables so far: 800 (prio 1), 801 (prio 2, deleted), 802 (prio 3), 803 (prio 4, deleted), 804 (prio 2 again).
    const s4 = withEips(S3, [eip('egress', '10.98.0.6', 6, '1'), eip('egress', '10.98.0.7', 6, '1')]);
    await m.sync(s4, { mode: 'partial' });
    x.calls.length = 0;
    const r = await m.sync(delEipQos(s4, 'egress', '10.98.0.7').state, { mode: 'partial' });
    expect(x.calls.map(cmd)).toEqual([BATCH]);
    expect(r.commands).toContainEqual(expect.stringMatching(/^tc filter del dev net1 parent 1: protocol ip prio 6 handle 805::2 u32$/));
  });

  it('a table made after a read-back of a qdisc that had u32 tables has an unknown id: a plan naming it reads first', async () => {
    let listing: Listing = AFTER_S1;
    const x = fakeKernel(() => listing);
    const m = new QosManager(x);
    await m.sync(S1);
    const sA = withEips(S1, [eip('egress', '10.98.0.6', 5, '1'), eip('egress', '10.98.0.7', 5, '1')]);
    x.calls.length = 0;
    await m.sync(sA, { mode: 'partial' });
    expect(x.calls.map(cmd)).toEqual([BATCH]);

    // What the kernel holds now: the new priority's table got 803.
    const ids = (ip: string) => sA.eipQos.find((q) => q.ip === ip)!;
    const node = (ip: string, hex: string) => {
      const q = ids(ip);
      return `filter protocol ip pref 5 u32 chain 0 fh 803::${q.handle!.toString(16)} order ${q.handle} key ht 803 bkt 0 *flowid 1:${q.classId!.toString(16)} not_in_hw \n  match ${hex}/ffffffff at 12\n`;
    };
    const cls = (ip: string) =>
      `class htb 1:${ids(ip).classId!.toString(16)} root prio 0 quantum 12500 rate 1Mbit ceil 1Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [07ffff80] cbuffer [07ffff80] \n`;
    listing = {
      ...AFTER_S1,
      'tc -d -raw class show dev net1': AFTER_S1['tc -d -raw class show dev net1']! + cls('10.98.0.6') + cls('10.98.0.7'),
      'tc filter show dev net1 parent 1:':
        AFTER_S1['tc filter show dev net1 parent 1:']! +
        'filter protocol ip pref 5 u32 chain 0 \nfilter protocol ip pref 5 u32 chain 0 fh 803: ht divisor 1 \n' +
        node('10.98.0.6', '0a620006') +
        node('10.98.0.7', '0a620007'),
    };
    x.calls.length = 0;
    const r = await m.sync(delEipQos(sA, 'egress', '10.98.0.7').state, { mode: 'partial' });
    expect(x.calls.some((c) => cmd(c) === 'tc qdisc show')).toBe(true);
    expect(r.commands.join('\n')).toContain(`prio 5 handle 803::${ids('10.98.0.7').handle!.toString(16)} u32`);
    expect(r.commands.join('\n')).not.toContain('?');
  });

  it('a refused batch forgets the view: the next partial sync reads again', async () => {
    let refuse = false;
    const x = fakeKernel(
      () => INITIAL,
      (req) => refuse && cmd(req) === BATCH,
    );
    const m = new QosManager(x);
    await m.sync(S1);
    refuse = true;
    await expect(m.sync(S2, { mode: 'partial' })).rejects.toThrow(/tc -batch - refused the QoS change/);
    refuse = false;
    x.calls.length = 0;
    await m.sync(S2, { mode: 'partial' });
    expect(x.calls.some((c) => cmd(c) === 'tc qdisc show')).toBe(true);
  });

  it('full mode (the default) reads every time; forget() makes partial read', async () => {
    const x = fakeKernel(() => INITIAL);
    const m = new QosManager(x);
    await m.sync(S1);
    x.calls.length = 0;
    await m.sync(S1);
    expect(x.calls.some((c) => cmd(c) === 'tc qdisc show')).toBe(true);
    m.forget();
    x.calls.length = 0;
    await m.sync(S1, { mode: 'partial' });
    expect(x.calls.some((c) => cmd(c) === 'tc qdisc show')).toBe(true);
  });

  it('a dry run plans against the view and never changes it', async () => {
    const x = fakeKernel(() => INITIAL);
    const m = new QosManager(x);
    await m.sync(S1);
    x.calls.length = 0;
    const dry = await m.sync(S2, { mode: 'partial', dryRun: true });
    expect(x.calls).toEqual([]);
    expect((await m.sync(S2, { mode: 'partial' })).commands).toEqual(dry.commands);

    const y = fakeKernel(() => AFTER_S1);
    const n = new QosManager(y);
    await n.sync(S2, { mode: 'partial', dryRun: true });
    y.calls.length = 0;
    await n.sync(S2, { mode: 'partial', dryRun: true });
    expect(y.calls.some((c) => cmd(c) === 'tc qdisc show')).toBe(true);
  });

  it('a missing device is not trusted to stay missing', async () => {
    const x = fakeKernel(() => INITIAL);
    const m = new QosManager(x);
    const s = addGwQos(S1, gw(7, { dev: 'eth7' })).state;
    await expect(m.sync(s)).rejects.toThrow(/not found: eth7/);
    x.calls.length = 0;
    await expect(m.sync(s, { mode: 'partial' })).rejects.toThrow(/not found: eth7/);
    expect(x.calls.some((c) => cmd(c) === 'tc qdisc show')).toBe(true);
  });
});

describe('qosViewAfter (pure)', () => {
  const empty: QosView = {
    kernel: {
      links: [{ name: 'net1', up: true }],
      qdiscs: [{ dev: 'net1', kind: 'noqueue', handle: '0:', parent: 'root' }],
      devices: new Map(),
      ingress: new Map(),
    },
    htidCursors: new Map(),
  };
  const plan = (tc: string[]) => ({ ip: [], tc, notes: [], missing: [] });

  it('deleting the last node of the only u32 priority takes the priority (and the next table is 800: again)', () => {
    const v = qosViewAfter(
      empty,
      plan([
        'qdisc replace dev net1 root handle 1: htb default 0x9999',
        'filter add dev net1 parent 1: protocol ip prio 3 handle ::0x1 u32 match ip src 1.2.3.4/32 flowid 1:0x10',
        'filter del dev net1 parent 1: protocol ip prio 3 handle 800::1 u32',
        'filter add dev net1 parent 1: protocol ip prio 5 handle ::0x1 u32 match ip src 1.2.3.4/32 flowid 1:0x10',
      ]),
    );
    expect(
      v?.kernel.devices
        .get('net1')
        ?.filters.filter((f) => f.isTable)
        .map((f) => [f.pref, f.fh]),
    ).toEqual([[5, '800:']]);
  });

  it('the allocator is cyclic: a freed id is not reused before the others', () => {
    const v = qosViewAfter(
      empty,
      plan([
        'qdisc replace dev net1 root handle 1: htb default 0x9999',
        ...[1, 2, 3].map((p) => `filter add dev net1 parent 1: protocol ip prio ${p} handle ::0x1 u32 match ip src 1.2.3.${p}/32 flowid 1:0x10`),
        'filter del dev net1 parent 1: prio 2',
        'filter add dev net1 parent 1: protocol ip prio 4 handle ::0x1 u32 match ip src 1.2.3.4/32 flowid 1:0x10',
      ]),
    );
    expect(
      v?.kernel.devices
        .get('net1')
        ?.filters.filter((f) => f.isTable)
        .map((f) => f.fh),
    ).toEqual(['800:', '802:', '803:']);
  });

  it('classes are listed the way htb hashes them (checked on Linux 6.18): newest first in a bucket, re-inserted on growth', () => {
    const minors = (tc: string[]) =>
      qosViewAfter(empty, plan(['qdisc replace dev net1 root handle 1: htb default 0x9999', ...tc]))
        ?.kernel.devices.get('net1')
        ?.classes.map((c) => c.minor.toString(16));
    const add = (m: string) => `class add dev net1 parent 1: classid 1:${m} htb rate 1mbit ceil 1mbit`;
    expect(minors(['0x10', '0x18', '0x23'].map(add))).toEqual(['23', '18', '10']);
    expect(minors(['0x10', '0x18', '0x23', '0x2b'].map(add))).toEqual(['10', '18', '23', '2b']);
    expect(minors(['0x10', '0x18', '0x23', '0x2b', '0x11'].map(add))).toEqual(['11', '10', '18', '23', '2b']);
  });

  it('a node re-pointed at another class keeps its handle and keys', () => {
    const v = qosViewAfter(
      empty,
      plan([
        'qdisc replace dev net1 root handle 1: htb default 0x9999',
        'filter add dev net1 parent 1: protocol ip prio 1 handle ::0x5 u32 match ip src 1.2.3.4/32 flowid 1:0x10',
        'filter replace dev net1 parent 1: protocol ip prio 1 handle 800::5 u32 match ip src 1.2.3.4/32 flowid 1:0x20',
      ]),
    );
    const node = v?.kernel.devices.get('net1')?.filters.find((f) => f.node === 5);
    expect(node).toMatchObject({ fh: '800::5', flowid: { major: 1, minor: 0x20 }, keys: [{ value: 0x01020304, mask: 0xffffffff, off: 12 }] });
  });

  it('a command it does not model yields no view at all', () => {
    expect(qosViewAfter(empty, plan(['qdisc add dev net1 clsact']))).toBeUndefined();
  });
});
