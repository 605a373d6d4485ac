/**
 * QosManager, full and partial (SyncOptions): a partial sync reads the kernel as a full one does
 * and renders exactly what a full sync renders. The listings are what iproute2 6.1 printed on Linux 6.18 (no fq_codel, no matchall)
 * after a real QosManager applied S1, S2 and S3; S2_REAL and S3_REAL are the commands it ran there.
 */
import { describe, expect, it } from 'vitest';
import { QosManager } from '../../src/dataplane/qos/manager.js';
import type { EipQos, GwQos } from '../../src/model/qos.js';
import { addEipQos, addGwQos, delEipQos, delGwQos } from '../../src/state/qosOperations.js';
import { emptyState, type DesiredState } from '../../src/state/state.js';
import type { ExecRequest, ExecResult } from '../../src/system/exec.js';
import { RecordingExecutor } from '../helpers/execCalls.js';
import { answerQosRead } from '../helpers/tcFixtures.js';

type Listing = Readonly<Record<string, string>>;

const noqueue = (dev: string) => `qdisc noqueue 0: dev ${dev} root refcnt 2 \n`;
const htb = (dev: string) => `qdisc htb 1: dev ${dev} root refcnt 2 r2q 10 default 0x9999 direct_packets_stat 0 direct_qlen 1000\n`;
const SHAPED_QDISCS = [noqueue('lo'), noqueue('eth0'), htb('net1'), 'qdisc ingress ffff: dev net1 parent ffff:fff1 ---------------- \n', htb('ifb-net1')].join(
  '',
);

const INITIAL: Listing = {
  'ip -j link show': `[{"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"]},{"ifname":"eth0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]},{"ifname":"net1","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]}]`,
  'tc qdisc show': [noqueue('lo'), noqueue('eth0'), noqueue('net1')].join(''),
};

const AFTER_S1: Listing = {
  'ip -j link show': `[{"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"]},{"ifname":"eth0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]},{"ifname":"net1","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]},{"ifname":"ifb-net1","flags":["BROADCAST","NOARP","UP","LOWER_UP"]}]`,
  'tc qdisc show': SHAPED_QDISCS,
  'tc class show dev net1': `class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
class htb 1:37fa root prio 0 quantum 125000 rate 10Mbit ceil 10Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [00c7fff3] cbuffer [00c7fff3] 
class htb 1:ff03 root prio 0 quantum 200000 rate 50Mbit ceil 50Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [0027fffd] cbuffer [0027fffd] 
class htb 1:c112 root prio 0 quantum 200000 rate 100Mbit ceil 100Mbit linklayer ethernet burst 2Mb/1 mpu 0b cburst 2Mb/1 mpu 0b level 0 buffer [0027fffd] cbuffer [0027fffd] 
`,
  'tc filter show dev net1': `filter parent 1: protocol ip pref 1 u32 chain 0 
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::1 order 1 key ht 800 bkt 0 *flowid 1:37fa not_in_hw 
  match 0a620002/ffffffff at 12
filter parent 1: protocol ip pref 2 u32 chain 0 
filter parent 1: protocol ip pref 2 u32 chain 0 fh 801: ht divisor 1 
filter parent 1: protocol ip pref 2 u32 chain 0 fh 801::800 order 2048 key ht 801 bkt 0 *flowid 1:c112 not_in_hw 
  match 0a000000/ffff0000 at 12
filter parent 1: protocol ip pref 3 u32 chain 0 
filter parent 1: protocol ip pref 3 u32 chain 0 fh 802: ht divisor 1 
filter parent 1: protocol ip pref 3 u32 chain 0 fh 802::fff order 4095 key ht 802 bkt 0 *flowid 1:ff03 not_in_hw 
  match 00000000/00000000 at 0
`,
  'tc filter show dev net1 parent ffff:': `filter protocol all pref 65535 u32 chain 0 
filter protocol all pref 65535 u32 chain 0 fh 800: ht divisor 1 
filter protocol all pref 65535 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 terminal flowid not_in_hw 
  match 00000000/00000000 at 0
	action order 1: mirred (Egress Redirect to device ifb-net1) stolen
	index 1 ref 1 bind 1

`,
  'tc class show dev ifb-net1': `class htb 1:3267 root prio 0 quantum 62500 rate 5Mbit ceil 5Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [018ffff6] cbuffer [018ffff6] 
class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
`,
  'tc filter show dev ifb-net1': `filter parent 1: protocol ip pref 1 u32 chain 0 
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::1 order 1 key ht 800 bkt 0 *flowid 1:3267 not_in_hw 
  match 0a620003/ffffffff at 16
`,
};

const AFTER_S2: Listing = {
  'ip -j link show': `[{"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"]},{"ifname":"eth0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]},{"ifname":"net1","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]},{"ifname":"ifb-net1","flags":["BROADCAST","NOARP","UP","LOWER_UP"]}]`,
  'tc qdisc show': SHAPED_QDISCS,
  'tc class show dev net1': `class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
class htb 1:37fa root prio 0 quantum 200000 rate 20Mbit ceil 20Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [0063fff9] cbuffer [0063fff9] 
class htb 1:10f5 root prio 0 quantum 87500 rate 7Mbit ceil 7Mbit linklayer ethernet burst 512Kb/1 mpu 0b cburst 512Kb/1 mpu 0b level 0 buffer [008edb69] cbuffer [008edb69] 
class htb 1:ff03 root prio 0 quantum 200000 rate 50Mbit ceil 50Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [0027fffd] cbuffer [0027fffd] 
class htb 1:1688 root prio 0 quantum 125000 rate 10Mbit ceil 10Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [00c7fff3] cbuffer [00c7fff3] 
`,
  'tc filter show dev net1': `filter parent 1: protocol ip pref 1 u32 chain 0 
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::1 order 1 key ht 800 bkt 0 *flowid 1:37fa not_in_hw 
  match 0a620002/ffffffff at 12
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::2 order 2 key ht 800 bkt 0 *flowid 1:1688 not_in_hw 
  match 0a620004/ffffffff at 12
filter parent 1: protocol ip pref 3 u32 chain 0 
filter parent 1: protocol ip pref 3 u32 chain 0 fh 802: ht divisor 1 
filter parent 1: protocol ip pref 3 u32 chain 0 fh 802::fff order 4095 key ht 802 bkt 0 *flowid 1:ff03 not_in_hw 
  match 00000000/00000000 at 0
filter parent 1: protocol ip pref 4 u32 chain 0 
filter parent 1: protocol ip pref 4 u32 chain 0 fh 803: ht divisor 1 
filter parent 1: protocol ip pref 4 u32 chain 0 fh 803::1 order 1 key ht 803 bkt 0 *flowid 1:10f5 not_in_hw 
  match 0a620005/ffffffff at 12
`,
  'tc filter show dev net1 parent ffff:': `filter protocol all pref 65535 u32 chain 0 
filter protocol all pref 65535 u32 chain 0 fh 800: ht divisor 1 
filter protocol all pref 65535 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 terminal flowid not_in_hw 
  match 00000000/00000000 at 0
	action order 1: mirred (Egress Redirect to device ifb-net1) stolen
	index 1 ref 1 bind 1

`,
  'tc class show dev ifb-net1': `class htb 1:3267 root prio 0 quantum 62500 rate 5Mbit ceil 5Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [018ffff6] cbuffer [018ffff6] 
class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
`,
  'tc filter show dev ifb-net1': `filter parent 1: protocol ip pref 1 u32 chain 0 
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::1 order 1 key ht 800 bkt 0 *flowid 1:3267 not_in_hw 
  match 0a620003/ffffffff at 16
`,
};

const AFTER_S3: Listing = {
  'ip -j link show': `[{"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"]},{"ifname":"eth0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]},{"ifname":"net1","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]},{"ifname":"ifb-net1","flags":["BROADCAST","NOARP","UP","LOWER_UP"]}]`,
  'tc qdisc show': SHAPED_QDISCS,
  'tc class show dev net1': `class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
class htb 1:37fa root prio 0 quantum 200000 rate 20Mbit ceil 20Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [0063fff9] cbuffer [0063fff9] 
class htb 1:ff03 root prio 0 quantum 200000 rate 50Mbit ceil 50Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [0027fffd] cbuffer [0027fffd] 
class htb 1:f7ae root prio 0 quantum 200000 rate 30Mbit ceil 30Mbit linklayer ethernet burst 2Mb/1 mpu 0b cburst 2Mb/1 mpu 0b level 0 buffer [0085554d] cbuffer [0085554d] 
`,
  'tc filter show dev net1': `filter parent 1: protocol ip pref 1 u32 chain 0 
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::1 order 1 key ht 800 bkt 0 *flowid 1:37fa not_in_hw 
  match 0a620002/ffffffff at 12
filter parent 1: protocol ip pref 2 u32 chain 0 
filter parent 1: protocol ip pref 2 u32 chain 0 fh 804: ht divisor 1 
filter parent 1: protocol ip pref 2 u32 chain 0 fh 804::800 order 2048 key ht 804 bkt 0 *flowid 1:f7ae not_in_hw 
  match 0a010000/ffff0000 at 16
filter parent 1: protocol ip pref 3 u32 chain 0 
filter parent 1: protocol ip pref 3 u32 chain 0 fh 802: ht divisor 1 
filter parent 1: protocol ip pref 3 u32 chain 0 fh 802::fff order 4095 key ht 802 bkt 0 *flowid 1:ff03 not_in_hw 
  match 00000000/00000000 at 0
`,
  'tc filter show dev net1 parent ffff:': `filter protocol all pref 65535 u32 chain 0 
filter protocol all pref 65535 u32 chain 0 fh 800: ht divisor 1 
filter protocol all pref 65535 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 terminal flowid not_in_hw 
  match 00000000/00000000 at 0
	action order 1: mirred (Egress Redirect to device ifb-net1) stolen
	index 1 ref 1 bind 1

`,
  'tc class show dev ifb-net1': `class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
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
const LISTING = 'tc -d -raw -batch -';
const isRead = (c: string): boolean => c === LISTING || c === 'tc qdisc show' || c === 'ip -j link show';
/** The lines the device listings asked tc for. */
const listed = (x: RecordingExecutor): string[] =>
  x.calls.filter((c) => cmd(c) === LISTING).flatMap((c) => (c.input ?? '').split('\n').filter((l) => l !== ''));
/** The devices whose classes a sync read. */
const classReads = (x: RecordingExecutor): string[] =>
  listed(x)
    .filter((l) => l.startsWith('class show dev '))
    .map((l) => l.split(' ').at(-1)!)
    .sort();

/** A kernel that answers natgw's reads from `listing()` and, like the dev machines, has neither fq_codel nor matchall. */
function fakeKernel(listing: () => Listing) {
  return new RecordingExecutor((req): Partial<ExecResult> | undefined => {
    const c = cmd(req);
    if (c.includes('ngprobe') && (c.endsWith(' fq_codel') || c.includes(' matchall ')))
      return { exitCode: 2, stderr: 'Error: Specified qdisc kind is unknown.\n' };
    return answerQosRead(req, listing());
  });
}

/** The commands a full sync renders against a kernel that lists `listing` (not a dry run, which would not probe). */
async function fullCommands(s: DesiredState, listing: Listing): Promise<string[]> {
  return (await new QosManager(fakeKernel(() => listing)).sync(s)).commands;
}

describe('QosManager: partial syncs', () => {
  it('read what their plan needs and render what a full sync (and the real kernel) would', async () => {
    let listing = INITIAL;
    const x = fakeKernel(() => listing);
    const m = new QosManager(x);
    await m.sync(S1);
    // ifb-net1 does not exist yet: `ip` says so, and it is not listed.
    expect(classReads(x)).toEqual(['net1']);

    listing = AFTER_S1;
    x.calls.length = 0;
    const r2 = await m.sync(S2, { mode: 'partial' });
    expect(classReads(x)).toEqual(['ifb-net1', 'net1']);
    expect(x.calls.map(cmd).filter((c) => !isRead(c))).toEqual([BATCH]);
    expect(r2.commands).toEqual(await fullCommands(S2, AFTER_S1));
    expect(r2.commands).toEqual(S2_REAL);

    // S2 → S3 also drops the ingress rule: the redirect on net1 is read too.
    listing = AFTER_S2;
    x.calls.length = 0;
    const r3 = await m.sync(S3, { mode: 'partial' });
    expect(listed(x)).toContain('filter show dev net1 parent ffff:');
    expect(r3.commands).toEqual(await fullCommands(S3, AFTER_S2));
    expect(r3.commands).toEqual(S3_REAL);

    listing = AFTER_S3;
    expect((await m.sync(S3, { mode: 'partial' })).changes).toBe(0);
  });

  it("prints the probe's line as a full sync does, even where the devices it plans keep no class", async () => {
    const s = delEipQos(S1, 'ingress', '10.98.0.3').state;
    const partial = await new QosManager(fakeKernel(() => AFTER_S1)).sync(s, { mode: 'partial' });
    const full = await new QosManager(fakeKernel(() => AFTER_S1)).sync(s);
    expect(partial.notes).toEqual(full.notes);
    expect(partial.notes).toContainEqual(expect.stringMatching(/^INFO: QoS kernel probe: /));
  });
});
