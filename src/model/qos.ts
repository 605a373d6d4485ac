import { z } from 'zod';
import { ipv4Schema, ifnameSchema } from './rules.js';
import { parseCidr, formatCidr } from './net.js';

/**
 * QoS rules (SPEC §2 QoS). Rates are megabits per second and bursts megabytes, both
 * positive decimals kept in canonical decimal text ("0.5", "10", never "010" or "10.0"),
 * so that two spellings of one value compare equal and render identically.
 */

const DECIMAL = /^(\d+(\.\d+)?|\.\d+)$/;

/** Canonical decimal text: no leading zeros, no trailing fractional zeros. */
export function canonicalDecimal(s: string): string {
  const [intPart = '', frac = ''] = s.split('.');
  const i = intPart.replace(/^0+(?=\d)/, '') || '0';
  const f = frac.replace(/0+$/, '');
  return f === '' ? i : `${i}.${f}`;
}

/** Upper bounds keep every value inside what tc can express (burst is a u32 byte count). */
export const MAX_RATE_MBIT = 10_000_000;
export const MAX_BURST_MB = 4095;
/**
 * The least rate tc can express: it programs whole bytes per second, truncating
 * `<rate>mbit` × 10^6 / 8, and refuses a rate that truncates to 0 ("rate" is required).
 */
const MIN_RATE_MBIT = '0.000008';

/** Bytes per second tc programs for `<mbit>mbit` (the same double arithmetic as tc's get_rate64, truncated). */
export const rateBytesPerSecond = (mbit: string): number => Math.floor((Number(mbit) * 1e6) / 8);

/** A rate's or a burst's checks, for the API and the script's rules alike: each message ends a sentence that starts with the field and its value. */
const decimalSchema = z
  .string()
  .regex(DECIMAL, 'is not a positive decimal')
  .refine((s) => Number(s) > 0, 'is not a positive decimal')
  .transform(canonicalDecimal);

export const rateSchema = decimalSchema
  .refine((s) => Number(s) <= MAX_RATE_MBIT, `exceeds ${MAX_RATE_MBIT} Mbit/s`)
  .refine((s) => rateBytesPerSecond(s) >= 1, `is below ${MIN_RATE_MBIT} Mbit/s (one byte per second, the least tc can express)`);
export const burstSchema = decimalSchema
  .refine((s) => Number(s) <= MAX_BURST_MB, `exceeds ${MAX_BURST_MB} MB`)
  .refine((s) => burstBytes(s) >= 1, 'is less than one byte');

export const directionSchema = z.enum(['ingress', 'egress']);
export type Direction = z.infer<typeof directionSchema>;

/** Priority 0 is accepted (the controller sends it when a policy leaves it unset); see tcPrio. */
const prioritySchema = z.number().int().min(0).max(65535);
const classIdSchema = z.number().int().min(1).max(0xfffe);
/** u32 keeps 12 bits of a node id; natgw's handles are node ids in the priority's own table. */
const handleSchema = z.number().int().min(1).max(0xfff);

export const eipQosSchema = z.object({
  direction: directionSchema,
  ip: ipv4Schema,
  priority: prioritySchema,
  rate: rateSchema,
  burst: burstSchema,
  /** Allocated tc class minor (SPEC §3.4); recorded so a restart keeps it. */
  classId: classIdSchema.optional(),
  /** Allocated u32 node id; natgw's own, unique per device and priority. */
  handle: handleSchema.optional(),
});
export type EipQos = z.infer<typeof eipQosSchema>;

export const gwQosSchema = z
  .object({
    direction: directionSchema,
    dev: ifnameSchema,
    priority: prioritySchema,
    classifier: z.enum(['u32', 'matchall']),
    /** `ip` for u32, empty for matchall. */
    matchType: z.enum(['ip', '']),
    matchDirection: z.enum(['src', 'dst', '']),
    /** An IPv4 CIDR with host bits cleared for u32, empty for matchall. */
    cidr: z.string().transform((s) => canonicalQosCidr(s) ?? s),
    rate: rateSchema,
    burst: burstSchema,
    classId: classIdSchema.optional(),
    handle: handleSchema.optional(),
  })
  .superRefine((q, ctx) => {
    for (const issue of gwQosShapeIssues(q)) ctx.addIssue({ code: 'custom', path: [issue.field], message: issue.message });
  });
export type GwQos = z.infer<typeof gwQosSchema>;

/** The fields that name a gateway rule (SPEC §2: identity). */
export type GwQosId = Pick<GwQos, 'direction' | 'dev' | 'priority' | 'classifier' | 'matchDirection' | 'cidr'>;

/** A bare address is a host prefix; the result has host bits cleared; null if not IPv4. */
export function canonicalQosCidr(s: string): string | null {
  const c = parseCidr(s, { clearHostBits: true, family: 4 });
  return c ? formatCidr(c) : null;
}

/** What is wrong with a gateway rule's classifier fields, if anything (shared by the CLI parser and the API schema). */
export function gwQosShapeIssues(q: Pick<GwQos, 'direction' | 'dev' | 'classifier' | 'matchType' | 'matchDirection' | 'cidr'>): {
  field: string;
  message: string;
}[] {
  const issues: { field: string; message: string }[] = [];
  const ifbIssue = q.direction === 'ingress' ? ifbNameIssue(q.dev) : undefined;
  if (ifbIssue) issues.push({ field: 'dev', message: ifbIssue });
  if (q.classifier === 'u32') {
    if (q.matchType !== 'ip') issues.push({ field: 'matchType', message: `match type '${q.matchType}' is not ip` });
    if (q.matchDirection !== 'src' && q.matchDirection !== 'dst') {
      issues.push({ field: 'matchDirection', message: `match direction '${q.matchDirection}' is not src or dst` });
    }
    if (canonicalQosCidr(q.cidr) === null) issues.push({ field: 'cidr', message: `cidr '${q.cidr}' is not an IPv4 CIDR (a.b.c.d/0-32)` });
  } else {
    if (q.matchType !== '' || q.matchDirection !== '' || q.cidr !== '') {
      issues.push({ field: 'cidr', message: 'matchall takes no match type, match direction or cidr (fields 5-7 must be empty)' });
    }
  }
  return issues;
}

// ---- identities ----
export const eipQosKey = (q: Pick<EipQos, 'direction' | 'ip'>): string => `${q.direction}|${q.ip}`;
export const gwQosKey = (q: GwQosId): string => [q.direction, q.dev, tcPrio(q.priority), q.classifier, q.matchDirection, q.cidr].join('|');

// ---- naming and numbering shared by the allocator and the renderer ----

/** Linux IFNAMSIZ is 16 including the terminating NUL. */
const IFNAMSIZ_MAX = 15;
export const IFB_PREFIX = 'ifb-';
export const ifbName = (dev: string): string => `${IFB_PREFIX}${dev}`;

/** Ingress shaping on `dev` needs `ifb-<dev>`, which must fit the kernel's name limit. */
export function ifbNameIssue(dev: string): string | undefined {
  if (ifbName(dev).length <= IFNAMSIZ_MAX) return undefined;
  return `interface name '${dev}' is too long for its IFB device '${ifbName(dev)}' (at most ${IFNAMSIZ_MAX - IFB_PREFIX.length} characters)`;
}

/** The default class every shaped device sends unclassified traffic to. */
export const DEFAULT_CLASS = 0x9999;
export const DEFAULT_RATE_MBIT = '10000';
/** Priority of the ingress → IFB redirect, the lowest there is: every other filter runs first. */
export const REDIRECT_PRIO = 65535;

/** Class-id ranges (SPEC §2 QoS). 0x9999 lies in the gateway range and is skipped there. */
export const CLASS_RANGES = {
  eip: { min: 0x1, max: 0x7ffe },
  gw: { min: 0x8000, max: 0xfeff },
  matchall: { min: 0xff00, max: 0xfffe },
} as const;
export type ClassRange = keyof typeof CLASS_RANGES;

/** The range a class id lies in (never the default class). */
export function classRangeOf(id: number): ClassRange | undefined {
  if (id === DEFAULT_CLASS) return undefined;
  return (Object.keys(CLASS_RANGES) as ClassRange[]).find((r) => id >= CLASS_RANGES[r].min && id <= CLASS_RANGES[r].max);
}

/**
 * u32 node ids natgw hands out. u32 runs a priority's filters in node-id order, so EIP
 * rules take ids from the low half and gateway rules from the high half (an EIP rule
 * wins even at an equal priority), and 0xfff is a priority's catch-all (matchall or its
 * u32 stand-in), which runs last.
 */
export const HANDLE_MIN = 0x1;
export const HANDLE_MAX = 0xffe;
export const GW_HANDLE_MIN = 0x800;
export const CATCH_ALL_HANDLE = 0xfff;

/**
 * The filter priority natgw gives the kernel. tc treats 0 as "pick one for me", which
 * depends on what is installed already; natgw pins it to 49152, the value the kernel
 * picks on an empty device, so that a rule sent with priority 0 lands in one known place.
 */
export const tcPrio = (priority: number): number => (priority === 0 ? 0xc000 : priority);

/** The device whose root htb holds a rule's class: the device itself for egress, its IFB for ingress. */
export const qosDevice = (direction: Direction, dev: string): string => (direction === 'egress' ? dev : ifbName(dev));

/** FNV-1a, 32 bit: a tiny, stable hash, so the same address gets the same first-choice class everywhere. */
function fnv1a32(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

/** First-choice class of an EIP rule: a hash of the address into 0x1–0x7ffe. */
export function eipFirstClassId(ip: string): number {
  const r = CLASS_RANGES.eip;
  return r.min + (fnv1a32(ip) % (r.max - r.min + 1));
}

/**
 * First-choice class of a gateway rule. matchall: 0xff00 + (priority mod 255), as the
 * script computes it; u32: a hash of the match (direction and cidr) into 0x8000–0xfeff,
 * stepping over the default class 0x9999.
 */
export function gwFirstClassId(q: Pick<GwQos, 'classifier' | 'priority' | 'matchDirection' | 'cidr'>): number {
  if (q.classifier === 'matchall') return CLASS_RANGES.matchall.min + (q.priority % 255);
  const r = CLASS_RANGES.gw;
  const id = r.min + (fnv1a32(`${q.matchDirection} ${q.cidr}`) % (r.max - r.min + 1));
  return id === DEFAULT_CLASS ? id + 1 : id;
}

/** Bytes tc is given for a burst of `mb` megabytes (SPEC: round(burst × 1048576)). */
export function burstBytes(mb: string): number {
  return Math.round(Number(mb) * 1048576);
}

export const hex = (n: number): string => `0x${n.toString(16)}`;
