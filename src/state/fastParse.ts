import { canonicalIp, familyOfValid, formatCidr, isIpv4, isIpv6, parseCidr } from '../model/net.js';
import { desiredStateSchema, type DesiredState } from './state.js';

/**
 * `desiredStateSchema.safeParse`, with a shortcut for the four collections a bulk document is
 * made of (EIPs, SNAT, DNAT, FIP: 21,000 objects at the benchmarked size). zod builds a new
 * object for each, runs a refinement and a transform per field, and the copies outlive the
 * young generation: most of a bulk PUT's validation and collection time. An element that is
 * already exactly what the schema would output (the keys the schema writes, in its order,
 * every value valid and in canonical form, as GET /v1/state returns them) is kept as it is.
 *
 * The schema stays the only judge: the rest of the document goes through it with those
 * collections left empty (a collection with any element not canonical goes through it whole),
 * and if anything fails, the whole input goes through the schema as before — so every accepted value and every error message is
 * the schema's own (test/unit/fast-parse.test.ts compares the two on generated documents).
 */
export function safeParseDesired(input: unknown): ReturnType<typeof desiredStateSchema.safeParse> {
  if (isPlain(input)) {
    const fast: Array<[string, unknown[]]> = [];
    for (const [key, canonical] of FAST) {
      const v = input[key];
      if (Array.isArray(v) && every(v, canonical)) {
        fast.push([key, v]);
      }
    }
    if (fast.length > 0) {
      const rest = desiredStateSchema.safeParse({ ...input, ...Object.fromEntries(fast.map(([k]) => [k, []])) });
      if (rest.success) {
        const data = rest.data as Record<string, unknown>;
        // Assigned over the schema's empty arrays: the keys keep the schema's order.
        for (const [k, v] of fast) data[k] = v;
        return { success: true, data: data as DesiredState } as ReturnType<typeof desiredStateSchema.safeParse>;
      }
    }
  }
  return desiredStateSchema.safeParse(input);
}

function isPlain(x: unknown): x is Record<string, unknown> {
  return typeof x === 'object' && x !== null && Object.getPrototypeOf(x) === Object.prototype;
}

/** A plain object whose own enumerable keys are exactly `keys`, in that order. */
function hasExactly(x: unknown, keys: readonly string[]): x is Record<string, unknown> {
  if (!isPlain(x)) return false;
  let i = 0;
  for (const k in x) {
    if (k !== keys[i]) return false;
    i++;
  }
  return i === keys.length;
}

function every(items: readonly unknown[], canonical: (x: unknown) => boolean): boolean {
  // Indexed, not Array.prototype.every: a hole must fail here as the schema fails it.
  for (let i = 0; i < items.length; i++) if (!canonical(items[i])) return false;
  return true;
}

/**
 * 4 or 6 for an address ipSchema accepts and leaves unchanged (its transform is canonicalIp), 0
 * for anything else: the family is decided once per address, by the check that validates it.
 */
const ipFamily = (v: unknown): 0 | 4 | 6 => (typeof v !== 'string' ? 0 : isIpv4(v) ? 4 : isIpv6(v) && canonicalIp(v) === v ? 6 : 0);
const ip = (v: unknown): v is string => ipFamily(v) !== 0;
/** Both addresses canonical and of one family. */
const ipPair = (a: unknown, b: unknown): boolean => {
  const f = ipFamily(a);
  return f !== 0 && ipFamily(b) === f;
};
const int = (v: unknown, min: number, max: number): boolean => typeof v === 'number' && Number.isInteger(v) && v >= min && v <= max;
const port = (v: unknown): boolean => int(v, 1, 65535);
/** What networkCidrSchema accepts and leaves unchanged (host bits clear, the prefix written plainly). */
function networkCidr(v: unknown): v is string {
  if (typeof v !== 'string') return false;
  const c = parseCidr(v, { clearHostBits: true });
  return c !== null && formatCidr(c) === v;
}

// The key lists are the schemas' shapes in order (src/model/rules.ts), without the optional keys
// (a port range, a SNAT pool): those elements take the schema's path.
const EIP_KEYS = ['address', 'prefixLength'] as const;
const SNAT_KEYS = ['eip', 'cidr', 'randomFully'] as const;
const DNAT_KEYS = ['eip', 'port', 'protocol', 'internalIp', 'internalPort'] as const;
const FIP_KEYS = ['eip', 'internalIp'] as const;

const FAST: ReadonlyArray<readonly [keyof DesiredState, (x: unknown) => boolean]> = [
  ['eips', (x) => hasExactly(x, EIP_KEYS) && ip(x.address) && int(x.prefixLength, 0, 128)],
  [
    'snats',
    (x) => {
      if (!hasExactly(x, SNAT_KEYS) || typeof x.randomFully !== 'boolean') return false;
      const f = ipFamily(x.eip);
      return f !== 0 && networkCidr(x.cidr) && familyOfValid(x.cidr) === f;
    },
  ],
  [
    'dnats',
    (x) => hasExactly(x, DNAT_KEYS) && port(x.port) && (x.protocol === 'tcp' || x.protocol === 'udp') && port(x.internalPort) && ipPair(x.eip, x.internalIp),
  ],
  ['fips', (x) => hasExactly(x, FIP_KEYS) && ipPair(x.eip, x.internalIp)],
];
