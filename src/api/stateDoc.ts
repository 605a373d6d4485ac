import { createHash } from 'node:crypto';
import { canonicalDigestInto } from '../model/canonical.js';
import type { DesiredState } from '../state/state.js';
import { sameValue, split, touches, type StateChange, type Touched } from '../state/change.js';
import { safeParseDesired } from '../state/fastParse.js';
import { allocateQos } from '../state/qosOperations.js';
import { prefixOf } from '../model/rules.js';
import { addDnats, type Effect } from '../state/operations.js';
import { ConflictError } from '../model/errors.js';
import { worded } from '../engine/conflicts.js';
import { HttpError, validationError } from './errors.js';
import { RESOURCES, idOf } from './resources.js';
import type { ObjectDiff } from './bodies.js';

/**
 * sha256 of the canonical JSON of the desired state: equal on HA replicas that agree. Computed
 * anew at each call (7-15 ms at 21,000 objects): no answer of a single command carries it.
 */
export function digestOf(s: DesiredState): string {
  const hash = createHash('sha256');
  canonicalDigestInto(hash, s);
  return `sha256:${hash.digest('hex')}`;
}

/**
 * The body of PUT /v1/state: either the document GET /v1/state returns (only `desired`
 * counts; lastApplied, drift, backend, mode, generation and digest are read-only and
 * ignored) or a bare desired state.
 */
export function parseStateBody(o: Record<string, unknown>): DesiredState {
  const wrapped = 'desired' in o;
  const parsed = safeParseDesired(wrapped ? o.desired : o);
  if (!parsed.success) throw validationError(parsed.error, 'body', wrapped ? ['desired'] : []);
  return normaliseDesired(parsed.data, wrapped ? 'desired.' : '');
}

/**
 * A whole state must be a state the operations could have produced: no identity twice
 * (400 naming both places), SNATs ordered longest prefix first (re-sorted stably, so rules of
 * equal length keep the order given), QoS ids valid and free (allocated where missing).
 */
export function normaliseDesired(s: DesiredState, fieldPrefix = ''): DesiredState {
  for (const def of RESOURCES) {
    const duplicate = (i: number, first: number): HttpError => {
      const field = `${fieldPrefix}${def.stateKey}[${i}]`;
      return new HttpError(400, 'validation', `${field}: duplicate ${def.title} identity ${idOf(def, s[def.stateKey][i])} (also at [${first}])`, {
        field,
        in: 'body',
      });
    };
    const seen = new Map<string, number>();
    s[def.stateKey].forEach((x: unknown, i: number) => {
      const k = def.key(x);
      const first = seen.get(k);
      if (first !== undefined) throw duplicate(i, first);
      seen.set(k, i);
    });
  }
  // Port ranges must not overlap another DNAT of their eip and protocol: the operations' check
  // (without a range nothing can overlap but a twin identity, refused above).
  try {
    if (s.dnats.some((d) => d.portEnd !== undefined)) addDnats({ ...s, dnats: [] }, s.dnats);
  } catch (given) {
    const err = worded(given);
    if (!(err instanceof ConflictError)) throw err;
    const field = `${fieldPrefix}dnats`;
    throw new HttpError(400, 'validation', `${field}: ${err.message}`, { field, in: 'body' });
  }
  return allocateQos({ ...s, snats: longestPrefixFirst(s.snats) });
}

/** SNATs longest prefix first, rules of equal length in the order given (a stable sort, each prefix read once). */
function longestPrefixFirst(snats: DesiredState['snats']): DesiredState['snats'] {
  const prefixes = snats.map((x) => prefixOf(x.cidr));
  return prefixes
    .map((_p, i) => i)
    .sort((a, b) => (prefixes[b] as number) - (prefixes[a] as number) || a - b)
    .map((i) => snats[i] as DesiredState['snats'][number]);
}

/** Per kind, what a change adds, removes and changes. */
export function planOf(change: StateChange): Record<string, ObjectDiff> {
  const plan: Record<string, ObjectDiff> = {};
  for (const def of RESOURCES) {
    const { added, removed, updated } = split(change, def.stateKey);
    // A SNAT only moved (a new order) is not a changed object.
    plan[def.path] = { added: added.length, removed: removed.length, changed: updated.filter((u) => !sameValue(u.before, u.after)).length };
  }
  plan.gateway = { added: 0, removed: 0, changed: touches(change, 'initialized', 'interfaces', 'defaultRoutes') ? 1 : 0 };
  return plan;
}

/**
 * The side effects the equivalent commands would have had: gratuitous ARP for new EIPs,
 * conntrack flushes for FIPs, DNATs and share-DNATs that went away or changed target.
 */
export function effectsOf(change: StateChange): Effect[] {
  const effects: Effect[] = [];
  for (const t of change.lists.eips?.values() ?? []) if (t.before === undefined && t.after) effects.push({ kind: 'garp', ip: t.after.address });
  // Removed, or given another target (a FIP, a DNAT; a share-DNAT only removed).
  const gone = <T>(m: ReadonlyMap<string, Touched<T>> | undefined, retargeted: boolean): T[] => {
    const out: T[] = [];
    for (const t of m?.values() ?? [])
      if (t.before !== undefined && (t.after === undefined || (retargeted && !sameValue(t.before, t.after)))) out.push(t.before);
    return out;
  };
  for (const f of gone(change.lists.fips, true)) effects.push({ kind: 'conntrack-flush', dst: f.eip });
  for (const d of gone(change.lists.dnats, true)) {
    effects.push({ kind: 'conntrack-flush', dst: d.eip, protocol: d.protocol, port: d.port, ...(d.portEnd !== undefined ? { portEnd: d.portEnd } : {}) });
  }
  for (const d of gone(change.lists.shareDnats, false)) effects.push({ kind: 'conntrack-flush', dst: d.eip, protocol: d.protocol, port: d.port });
  return effects;
}
