import { ConflictError, ValidationError } from '../model/errors.js';
import {
  type ClassRange,
  type Direction,
  type EipQos,
  type GwQos,
  type GwQosId,
  CLASS_RANGES,
  DEFAULT_CLASS,
  GW_HANDLE_MIN,
  HANDLE_MAX,
  HANDLE_MIN,
  CATCH_ALL_HANDLE,
  classRangeOf,
  eipFirstClassId,
  eipQosKey,
  gwFirstClassId,
  gwQosKey,
  ifbNameIssue,
  qosDevice,
  tcPrio,
} from '../model/qos.js';
import { changedTo, unchanged, type OpResult } from './operations.js';
import type { DesiredState } from './state.js';
import { eipUplinkOf } from '../model/uplinks.js';

/**
 * Pure QoS operations over the desired state (SPEC §2 QoS, §3.4). An add is an upsert by
 * identity (re-adding updates the rate in place); a delete is lenient. Every rule carries
 * its tc class id and u32 handle, allocated here against the ids the state already holds,
 * so the allocation is deterministic, collision-free and survives a restart with the state.
 */

/** Deterministic linear probe from the first choice, wrapping inside the range. */
export function probeClassId(range: ClassRange, first: number, used: ReadonlySet<number>, device = ''): number {
  const { min, max } = CLASS_RANGES[range];
  const size = max - min + 1;
  for (let i = 0; i < size; i++) {
    const id = min + ((first - min + i) % size);
    if (id !== DEFAULT_CLASS && !used.has(id)) return id;
  }
  throw new ConflictError(`Error: no free QoS class id left in ${range} range on device ${device}`);
}

/**
 * The lowest free u32 node id at one device and priority, in the rule's half (EIP low,
 * gateway high; the other half when that is full): filters of a kind keep the order in
 * which they came, and EIP rules run before gateway rules of the same priority.
 */
export function lowestFreeHandle(used: ReadonlySet<number>, half: 'eip' | 'gw' = 'eip', device = '', prio = 0): number {
  const low = [HANDLE_MIN, GW_HANDLE_MIN - 1] as const;
  const high = [GW_HANDLE_MIN, HANDLE_MAX] as const;
  for (const [from, to] of half === 'eip' ? [low, high] : [high, low]) {
    for (let h = from; h <= to; h++) if (!used.has(h)) return h;
  }
  throw new ConflictError(`Error: no free QoS filter handle left on device ${device} priority ${prio}`);
}

/** Kernel-held ids to prefer for rules that have none (a state file written without them). */
export interface AllocationHints {
  readonly eipQos?: readonly EipQos[];
  readonly qos?: readonly GwQos[];
}

/** A rule, the device that holds its class and filter, the range its class id comes from, and the kernel's ids for it. */
interface Slot {
  readonly rule: EipQos | GwQos;
  readonly device: string;
  readonly range: ClassRange;
  readonly first: number;
  readonly hint: EipQos | GwQos | undefined;
}

/**
 * Give every QoS rule a valid class id and handle. Rules keep the ids they have where
 * those are in range and not taken by an earlier rule on the same device (first come,
 * first served, in state order); the others get a hinted id, their first choice, or the
 * next free id. Duplicate identities keep the last one. Deterministic for a given state.
 */
export function allocateQos(s: DesiredState, hints: AllocationHints = {}): DesiredState {
  const extOf = eipUplinkOf(s);
  const eipQos = dedupe(s.eipQos, eipQosKey);
  const qos = dedupe(s.qos, gwQosKey);
  const eipHints = new Map((hints.eipQos ?? []).map((h) => [eipQosKey(h), h]));
  const gwHints = new Map((hints.qos ?? []).map((h) => [gwQosKey(h), h]));
  const slot = (rule: EipQos | GwQos, dev: string, range: ClassRange, first: number, hint: Slot['hint']): Slot => ({
    rule,
    device: qosDevice(rule.direction, dev),
    range,
    first,
    hint,
  });
  const ids = assignIds([
    ...eipQos.map((q) => slot(q, extOf(q.ip), 'eip', eipFirstClassId(q.ip), eipHints.get(eipQosKey(q)))),
    ...qos.map((q) => slot(q, q.dev, q.classifier === 'matchall' ? 'matchall' : 'gw', gwFirstClassId(q), gwHints.get(gwQosKey(q)))),
  ]);
  const eipOut = eipQos.map((q, i) => withIds(q, ids[i]!));
  const gwOut = qos.map((q, i) => withIds(q, ids[eipQos.length + i]!));
  const same = <T>(a: readonly T[], b: readonly T[]) => a.length === b.length && a.every((q, i) => q === b[i]);
  return same(eipOut, s.eipQos) && same(gwOut, s.qos) ? s : { ...s, eipQos: eipOut, qos: gwOut };
}

/** Class ids are unique per device, handles per device and priority: the rules' own ids first, then the rest. */
function assignIds(slots: readonly Slot[]): { classId: number; handle: number }[] {
  const used = new Map<string, Set<number>>();
  const usedAt = (key: string): Set<number> => used.get(key) ?? used.set(key, new Set()).get(key)!;
  /** `id`, taken at `key`, where it is given, valid and free. */
  const claim = (key: string, id: number | undefined, valid: (id: number) => boolean = () => true): number | undefined => {
    if (id === undefined || !valid(id) || usedAt(key).has(id)) return undefined;
    usedAt(key).add(id);
    return id;
  };
  const classesOf = (sl: Slot): string => `class ${sl.device}`;
  const handlesOf = (sl: Slot): string => `handle ${sl.device} ${tcPrio(sl.rule.priority)}`;
  const inRange = (sl: Slot) => (id: number) => classRangeOf(id) === sl.range;
  const kept = slots.map((sl) => ({
    classId: claim(classesOf(sl), sl.rule.classId, inRange(sl)),
    // A matchall rule (or its u32 stand-in) is its priority's one catch-all, with a fixed handle.
    handle: sl.range === 'matchall' ? claim(handlesOf(sl), CATCH_ALL_HANDLE) : claim(handlesOf(sl), sl.rule.handle, (h) => h <= HANDLE_MAX),
  }));
  return slots.map((sl, i) => {
    // A hint's handle counts only where it describes the rule at the same priority (a handle is per priority).
    const hintHandle = sl.hint && tcPrio(sl.hint.priority) === tcPrio(sl.rule.priority) ? sl.hint.handle : undefined;
    const classId =
      kept[i]!.classId ??
      claim(classesOf(sl), sl.hint?.classId, inRange(sl)) ??
      claim(classesOf(sl), probeClassId(sl.range, sl.first, usedAt(classesOf(sl)), sl.device))!;
    const handle =
      kept[i]!.handle ??
      claim(handlesOf(sl), hintHandle, (h) => h <= HANDLE_MAX) ??
      claim(handlesOf(sl), lowestFreeHandle(usedAt(handlesOf(sl)), sl.range === 'eip' ? 'eip' : 'gw', sl.device, tcPrio(sl.rule.priority)))!;
    return { classId, handle };
  });
}

function withIds<T extends EipQos | GwQos>(q: T, ids: { classId: number; handle: number }): T {
  return q.classId === ids.classId && q.handle === ids.handle ? q : { ...q, classId: ids.classId, handle: ids.handle };
}

function dedupe<T>(xs: readonly T[], key: (x: T) => string): T[] {
  const last = new Map<string, number>();
  xs.forEach((x, i) => last.set(key(x), i));
  return xs.filter((x, i) => last.get(key(x)) === i);
}

const sameShaping = (a: EipQos | GwQos, b: EipQos | GwQos): boolean => a.priority === b.priority && a.rate === b.rate && a.burst === b.burst;

/**
 * The rules with `q` in place of the one of its identity (or added), or undefined when that one
 * already shapes the same. A re-added rule keeps its class (tc class change, in place) and its
 * handle while the priority stays (a handle is per priority).
 */
function upsert<T extends EipQos | GwQos>(rules: readonly T[], key: (q: T) => string, q: T): T[] | undefined {
  const at = rules.findIndex((x) => key(x) === key(q));
  const existing = at === -1 ? undefined : rules[at];
  if (existing && sameShaping(existing, q) && existing.classId !== undefined && existing.handle !== undefined) return undefined;
  const samePrio = existing !== undefined && tcPrio(existing.priority) === tcPrio(q.priority);
  const rule: T = { ...q, classId: existing?.classId ?? q.classId, handle: existing ? (samePrio ? existing.handle : undefined) : q.handle };
  return at === -1 ? [...rules, rule] : rules.map((x, j) => (j === at ? rule : x));
}

/** The rules without the one whose identity is `key`, or undefined when there is none (a lenient delete). */
function without<T>(rules: readonly T[], keyOf: (q: T) => string, key: string): T[] | undefined {
  return rules.some((x) => keyOf(x) === key) ? rules.filter((x) => keyOf(x) !== key) : undefined;
}

export function addEipQos(s: DesiredState, q: EipQos): OpResult {
  const ifbIssue = q.direction === 'ingress' ? ifbNameIssue(eipUplinkOf(s)(q.ip)) : undefined;
  if (ifbIssue) throw new ValidationError(`Error: invalid eip-ingress-qos rule: ${ifbIssue}`);
  const eipQos = upsert(s.eipQos, eipQosKey, q);
  return eipQos ? changedTo(s, allocateQos({ ...s, eipQos })) : unchanged(s);
}

export function delEipQos(s: DesiredState, direction: Direction, ip: string): OpResult {
  const eipQos = without(s.eipQos, eipQosKey, eipQosKey({ direction, ip }));
  return eipQos ? changedTo(s, { ...s, eipQos }) : unchanged(s);
}

/** A gateway rule's IFB name was checked with its fields (gwQosShapeIssues). */
export function addGwQos(s: DesiredState, q: GwQos): OpResult {
  const qos = upsert(s.qos, gwQosKey, q);
  return qos ? changedTo(s, allocateQos({ ...s, qos })) : unchanged(s);
}

export function delGwQos(s: DesiredState, id: GwQosId): OpResult {
  const qos = without(s.qos, gwQosKey, gwQosKey(id));
  return qos ? changedTo(s, { ...s, qos }) : unchanged(s);
}
