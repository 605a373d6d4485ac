import { describe, expect, it } from 'vitest';
import {
  MAX_BUFFER_USEC,
  classShaping,
  expectedTicks,
  formatDecimal,
  keysToMatch,
  maxBurstBytes,
  parseClasses,
  parseFilters,
  parseLinks,
  parseQdiscs,
  parseRate,
  programmedBurstBytes,
  rulesFromKernel,
  shapedDevices,
} from '../../src/dataplane/qos/readback.js';
import { rateBytesPerSecond } from '../../src/model/qos.js';
import { FILTERS } from '../helpers/tcFixtures.js';

/** `tc qdisc show` as iproute2 6.1 prints it on Linux 6.18 (the layout natgw writes; the fq_codel leaf as q_fq_codel.c prints its options). */
const QDISCS = `qdisc noqueue 0: dev lo root refcnt 2 
qdisc htb 1: dev net1 root refcnt 3 r2q 10 default 0x9999 direct_packets_stat 0 direct_qlen 1000
qdisc ingress ffff: dev net1 parent ffff:fff1 ---------------- 
qdisc htb 1: dev ifb-net1 root refcnt 2 r2q 10 default 0x9999 direct_packets_stat 0 direct_qlen 32
qdisc fq_codel 8001: dev net1 parent 1:1d3a limit 10240p flows 1024 quantum 1514 target 5ms interval 100ms memory_limit 32Mb ecn drop_batch 64 
qdisc htb 1: dev eth9 root refcnt 2 r2q 10 default 0x10 direct_packets_stat 0 direct_qlen 1000
`;

const CLASSES = `class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
class htb 1:ff03 root prio 0 quantum 6250 rate 500Kbit ceil 500Kbit linklayer ethernet burst 1536Kb/1 mpu 0b cburst 1536Kb/1 mpu 0b level 0 buffer [17700000] cbuffer [17700000] 
class htb 1:b81e root prio 0 quantum 18750 rate 1500Kbit ceil 1500Kbit linklayer ethernet burst 512Kb/1 mpu 0b cburst 512Kb/1 mpu 0b level 0 buffer [029aaaa0] cbuffer [029aaaa0] 
class htb 1:1d3a root leaf 8001: prio 0 quantum 125000 rate 10Mbit ceil 10Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [00c7fff3] cbuffer [00c7fff3] 
`;

const INGRESS = `filter protocol all pref 65535 u32 chain 0 
filter protocol all pref 65535 u32 chain 0 fh 800: ht divisor 1 
filter protocol all pref 65535 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 terminal flowid not_in_hw 
  match 00000000/00000000 at 0
	action order 1: mirred (Egress Redirect to device ifb-net1) stolen
	index 1 ref 1 bind 1
`;

/** iproute2's matchall print (f_matchall.c): handle, flowid, then flags on their own line. */
const MATCHALL = `filter protocol ip pref 3 matchall chain 0 
filter protocol ip pref 3 matchall chain 0 handle 0xfff flowid 1:ff03 
  not_in_hw
`;

describe('tc parsers', () => {
  it('qdiscs: kind, handle, device, parent and the htb default', () => {
    const q = parseQdiscs(QDISCS);
    expect(q).toContainEqual({ dev: 'net1', kind: 'htb', handle: '1:', parent: 'root', defaultMinor: 0x9999 });
    expect(q).toContainEqual({ dev: 'net1', kind: 'ingress', handle: 'ffff:', parent: 'ffff:fff1' });
    expect(q).toContainEqual({ dev: 'net1', kind: 'fq_codel', handle: '8001:', parent: '1:1d3a' });
    // Reading "no qdiscs" from a qdisc line it cannot read would make natgw replace roots it owns.
    expect(() => parseQdiscs('qdisc htb 1: somewhere refcnt 2')).toThrow();
    expect(parseQdiscs('qdisc htb 1:[00010000] dev net1 root refcnt 3 r2q 10 default 0x9999 direct_packets_stat 1 ver 3.17 direct_qlen 1000\n')).toEqual([
      { dev: 'net1', kind: 'htb', handle: '1:', parent: 'root', defaultMinor: 0x9999 },
    ]);
    // A line that names no device cannot be placed.
    expect(() => parseQdiscs('qdisc htb 1: root refcnt 3\n')).toThrow();
  });

  it("shaped devices are those with natgw's root signature", () => {
    expect(shapedDevices(parseQdiscs(QDISCS))).toEqual(['net1', 'ifb-net1']);
  });

  it('classes: id, rates and raw bursts', () => {
    const c = parseClasses(CLASSES);
    expect(c).toHaveLength(4);
    expect(c[3]).toEqual({
      major: 1,
      minor: 0x1d3a,
      parent: 'root',
      rateBits: 10e6,
      ceilBits: 10e6,
      bufferTicks: 0xc7fff3,
      cbufferTicks: 0xc7fff3,
    });
    expect(c[1]).toMatchObject({ minor: 0xff03, rateBits: 500e3, bufferTicks: 0x17700000 });
  });

  it("u32 filters: priority, handle, class and keys; the redirect's target", () => {
    const f = parseFilters(FILTERS);
    const nodes = f.filter((x) => x.node !== undefined);
    expect(nodes.map((x) => [x.pref, x.fh, x.node, x.flowid?.minor])).toEqual([
      [1, '800::1', 1, 0x1d3a],
      [2, '801::800', 0x800, 0xb81e],
      [3, '802::fff', 0xfff, 0xff03],
    ]);
    expect(nodes[0]!.keys).toEqual([{ value: 0x0a620002, mask: 0xffffffff, off: 12 }]);
    expect(f.filter((x) => x.fh !== undefined && x.node === undefined).map((x) => x.fh)).toEqual(['800:', '801:', '802:']);
    const ing = parseFilters(INGRESS).find((x) => x.node !== undefined);
    expect(ing).toMatchObject({ protocol: 'all', pref: 65535, redirectTo: 'ifb-net1' });
    expect(ing?.flowid).toBeUndefined();
  });

  it('matchall filters', () => {
    const f = parseFilters(MATCHALL).find((x) => x.fh);
    expect(f).toMatchObject({ kind: 'matchall', pref: 3, fh: '0xfff', node: 0xfff, flowid: { major: 1, minor: 0xff03 } });
  });

  it('links', () => {
    expect(parseLinks('[{"ifname":"net1","flags":["UP"]},{"ifname":"ifb-net1","flags":[]}]')).toEqual(
      new Map([
        ['net1', true],
        ['ifb-net1', false],
      ]),
    );
    expect(parseLinks('not json')).toEqual(new Map());
  });

  it('rates in tc units', () => {
    expect(parseRate('500Kbit')).toBe(500e3);
    expect(parseRate('10Gbit')).toBe(10e9);
    expect(parseRate('12bit')).toBe(12);
    expect(parseRate('5Mbit')).toBe(5e6);
  });
});

describe('matches', () => {
  it("reads natgw's matches from the u32 keys tc builds for them", () => {
    expect(keysToMatch([{ value: 0x0a620002, mask: 0xffffffff, off: 12 }])).toEqual({ kind: 'ip', dir: 'src', cidr: '10.98.0.2/32' });
    expect(keysToMatch([{ value: 0x0a620000, mask: 0xffff0000, off: 16 }])).toEqual({ kind: 'ip', dir: 'dst', cidr: '10.98.0.0/16' });
    expect(keysToMatch([{ value: 0, mask: 0, off: 16 }])).toEqual({ kind: 'ip', dir: 'dst', cidr: '0.0.0.0/0' });
    expect(keysToMatch([{ value: 0, mask: 0, off: 0 }])).toEqual({ kind: 'all' });
    expect(keysToMatch([{ value: 1, mask: 0xff00ff00, off: 12 }])).toBeUndefined();
    expect(keysToMatch([{ value: 0, mask: 0xff, off: 20 }])).toBeUndefined();
  });
});

describe('burst arithmetic', () => {
  it('predicts the buffer tc programs (tc_calc_xmittime)', () => {
    expect(expectedTicks(rateBytesPerSecond('10'), 1048576)).toBe(0xc7fff3);
    expect(expectedTicks(rateBytesPerSecond('1.5'), 524288)).toBe(0x029aaaa0);
    expect(expectedTicks(rateBytesPerSecond('0.5'), 1572864)).toBe(0x17700000);
  });
  it('reads rate and burst back as natgw decimals', () => {
    const c = parseClasses(CLASSES);
    expect(c.map(classShaping).slice(1)).toEqual([
      { rate: '0.5', burst: '1.5' },
      { rate: '1.5', burst: '0.5' },
      { rate: '10', burst: '1' },
    ]);
    expect(formatDecimal(1.49999976, 5)).toBe('1.5');
    expect(formatDecimal(0.00001, 5)).toBe('0.00001');
    expect(formatDecimal(1234.5, 9)).toBe('1234.5');
  });
});

describe('adoption reads back exactly what would be programmed again', () => {
  /** The class tc makes for rate/burst, as `tc -d -raw class show` prints it (rate as tc's print_rate truncates it). */
  const shown = (printedRate: string, mbit: string, mb: string): string => {
    const ticks = expectedTicks(rateBytesPerSecond(mbit), programmedBurstBytes(mbit, mb)).toString(16).padStart(8, '0');
    return `class htb 1:2a root prio 0 quantum 200000 rate ${printedRate} ceil ${printedRate} linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [${ticks}] cbuffer [${ticks}] \n`;
  };

  it.each([
    ['10Mbit', '10', '1', { rate: '10', burst: '1' }],
    ['500Kbit', '0.5', '1.5', { rate: '0.5', burst: '1.5' }],
    // tc prints 9999Mbit; one µs of buffer is 1.25 KB there, and a rounded reading (0.99882) came out one µs short.
    ['9999Mbit', '9999.999', '1', { rate: '9999', burst: '1' }],
    ['10Tbit', '10000000', '4095', { rate: '10000000', burst: '4095' }],
    // A buffer of 0 µs (a burst below 1.25 MB at 10 Tbit/s) was not adopted at all.
    ['10Tbit', '10000000', '0.000001', { rate: '10000000', burst: '0.6' }],
    // tc prints the rate truncated; the buffer is a time, so at the rate read back it holds a little less.
    ['33333Kbit', '33.3333', '2.5', { rate: '33.333', burst: '2.49998' }],
  ])('%s with %s Mbit/s, %s MB', (printed, mbit, mb, want) => {
    const c = parseClasses(shown(printed, mbit, mb))[0]!;
    const got = classShaping(c);
    expect(got).toEqual(want);
    // Syncing the adopted rule programs the very same buffer: nothing changes.
    expect(expectedTicks(rateBytesPerSecond(got!.rate), programmedBurstBytes(got!.rate, got!.burst))).toBe(c.bufferTicks);
  });

  it('caps a burst whose buffer would overflow the 32-bit ticks tc computes, instead of letting it wrap', () => {
    expect(MAX_BUFFER_USEC).toBe(274877906);
    const rate = rateBytesPerSecond('0.5');
    const cap = maxBurstBytes(rate);
    expect(expectedTicks(rate, cap)).toBeLessThanOrEqual(0xffffffff);
    expect(Math.floor((1e6 * (cap + 1)) / rate)).toBeGreaterThan(MAX_BUFFER_USEC);
    expect(programmedBurstBytes('0.5', '4095')).toBe(cap);
    expect(programmedBurstBytes('10', '1')).toBe(1048576);
    // Read back, the capped class adopts a burst that programs the same buffer again.
    const back = classShaping(
      parseClasses(
        `class htb 1:2a root prio 0 rate 500Kbit ceil 500Kbit burst 0b cburst 0b buffer [${expectedTicks(rate, cap).toString(16)}] cbuffer [0]\n`,
      )[0]!,
    );
    expect(expectedTicks(rate, programmedBurstBytes(back!.rate, back!.burst))).toBe(expectedTicks(rate, cap));
  });
});

describe('rulesFromKernel', () => {
  const devices = new Map([
    ['net1', { classes: parseClasses(CLASSES), filters: parseFilters(FILTERS) }],
    [
      'ifb-net1',
      {
        classes: parseClasses('class htb 1:2a root prio 0 rate 7Mbit ceil 7Mbit burst 1536Kb cburst 1536Kb buffer [01ac923b] cbuffer [01ac923b]\n'),
        filters: parseFilters(
          `filter protocol ip pref 2 u32 chain 0 fh 800::1 order 1 key ht 800 bkt 0 *flowid 1:2a not_in_hw \n  match 0a62008c/ffffffff at 16\n`,
        ),
      },
    ],
    ['eth1', { classes: parseClasses(CLASSES), filters: parseFilters(MATCHALL) }],
  ]);

  it('rebuilds EIP rules from EXT and ifb-EXT, gateway rules from devices, with their ids', () => {
    const r = rulesFromKernel(['net1'], ['eth1'], devices);
    expect(r.eipQos).toEqual([
      { direction: 'egress', ip: '10.98.0.2', priority: 1, rate: '10', burst: '1', classId: 0x1d3a, handle: 1 },
      { direction: 'ingress', ip: '10.98.0.140', priority: 2, rate: '7', burst: '1.5', classId: 0x2a, handle: 1 },
    ]);
    expect(r.qos).toEqual([
      {
        direction: 'egress',
        dev: 'net1',
        priority: 2,
        rate: '1.5',
        burst: '0.5',
        classId: 0xb81e,
        classifier: 'u32',
        matchType: 'ip',
        matchDirection: 'dst',
        cidr: '10.98.0.0/16',
        handle: 0x800,
      },
      {
        direction: 'egress',
        dev: 'net1',
        priority: 3,
        rate: '0.5',
        burst: '1.5',
        classId: 0xff03,
        classifier: 'matchall',
        matchType: '',
        matchDirection: '',
        cidr: '',
        handle: 0xfff,
      },
      {
        direction: 'egress',
        dev: 'eth1',
        priority: 3,
        rate: '0.5',
        burst: '1.5',
        classId: 0xff03,
        classifier: 'matchall',
        matchType: '',
        matchDirection: '',
        cidr: '',
        handle: 0xfff,
      },
    ]);
  });
});
