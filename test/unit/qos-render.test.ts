import { describe, expect, it } from 'vitest';
import { type DeviceListing, type TcQdisc, parseClasses, parseFilters } from '../../src/dataplane/qos/readback.js';
import { type KernelQos, type QosFeatures, desiredDevices, renderQos } from '../../src/dataplane/qos/render.js';
import type { EipQos, GwQos } from '../../src/model/qos.js';
import { FILTERS } from '../helpers/tcFixtures.js';

const NONE: QosFeatures = { fqCodel: false, matchall: false };
const ALL: QosFeatures = { fqCodel: true, matchall: true };

const eip = (ip: string, classId: number, handle: number, over: Partial<EipQos> = {}): EipQos => ({
  direction: 'egress',
  ip,
  priority: 1,
  rate: '10',
  burst: '1',
  classId,
  handle,
  ...over,
});
const u32 = (cidr: string, classId: number, handle: number, over: Partial<GwQos> = {}): GwQos => ({
  direction: 'egress',
  dev: 'net1',
  priority: 2,
  classifier: 'u32',
  matchType: 'ip',
  matchDirection: 'dst',
  cidr,
  rate: '1.5',
  burst: '0.5',
  classId,
  handle,
  ...over,
});
const matchall = (priority: number, classId: number, over: Partial<GwQos> = {}): GwQos => ({
  direction: 'egress',
  dev: 'net1',
  priority,
  classifier: 'matchall',
  matchType: '',
  matchDirection: '',
  cidr: '',
  rate: '0.5',
  burst: '1.5',
  classId,
  handle: 0xfff,
  ...over,
});

/** Qdiscs as parseQdiscs reads them from `tc -j qdisc show`. */
const htbRoot = (dev: string, defaultMinor = 0x9999): TcQdisc => ({ dev, kind: 'htb', handle: '1:', parent: 'root', defaultMinor });
const otherRoot = (dev: string, kind = 'noqueue'): TcQdisc => ({ dev, kind, handle: '0:', parent: 'root' });
const ingressQdisc = (dev: string): TcQdisc => ({ dev, kind: 'ingress', handle: 'ffff:', parent: 'ffff:fff1' });

/** A kernel snapshot from tc's output, as the manager reads it. */
function kernel(opts: {
  links?: string[];
  qdiscs?: TcQdisc[];
  devices?: Record<string, { classes?: string; filters?: string }>;
  ingress?: Record<string, string>;
}): KernelQos {
  return {
    links: new Map((opts.links ?? ['lo', 'net1', 'eth0']).map((name) => [name, true])),
    qdiscs: opts.qdiscs ?? [],
    devices: new Map(
      [...new Set([...Object.keys(opts.devices ?? {}), ...Object.keys(opts.ingress ?? {})])].map((d): [string, DeviceListing] => [
        d,
        {
          classes: parseClasses(opts.devices?.[d]?.classes ?? ''),
          filters: parseFilters(opts.devices?.[d]?.filters ?? ''),
          ingress: parseFilters(opts.ingress?.[d] ?? ''),
        },
      ]),
    ),
  };
}

const plan = (k: KernelQos, eips: EipQos[], gws: GwQos[] = [], f: QosFeatures = NONE, ext = 'net1') =>
  renderQos(
    desiredDevices(() => ext, eips, gws),
    k,
    f,
  );

// The layout of the captured kernel (iproute2 6.1), matching RULES below exactly.
const QDISCS = [htbRoot('net1'), otherRoot('eth0')];
const CLASSES = `class htb 1:9999 root prio 0 quantum 200000 rate 10Gbit ceil 10Gbit linklayer ethernet burst 0b/1 mpu 0b cburst 0b/1 mpu 0b level 0 buffer [0000000f] cbuffer [0000000f] 
class htb 1:ff03 root prio 0 quantum 6250 rate 500Kbit ceil 500Kbit linklayer ethernet burst 1536Kb/1 mpu 0b cburst 1536Kb/1 mpu 0b level 0 buffer [17700000] cbuffer [17700000] 
class htb 1:b81e root prio 0 quantum 18750 rate 1500Kbit ceil 1500Kbit linklayer ethernet burst 512Kb/1 mpu 0b cburst 512Kb/1 mpu 0b level 0 buffer [029aaaa0] cbuffer [029aaaa0] 
class htb 1:1d3a root prio 0 quantum 125000 rate 10Mbit ceil 10Mbit linklayer ethernet burst 1024Kb/1 mpu 0b cburst 1024Kb/1 mpu 0b level 0 buffer [00c7fff3] cbuffer [00c7fff3] 
`;
const RULES = { eips: [eip('10.98.0.2', 0x1d3a, 1)], gws: [u32('10.98.0.0/16', 0xb81e, 0x800), matchall(3, 0xff03)] };
const captured = (filters = FILTERS, classes = CLASSES) => kernel({ qdiscs: QDISCS, devices: { net1: { classes, filters } } });

describe('renderQos: from nothing', () => {
  it("an egress EIP rule: root htb, default class, the class and a u32 filter with natgw's handle, minors in 0x", () => {
    const p = plan(kernel({ qdiscs: [otherRoot('net1')] }), [eip('1.2.3.4', 0x4495, 1, { rate: '0.5', burst: '1.5' })]);
    expect(p.ip).toEqual([]);
    expect(p.tc).toEqual([
      'qdisc replace dev net1 root handle 1: htb default 0x9999',
      'class add dev net1 parent 1: classid 1:0x9999 htb rate 10000mbit ceil 10000mbit',
      'class add dev net1 parent 1: classid 1:0x4495 htb rate 0.5mbit ceil 0.5mbit burst 1572864 cburst 1572864',
      'filter add dev net1 parent 1: protocol ip prio 1 handle ::0x1 u32 match ip src 1.2.3.4/32 flowid 1:0x4495',
    ]);
  });

  it('caps a burst the kernel cannot hold at the rate (its 32-bit buffer would wrap), and says so', () => {
    const p = plan(kernel({}), [eip('1.2.3.4', 0x4495, 1, { rate: '0.5', burst: '4095' })]);
    expect(p.tc).toContain('class add dev net1 parent 1: classid 1:0x4495 htb rate 0.5mbit ceil 0.5mbit burst 17179869 cburst 17179869');
    expect(p.notes.join('\n')).toMatch(/^INFO: QoS: a burst of 4095 MB at 0.5 Mbit\/s is more than the kernel can hold .* gets 17179869 bytes$/m);
  });

  it('adds an fq_codel leaf per class where the kernel has it', () => {
    const p = plan(kernel({}), [eip('1.2.3.4', 0x4495, 1)], [], ALL);
    expect(p.tc).toContain('qdisc replace dev net1 parent 1:0x4495 fq_codel');
  });

  it('ingress: IFB device, ingress qdisc, the classes on the IFB, then the redirect', () => {
    const p = plan(kernel({}), [eip('1.2.3.4', 0x10, 1, { direction: 'ingress' })]);
    expect(p.ip).toEqual([
      ['link', 'add', 'ifb-net1', 'type', 'ifb'],
      ['link', 'set', 'dev', 'ifb-net1', 'txqueuelen', '1000', 'up'],
    ]);
    expect(p.tc).toEqual([
      'qdisc add dev net1 ingress',
      'qdisc replace dev ifb-net1 root handle 1: htb default 0x9999',
      'class add dev ifb-net1 parent 1: classid 1:0x9999 htb rate 10000mbit ceil 10000mbit',
      'class add dev ifb-net1 parent 1: classid 1:0x10 htb rate 10mbit ceil 10mbit burst 1048576 cburst 1048576',
      'filter add dev ifb-net1 parent 1: protocol ip prio 1 handle ::0x1 u32 match ip dst 1.2.3.4/32 flowid 1:0x10',
      'filter add dev net1 parent ffff: protocol all prio 65535 u32 match u32 0 0 action mirred egress redirect dev ifb-net1',
    ]);
  });

  it('matchall where the kernel has it, else a u32 catch-all at the same priority', () => {
    const with_ = plan(kernel({}), [], [matchall(3, 0xff03)], ALL);
    expect(with_.tc).toContain('filter add dev net1 parent 1: protocol ip prio 3 handle 0xfff matchall flowid 1:0xff03');
    const without = plan(kernel({}), [], [matchall(3, 0xff03)], NONE);
    expect(without.tc).toContain('filter add dev net1 parent 1: protocol ip prio 3 handle ::0xfff u32 match u32 0 0 flowid 1:0xff03');
  });

  it('a matchall sharing a priority with u32 rules becomes a u32 catch-all, with a note', () => {
    const p = plan(kernel({}), [eip('1.2.3.4', 0x10, 1, { priority: 3 })], [matchall(3, 0xff03)], ALL);
    expect(p.tc).toContain('filter add dev net1 parent 1: protocol ip prio 3 handle ::0xfff u32 match u32 0 0 flowid 1:0xff03');
    expect(p.notes.join('\n')).toMatch(/shares priority 3 on net1/);
  });

  it('priority 0 goes to the kernel as 49152', () => {
    expect(plan(kernel({}), [eip('1.2.3.4', 0x10, 1, { priority: 0 })]).tc.at(-1)).toContain(' prio 49152 ');
  });

  it('reports a missing device and renders nothing for it', () => {
    const p = plan(kernel({ links: ['lo'] }), [eip('1.2.3.4', 0x10, 1)], [u32('10.0.0.0/8', 0x8001, 0x800, { dev: 'eth7', direction: 'ingress' })]);
    expect(p.missing).toEqual(['eth7', 'net1']);
    expect(p.tc).toEqual([]);
    expect(p.ip).toEqual([]);
  });
});

describe('renderQos: against a kernel that holds things', () => {
  it('nothing to do when the kernel holds exactly the rules', () => {
    const p = plan(captured(), RULES.eips, RULES.gws);
    expect(p.tc).toEqual([]);
    expect(p.ip).toEqual([]);
  });

  it('a new rate or burst is a class change, in place', () => {
    const p = plan(captured(), [eip('10.98.0.2', 0x1d3a, 1, { rate: '20' })], RULES.gws);
    expect(p.tc).toEqual(['class change dev net1 parent 1: classid 1:0x1d3a htb rate 20mbit ceil 20mbit burst 1048576 cburst 1048576']);
    const q = plan(captured(), [eip('10.98.0.2', 0x1d3a, 1, { burst: '1.01' })], RULES.gws);
    expect(q.tc).toEqual(['class change dev net1 parent 1: classid 1:0x1d3a htb rate 10mbit ceil 10mbit burst 1059062 cburst 1059062']);
  });

  it("a class and filter deleted behind natgw's back are added again", () => {
    const filters = FILTERS.split('\n')
      .filter((l) => !l.includes('800::1') && !l.includes('0a620002'))
      .join('\n');
    const classes = CLASSES.split('\n')
      .filter((l) => !l.includes('1:1d3a'))
      .join('\n');
    const p = plan(captured(filters, classes), RULES.eips, RULES.gws);
    expect(p.tc).toEqual([
      'class add dev net1 parent 1: classid 1:0x1d3a htb rate 10mbit ceil 10mbit burst 1048576 cburst 1048576',
      'filter add dev net1 parent 1: protocol ip prio 1 handle ::0x1 u32 match ip src 10.98.0.2/32 flowid 1:0x1d3a',
    ]);
  });

  it('a removed rule: its filter then its class go, after everything is added; an emptied priority goes whole', () => {
    const p = plan(captured(), [eip('10.98.0.3', 0x1d3b, 2)], [matchall(3, 0xff03)]);
    expect(p.tc).toEqual([
      'class add dev net1 parent 1: classid 1:0x1d3b htb rate 10mbit ceil 10mbit burst 1048576 cburst 1048576',
      'filter add dev net1 parent 1: protocol ip prio 1 handle ::0x2 u32 match ip src 10.98.0.3/32 flowid 1:0x1d3b',
      'filter del dev net1 parent 1: protocol ip prio 1 handle 800::1 u32',
      'filter del dev net1 parent 1: prio 2',
      'class del dev net1 classid 1:0xb81e',
      'class del dev net1 classid 1:0x1d3a',
    ]);
  });

  it('a new match at an existing node is a delete and add (u32 keeps keys on replace); a new class only is a replace', () => {
    const moved = plan(captured(), [eip('10.98.0.9', 0x1d3a, 1)], RULES.gws);
    expect(moved.tc).toEqual([
      'filter del dev net1 parent 1: protocol ip prio 1 handle 800::1 u32',
      'filter add dev net1 parent 1: protocol ip prio 1 handle ::0x1 u32 match ip src 10.98.0.9/32 flowid 1:0x1d3a',
    ]);
    const repointed = plan(captured(), [eip('10.98.0.2', 0x1d3c, 1)], RULES.gws);
    expect(repointed.tc).toEqual([
      'class add dev net1 parent 1: classid 1:0x1d3c htb rate 10mbit ceil 10mbit burst 1048576 cburst 1048576',
      'filter replace dev net1 parent 1: protocol ip prio 1 handle 800::1 u32 match ip src 10.98.0.2/32 flowid 1:0x1d3c',
      'class del dev net1 classid 1:0x1d3a',
    ]);
  });

  it("a priority held by another classifier kind is cleared before natgw's filters go in", () => {
    // The stand-in u32 at prio 3 on a kernel that has matchall: prio 3 becomes a real matchall.
    const p = plan(captured(), RULES.eips, RULES.gws, { fqCodel: false, matchall: true });
    expect(p.tc).toEqual(['filter del dev net1 parent 1: prio 3', 'filter add dev net1 parent 1: protocol ip prio 3 handle 0xfff matchall flowid 1:0xff03']);
  });

  it('moving a rule to another priority adds the new filter before it deletes the old one', () => {
    const p = plan(captured(), [eip('10.98.0.2', 0x1d3a, 1, { priority: 5 })], RULES.gws);
    expect(p.tc).toEqual([
      'filter add dev net1 parent 1: protocol ip prio 5 handle ::0x1 u32 match ip src 10.98.0.2/32 flowid 1:0x1d3a',
      'filter del dev net1 parent 1: prio 1',
    ]);
  });

  it("a root qdisc that is not natgw's is replaced; one with another default is changed", () => {
    expect(plan(kernel({ qdiscs: [otherRoot('net1', 'fq_codel')] }), [eip('1.2.3.4', 0x10, 1)]).tc[0]).toBe(
      'qdisc replace dev net1 root handle 1: htb default 0x9999',
    );
    const k = kernel({
      qdiscs: [htbRoot('net1', 0)],
      devices: { net1: { classes: CLASSES, filters: FILTERS } },
    });
    expect(plan(k, RULES.eips, RULES.gws).tc).toEqual(['qdisc change dev net1 root handle 1: htb default 0x9999']);
  });

  it('an existing IFB and redirect are left alone; a lost redirect comes back', () => {
    const qdiscs = [...QDISCS, ingressQdisc('net1'), htbRoot('ifb-net1')];
    const ifbClasses = 'class htb 1:9999 root prio 0 rate 10Gbit ceil 10Gbit burst 0b cburst 0b buffer [0000000f] cbuffer [0000000f]\n';
    const redirect = `filter protocol all pref 65535 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 terminal flowid not_in_hw \n  match 00000000/00000000 at 0\n\taction order 1: mirred (Egress Redirect to device ifb-net1) stolen\n`;
    const base = { links: ['net1', 'ifb-net1'], qdiscs, devices: { net1: { classes: CLASSES, filters: FILTERS }, 'ifb-net1': { classes: ifbClasses } } };
    const rules = [...RULES.eips, eip('10.98.0.2', 0x1d3a, 1, { direction: 'ingress' })];
    const ok = plan(kernel({ ...base, ingress: { net1: redirect } }), rules, RULES.gws);
    expect(ok.ip).toEqual([]);
    expect(ok.tc.every((l) => l.includes('dev ifb-net1 '))).toBe(true);
    const lost = plan(kernel({ ...base, ingress: { net1: '' } }), rules, RULES.gws);
    expect(lost.tc.at(-1)).toBe('filter add dev net1 parent ffff: protocol all prio 65535 u32 match u32 0 0 action mirred egress redirect dev ifb-net1');
  });

  it('a device natgw shaped before but has no rules for now loses its classes and filters, not its root', () => {
    const p = plan(captured(), [], [], NONE, 'net9');
    expect(p.tc).toEqual([
      'filter del dev net1 parent 1: prio 1',
      'filter del dev net1 parent 1: prio 2',
      'filter del dev net1 parent 1: prio 3',
      'class del dev net1 classid 1:0xff03',
      'class del dev net1 classid 1:0xb81e',
      'class del dev net1 classid 1:0x1d3a',
    ]);
  });

  it("leaves devices that are not natgw's alone", () => {
    const k = kernel({
      qdiscs: [htbRoot('eth0', 0x10)],
      devices: { eth0: { classes: CLASSES, filters: FILTERS } },
    });
    expect(plan(k, [], []).tc).toEqual([]);
  });
});

describe('renderQos: the shared pieces of a change that did not take effect', () => {
  const ingressQdiscs = [...QDISCS, ingressQdisc('net1'), htbRoot('ifb-net1')];
  const redirect = `filter protocol all pref 65535 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 terminal flowid not_in_hw \n  match 00000000/00000000 at 0\n\taction order 1: mirred (Egress Redirect to device ifb-net1) stolen\n`;
  const ifbClasses = `class htb 1:9999 root prio 0 rate 10Gbit ceil 10Gbit burst 0b cburst 0b buffer [0000000f] cbuffer [0000000f]
class htb 1:10 root prio 0 rate 10Mbit ceil 10Mbit burst 1024Kb cburst 1024Kb buffer [00c7fff3] cbuffer [00c7fff3]
`;
  const everything = [
    { kind: 'ifb', dev: 'ifb-net1' },
    { kind: 'ingress', dev: 'net1' },
    { kind: 'redirect', dev: 'net1' },
    { kind: 'root', dev: 'ifb-net1' },
    { kind: 'root', dev: 'net1' },
  ] as const;

  it('a plan names every shared piece it creates, and only those', () => {
    const fresh = plan(kernel({ qdiscs: [otherRoot('net1')] }), [eip('1.2.3.4', 0x10, 1, { direction: 'ingress' }), eip('1.2.3.5', 0x11, 2)]);
    expect(fresh.creates).toEqual(expect.arrayContaining([...everything]));
    expect(fresh.creates).toHaveLength(everything.length);
    // Where they all exist, a new rule creates none.
    const k = kernel({
      links: ['net1', 'ifb-net1'],
      qdiscs: ingressQdiscs,
      devices: { net1: { classes: CLASSES, filters: FILTERS }, 'ifb-net1': { classes: ifbClasses } },
      ingress: { net1: redirect },
    });
    expect(plan(k, [...RULES.eips, eip('1.2.3.4', 0x20, 2, { direction: 'ingress' })], RULES.gws).creates).toEqual([]);
  });

  it('the state needs none of them: redirect and ingress qdisc, the root, then the IFB after the script', () => {
    const k = kernel({
      links: ['net1', 'ifb-net1'],
      qdiscs: ingressQdiscs,
      devices: { net1: { classes: CLASSES, filters: FILTERS }, 'ifb-net1': { classes: ifbClasses } },
      ingress: { net1: redirect },
    });
    const p = renderQos(
      desiredDevices(() => 'net1', [], []),
      k,
      NONE,
      everything,
    );
    // The ingress qdisc takes the redirect with it; the IFB takes its root; nothing else names them.
    expect(p.tc).toEqual(['qdisc del dev net1 ingress', 'qdisc del dev net1 root']);
    expect(p.ipAfter).toEqual([['link', 'del', 'ifb-net1']]);
    expect(p.ip).toEqual([]);
  });

  it('what the state needs stays; a piece the kernel does not hold is not removed', () => {
    const k = kernel({
      links: ['net1', 'ifb-net1'],
      qdiscs: ingressQdiscs,
      devices: { net1: { classes: CLASSES, filters: FILTERS }, 'ifb-net1': { classes: ifbClasses } },
      ingress: { net1: redirect },
    });
    // The egress rules stay (net1's root is needed); the ingress side goes.
    const p = renderQos(
      desiredDevices(() => 'net1', RULES.eips, RULES.gws),
      k,
      NONE,
      everything,
    );
    expect(p.tc.filter((l) => / del /.test(l) && !l.includes('parent 1:'))).toEqual(['qdisc del dev net1 ingress']);
    expect(p.ipAfter).toEqual([['link', 'del', 'ifb-net1']]);
    expect(p.tc.some((l) => l.includes('ifb-net1'))).toBe(false);
    // An ingress rule and an egress rule keep every piece.
    const keep = renderQos(
      desiredDevices(() => 'net1', [...RULES.eips, eip('1.2.3.4', 0x10, 1, { direction: 'ingress' })], RULES.gws),
      k,
      NONE,
      everything,
    );
    expect(keep.ipAfter).toEqual([]);
    expect(keep.tc.filter((l) => /^qdisc del|^filter del dev net1 parent ffff:/.test(l))).toEqual([]);
    // Nothing there (the crash came before the first line): nothing to remove.
    const bare = renderQos(
      desiredDevices(() => 'net1', [], []),
      kernel({ qdiscs: [otherRoot('net1')] }),
      NONE,
      everything,
    );
    expect(bare).toMatchObject({ tc: [], ip: [], ipAfter: [] });
  });

  it('a redirect added to an ingress qdisc that was there before goes on its own, the qdisc stays', () => {
    const k = kernel({ links: ['net1', 'ifb-net1'], qdiscs: ingressQdiscs, ingress: { net1: redirect } });
    const p = renderQos(
      desiredDevices(() => 'net1', [], []),
      k,
      NONE,
      [{ kind: 'redirect', dev: 'net1' }],
    );
    expect(p.tc.filter((l) => l.includes('ffff:') || l.startsWith('qdisc del'))).toEqual(['filter del dev net1 parent ffff: prio 65535']);
  });
});
