import { describe, expect, it } from 'vitest';
import { ConflictError, ValidationError } from '../../src/model/errors.js';
import {
  type EipQos,
  type GwQos,
  CATCH_ALL_HANDLE,
  CLASS_RANGES,
  DEFAULT_CLASS,
  GW_HANDLE_MIN,
  eipFirstClassId,
  gwFirstClassId,
  gwQosKey,
  tcPrio,
} from '../../src/model/qos.js';
import { addEipQos, addGwQos, allocateQos, delEipQos, delGwQos, lowestFreeHandle, probeClassId } from '../../src/state/qosOperations.js';
import { emptyState, type DesiredState } from '../../src/state/state.js';

const base = (ext = 'net1'): DesiredState => emptyState('eth0', ext);
const eip = (ip: string, over: Partial<EipQos> = {}): EipQos => ({ direction: 'egress', ip, priority: 1, rate: '10', burst: '1', ...over });
const u32 = (cidr: string, over: Partial<GwQos> = {}): GwQos => ({
  direction: 'egress',
  dev: 'net1',
  priority: 2,
  classifier: 'u32',
  matchType: 'ip',
  matchDirection: 'src',
  cidr,
  rate: '10',
  burst: '1',
  ...over,
});
const matchall = (priority: number, over: Partial<GwQos> = {}): GwQos => ({
  direction: 'egress',
  dev: 'net1',
  priority,
  classifier: 'matchall',
  matchType: '',
  matchDirection: '',
  cidr: '',
  rate: '10',
  burst: '1',
  ...over,
});

function apply(s: DesiredState, ...rules: (EipQos | GwQos)[]): DesiredState {
  for (const r of rules) s = 'classifier' in r ? addGwQos(s, r).state : addEipQos(s, r).state;
  return s;
}

/** Two addresses whose first-choice EIP class ids relate as `pred` says. */
function pair(pred: (a: number, b: number) => boolean): [string, string] {
  const seen: { ip: string; id: number }[] = [];
  for (let i = 1; i < 200_000; i++) {
    const ip = `10.${(i >> 16) & 0xff}.${(i >> 8) & 0xff}.${i & 0xff}`;
    const id = eipFirstClassId(ip);
    const hit = seen.find((x) => pred(x.id, id));
    if (hit) return [hit.ip, ip];
    seen.push({ ip, id });
  }
  throw new Error('no pair');
}

describe('first-choice class ids', () => {
  it('hash addresses deterministically into their ranges, never 0x9999', () => {
    for (let i = 0; i < 2000; i++) {
      const ip = `172.16.${i >> 8}.${i & 0xff}`;
      const e = eipFirstClassId(ip);
      expect(e).toBe(eipFirstClassId(ip));
      expect(e >= CLASS_RANGES.eip.min && e <= CLASS_RANGES.eip.max).toBe(true);
      const g = gwFirstClassId({ classifier: 'u32', priority: 1, matchDirection: 'src', cidr: `${ip}/32` });
      expect(g >= CLASS_RANGES.gw.min && g <= CLASS_RANGES.gw.max && g !== DEFAULT_CLASS).toBe(true);
    }
  });
  it('matchall: 0xff00 + (priority mod 255)', () => {
    expect(gwFirstClassId({ classifier: 'matchall', priority: 3, matchDirection: '', cidr: '' })).toBe(0xff03);
    expect(gwFirstClassId({ classifier: 'matchall', priority: 256, matchDirection: '', cidr: '' })).toBe(0xff01);
    expect(gwFirstClassId({ classifier: 'matchall', priority: 254, matchDirection: '', cidr: '' })).toBe(0xfffe);
  });
});

describe('probing', () => {
  it('steps to the next free id, wraps inside the range and skips the default class', () => {
    expect(probeClassId('eip', 0x10, new Set([0x10, 0x11]))).toBe(0x12);
    expect(probeClassId('eip', 0x7ffe, new Set([0x7ffe]))).toBe(0x1);
    expect(probeClassId('gw', 0x9998, new Set([0x9998]))).toBe(0x999a);
    expect(probeClassId('matchall', 0xfffe, new Set([0xfffe]))).toBe(0xff00);
  });
  it('reports a full range as a conflict', () => {
    const all = new Set<number>();
    for (let i = CLASS_RANGES.matchall.min; i <= CLASS_RANGES.matchall.max; i++) all.add(i);
    expect(() => probeClassId('matchall', 0xff00, all, 'net1')).toThrow(ConflictError);
  });
  it('hands out handles from the low half for EIP rules and the high half for gateway rules', () => {
    expect(lowestFreeHandle(new Set(), 'eip')).toBe(1);
    expect(lowestFreeHandle(new Set([1, 2]), 'eip')).toBe(3);
    expect(lowestFreeHandle(new Set(), 'gw')).toBe(GW_HANDLE_MIN);
    const low = new Set<number>();
    for (let h = 1; h < GW_HANDLE_MIN; h++) low.add(h);
    expect(lowestFreeHandle(low, 'eip')).toBe(GW_HANDLE_MIN);
  });
});

describe('addEipQos', () => {
  it('takes the first choice when it is free', () => {
    const s = apply(base(), eip('1.2.3.4'));
    expect(s.eipQos[0]).toMatchObject({ classId: eipFirstClassId('1.2.3.4'), handle: 1 });
  });

  it('resolves a forced collision to a distinct id, deterministically', () => {
    const [a, b] = pair((x, y) => x === y);
    const s = apply(base(), eip(a), eip(b));
    const [ra, rb] = s.eipQos;
    expect(ra!.classId).toBe(eipFirstClassId(a));
    expect(rb!.classId).toBe(eipFirstClassId(a) === CLASS_RANGES.eip.max ? CLASS_RANGES.eip.min : eipFirstClassId(a) + 1);
    expect(new Set([ra!.handle, rb!.handle]).size).toBe(2);
    expect(apply(base(), eip(a), eip(b))).toEqual(s);
  });

  it("gives ids that differ only above bit 12 distinct handles (the script's ENOSPC)", () => {
    const [a, b] = pair((x, y) => x !== y && (x & 0xfff) === (y & 0xfff));
    const s = apply(base(), eip(a), eip(b));
    expect(s.eipQos.map((q) => q.handle)).toEqual([1, 2]);
  });

  it('allocates per device: the same address egress and ingress may share a class id', () => {
    const s = apply(base(), eip('1.2.3.4'), eip('1.2.3.4', { direction: 'ingress' }));
    expect(s.eipQos).toHaveLength(2);
    expect(s.eipQos[0]!.classId).toBe(s.eipQos[1]!.classId);
  });

  it('re-adding updates the rate in place, keeping class and handle', () => {
    const s1 = apply(base(), eip('1.2.3.4'), eip('1.2.3.5'));
    const s2 = addEipQos(s1, eip('1.2.3.4', { rate: '20', burst: '2' })).state;
    expect(s2.eipQos).toHaveLength(2);
    expect(s2.eipQos[0]).toEqual({ ...s1.eipQos[0], rate: '20', burst: '2' });
    expect(s2.eipQos[1]).toBe(s1.eipQos[1]);
  });

  it('an identical re-add changes nothing', () => {
    const s1 = apply(base(), eip('1.2.3.4'));
    expect(addEipQos(s1, eip('1.2.3.4')).state).toBe(s1);
  });

  it('a new priority keeps the class but takes a handle at the new priority', () => {
    const s1 = apply(base(), eip('1.2.3.4'), eip('1.2.3.5', { priority: 5 }));
    const s2 = addEipQos(s1, eip('1.2.3.4', { priority: 5 })).state;
    const moved = s2.eipQos[0]!;
    expect(moved.classId).toBe(s1.eipQos[0]!.classId);
    expect(moved.priority).toBe(5);
    expect(moved.handle).toBe(2);
  });

  it("rejects ingress shaping when ifb-<EXT> would exceed the kernel's name limit", () => {
    expect(() => addEipQos(base('abcdefghijkl'), eip('1.2.3.4', { direction: 'ingress' }))).toThrow(ValidationError);
    expect(() => addEipQos(base('abcdefghijkl'), eip('1.2.3.4'))).not.toThrow();
  });
});

describe('delEipQos', () => {
  it('removes exactly that rule; absent is success with no change', () => {
    const [a, b] = pair((x, y) => x === y);
    const s = apply(base(), eip(a), eip(b), eip(a, { direction: 'ingress' }));
    const s2 = delEipQos(s, 'egress', a).state;
    expect(s2.eipQos.map((q) => `${q.direction} ${q.ip}`)).toEqual([`egress ${b}`, `ingress ${a}`]);
    expect(s2.eipQos[0]).toBe(s.eipQos[1]);
    expect(delEipQos(s2, 'egress', a).state).toBe(s2);
  });
});

describe('gateway rules', () => {
  it('u32 classes come from 0x8000-0xfeff and handles from the high half; matchall takes 0xff00+prio and the catch-all handle', () => {
    const s = apply(base(), u32('10.0.0.0/8'), matchall(3));
    const [u, m] = s.qos;
    expect(u!.classId).toBe(gwFirstClassId(u!));
    expect(u!.handle).toBe(GW_HANDLE_MIN);
    expect(m).toMatchObject({ classId: 0xff03, handle: CATCH_ALL_HANDLE });
  });

  it('two matchall rules whose priorities agree mod 255 get distinct classes', () => {
    const s = apply(base(), matchall(1), matchall(256));
    expect(s.qos.map((q) => q.classId)).toEqual([0xff01, 0xff02]);
  });

  it('identity is (direction, dev, priority, classifier, matchDirection, cidr); a delete removes only that one', () => {
    const s = apply(
      base(),
      u32('10.0.0.0/8'),
      u32('10.0.0.0/8', { matchDirection: 'dst' }),
      u32('10.0.0.0/8', { priority: 3 }),
      u32('10.0.0.0/8', { direction: 'ingress' }),
    );
    expect(s.qos).toHaveLength(4);
    const s2 = delGwQos(s, u32('10.0.0.0/8', { rate: 'ignored' })).state;
    expect(s2.qos.map(gwQosKey)).toEqual(s.qos.slice(1).map(gwQosKey));
    expect(delGwQos(s2, u32('10.0.0.0/8')).state).toBe(s2);
  });

  it('re-adding updates the rate and keeps ids', () => {
    const s1 = apply(base(), u32('10.0.0.0/8'));
    const s2 = addGwQos(s1, u32('10.0.0.0/8', { rate: '99' })).state;
    expect(s2.qos[0]).toEqual({ ...s1.qos[0], rate: '99' });
  });

  it("priority 0 is the kernel's 49152 for identity and handles", () => {
    expect(tcPrio(0)).toBe(49152);
    expect(gwQosKey(u32('10.0.0.0/8', { priority: 0 }))).toBe(gwQosKey(u32('10.0.0.0/8', { priority: 49152 })));
  });

  it('EIP and gateway rules on one device never share a class id', () => {
    const s = apply(base(), eip('1.2.3.4'), u32('1.2.3.4/32', { dev: 'net1' }), matchall(1));
    const ids = s.eipQos.map((q) => q.classId).concat(s.qos.map((q) => q.classId));
    expect(new Set(ids).size).toBe(3);
  });
});

describe('allocateQos', () => {
  it('fills missing ids, keeps valid ones, and re-allocates a later duplicate or an out-of-range id', () => {
    const s: DesiredState = {
      ...base(),
      eipQos: [
        eip('1.2.3.4', { classId: 0x100, handle: 7 }),
        eip('1.2.3.5', { classId: 0x100, handle: 7 }),
        eip('1.2.3.6', { classId: 0x9000 }),
        eip('1.2.3.7'),
      ],
    };
    const out = allocateQos(s).eipQos;
    expect(out[0]).toMatchObject({ classId: 0x100, handle: 7 });
    expect(out[1]!.classId).not.toBe(0x100);
    expect(out[1]!.handle).not.toBe(7);
    expect(out[2]!.classId).toBe(eipFirstClassId('1.2.3.6'));
    expect(out[3]!.classId).toBe(eipFirstClassId('1.2.3.7'));
    expect(new Set(out.map((q) => q.handle)).size).toBe(4);
    expect(allocateQos({ ...s, eipQos: out })).toEqual({ ...s, eipQos: out });
  });

  it('returns the same state when nothing is missing', () => {
    const s = apply(base(), eip('1.2.3.4'), u32('10.0.0.0/8'));
    expect(allocateQos(s)).toBe(s);
  });

  it("prefers the kernel's ids (hints) for rules that have none", () => {
    const s: DesiredState = { ...base(), eipQos: [eip('1.2.3.4')], qos: [u32('10.0.0.0/8')] };
    const out = allocateQos(s, { eipQos: [eip('1.2.3.4', { classId: 0x4495, handle: 0x495 })], qos: [u32('10.0.0.0/8', { classId: 0x8888, handle: 0x801 })] });
    expect(out.eipQos[0]).toMatchObject({ classId: 0x4495, handle: 0x495 });
    expect(out.qos[0]).toMatchObject({ classId: 0x8888, handle: 0x801 });
  });

  it('drops duplicate identities, keeping the last', () => {
    const s: DesiredState = { ...base(), eipQos: [eip('1.2.3.4', { rate: '1' }), eip('1.2.3.4', { rate: '2' })] };
    expect(allocateQos(s).eipQos.map((q) => q.rate)).toEqual(['2']);
  });
});
