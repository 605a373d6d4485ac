/**
 * natgw's QoS read-back against the text real kernels print for the pieces this machine's kernel
 * lacks (fq_codel leaves, matchall filters). The fixtures follow public sources, cited per
 * fixture, and each is first checked against that source's own expectation (the kernel
 * selftests' matchPattern, applied as tdc applies it: DOTALL | MULTILINE), so a fixture cannot
 * drift from what a kernel prints:
 *
 * - Linux tools/testing/selftests/tc-testing/tc-tests/filters/matchall.json (tests 8bd2, 1eb9, 7f09)
 * - iproute2 tc/f_matchall.c matchall_print_opt: "handle 0x%x ", "flowid %s ", flags on their own
 *   line ("\n  not_in_hw"), then the actions; iproute2 tc/tc_filter.c print_filter: a
 *   classifier's header line per priority (no handle), "parent X: " only when `show` was not
 *   given that parent.
 */
import { describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import {
  classifyingFilters,
  parseClasses,
  parseDeviceListing,
  parseFilters,
  parseQdiscs,
  rulesFromKernel,
  shapedDevices,
} from '../../src/dataplane/qos/readback.js';

const tdc = (pattern: string, text: string): number => (text.match(new RegExp(pattern, 'gms')) ?? []).length;

/** matchall.json 8bd2: `tc filter add dev $DUMMY parent ffff: handle 0x1 prio 1 protocol ipv6 matchall classid 1:1 action pass`, shown with `tc filter get`. */
const SELFTEST_8BD2 = `filter parent ffff: protocol ipv6 pref 1 matchall chain 0 handle 0x1 flowid 1:1 
  not_in_hw
	action order 1: gact action pass
	 random type none pass val 0
	 index 1 ref 1 bind 1

`;
/** matchall.json 1eb9 setup (four filters on parent ffff:), then `tc filter show dev $DUMMY parent ffff:` (before the delete). */
const SELFTEST_1EB9 = [1, 2, 3, 4]
  .map(
    (p) => `filter protocol all pref ${p} matchall chain 0 
filter protocol all pref ${p} matchall chain 0 handle 0x${p} flowid 1:${p + 1} 
  not_in_hw
	action order 1: gact action pass
	 random type none pass val 0
	 index ${p} ref 1 bind 1

`,
  )
  .join('');

/** natgw's own gateway matchall rule as `tc filter show dev net1` prints it (no parent given: "parent 1:" printed). */
const NATGW_MATCHALL = `filter parent 1: protocol ip pref 10 matchall chain 0 
filter parent 1: protocol ip pref 10 matchall chain 0 handle 0x1 flowid 1:ff0a 
  not_in_hw
`;
/**
 * natgw's fq_codel leaf under class 1:ff0a in `tc -d -raw qdisc show`: tc_qdisc.c prints kind,
 * handle (with `-raw` its 32 bits in brackets), device, root or parent for every qdisc alike (checked
 * on this machine with a pfifo leaf), and q_fq_codel.c its options.
 */
const NATGW_QDISCS = `qdisc htb 1:[00010000] dev net1 root refcnt 2 r2q 10 default 0x9999 direct_packets_stat 0 ver 3.17 direct_qlen 1000
qdisc fq_codel 8002:[80020000] dev net1 parent 1:ff0a limit 10240p flows 1024 quantum 1514 target 5ms interval 100ms memory_limit 32Mb ecn drop_batch 64 
`;
/**
 * The class line captured on this machine (iproute2 6.1: `tc class add … classid 1:0xff0a htb rate 5mbit
 * ceil 5mbit burst 1048576 cburst 1048576`, then `tc -d -raw class show`), with the "leaf 8002: " field that
 * iproute2's tc_class.c prints for a class holding a leaf qdisc (this kernel cannot attach fq_codel).
 */
const NATGW_CLASSES = `class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
class htb 1:ff0a root leaf 8002: prio 0 quantum 62500 rate 5Mbit ceil 5Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [018ffff6] cbuffer [018ffff6] 
`;

describe('fixtures agree with their sources', () => {
  it("matchall: the selftests' patterns match the fixtures", () => {
    expect(tdc('^filter parent ffff: protocol ipv6 pref 1 matchall.*handle 0x1.*flowid 1:1.*gact action pass.*ref 1 bind 1', SELFTEST_8BD2)).toBe(1);
    // 1eb9 expects 0 matches *after* deleting pref 2; before the delete its pattern finds that filter.
    expect(tdc('^filter protocol all pref 2 matchall.*handle 0x2 flowid 1:3.*gact action pass', SELFTEST_1EB9)).toBe(1);
  });
});

describe('natgw reads real fq_codel and matchall output', () => {
  it('matchall filters: handle (not fh), flowid, the header line left out', () => {
    const f = parseFilters(SELFTEST_8BD2);
    expect(f).toEqual([
      expect.objectContaining({ parent: 'ffff:', protocol: 'ipv6', pref: 1, kind: 'matchall', fh: '0x1', node: 1, flowid: { major: 1, minor: 1 } }),
    ]);
    const all = parseFilters(SELFTEST_1EB9);
    expect(all.filter((x) => x.fh !== undefined).map((x) => [x.pref, x.fh, x.flowid?.minor])).toEqual([
      [1, '0x1', 2],
      [2, '0x2', 3],
      [3, '0x3', 4],
      [4, '0x4', 5],
    ]);
  });

  it('fq_codel leaves: kind, handle and the parent class', () => {
    expect(parseQdiscs(NATGW_QDISCS)).toContainEqual({ dev: 'net1', kind: 'fq_codel', handle: '8002:', parent: '1:ff0a' });
  });

  it('rebuilds a gateway matchall rule with an fq_codel leaf from real output', () => {
    const devices = new Map([['net1', { classes: parseClasses(NATGW_CLASSES), filters: parseFilters(NATGW_MATCHALL) }]]);
    const r = rulesFromKernel(['net1'], [], devices);
    expect(r.qos).toEqual([
      {
        direction: 'egress',
        dev: 'net1',
        priority: 10,
        rate: '5',
        burst: '1',
        classId: 0xff0a,
        classifier: 'matchall',
        matchType: '',
        matchDirection: '',
        cidr: '',
        handle: 1,
      },
    ]);
  });
});

/**
 * Device listings captured on this machine (iproute2 6.1, Linux 6.18) as natgw reads them: one
 * `tc -d -raw -batch -` of `qdisc show dev D`, `class show dev D`, `filter show dev D` and (net1)
 * `filter show dev D parent ffff:`, and `tc qdisc show`. net1 carries an EIP rule (a pfifo leaf:
 * this kernel has no fq_codel), a catch-all and the redirect into ifb-net1, which carries an ingress EIP rule.
 */
const fixture = (name: string): string => readFileSync(new URL(`../fixtures/tc/${name}`, import.meta.url), 'utf8');

describe("natgw reads this machine's tc batch listings", () => {
  it("tells a device's classes, root filters and ingress filters apart (its qdisc lines ignored)", () => {
    const net1 = parseDeviceListing(fixture('listing-net1.txt'));
    expect(net1.classes.map((c) => [c.minor.toString(16), c.rateBits, c.bufferTicks])).toEqual([
      ['9999', 1e10, 0xf],
      ['37fa', 1e7, 0xc7fff3],
      ['ff03', 5e7, 0x27fffd],
    ]);
    expect(classifyingFilters(net1.filters).map((f) => [f.pref, f.fh, f.flowid?.minor.toString(16), f.keys])).toEqual([
      [1, '800::1', '37fa', [{ value: 0x0a620002, mask: 0xffffffff, off: 12 }]],
      [3, '801::fff', 'ff03', [{ value: 0, mask: 0, off: 0 }]],
    ]);
    expect(net1.filters.every((f) => f.parent === '1:')).toBe(true);
    expect(classifyingFilters(net1.ingress)).toEqual([expect.objectContaining({ pref: 65535, redirectTo: 'ifb-net1' })]);

    const ifb = parseDeviceListing(fixture('listing-ifb-net1.txt'));
    expect(ifb.ingress).toEqual([]);
    const devices = new Map([
      ['net1', { classes: net1.classes, filters: net1.filters }],
      ['ifb-net1', { classes: ifb.classes, filters: ifb.filters }],
    ]);
    expect(rulesFromKernel(['net1'], [], devices).eipQos).toEqual([
      { direction: 'egress', ip: '10.98.0.2', priority: 1, rate: '10', burst: '1', classId: 0x37fa, handle: 1 },
      { direction: 'ingress', ip: '10.98.0.3', priority: 1, rate: '5', burst: '1', classId: 0x3267, handle: 1 },
    ]);
  });

  it('reads every qdisc of `tc qdisc show` with its device, and the shaped devices from it', () => {
    const all = parseQdiscs(fixture('qdisc-show.txt'));
    expect(all.map((q) => `${q.dev} ${q.kind} ${q.handle} ${q.parent}`)).toEqual([
      'lo noqueue 0: root',
      'net1p noqueue 0: root',
      'net1 htb 1: root',
      'net1 pfifo 8002: 1:37fa',
      'net1 ingress ffff: ffff:fff1',
      'ifb-net1 htb 1: root',
    ]);
    expect(shapedDevices(all)).toEqual(['net1', 'ifb-net1']);
  });
});
