import type { DesiredState } from '../state/state.js';
import { RESOURCES } from './resources.js';
import { digestOf } from './stateDoc.js';
import { heldDefaultRoutes, heldDefaultRouteText } from '../model/defaultRoute.js';
import type { DriftCheck, ReadBack, Readiness, StateDocument, StatusDocument, SyncInfo } from './bodies.js';

/**
 * GET /v1/status: one read-only summary for `natgw status` — readiness, backend, desired
 * against applied per kind, the last apply, and drift. `?check=true` adds a read-back of the
 * kernel now (a resync that renders its repair but applies nothing), so drift shows before
 * the next resync repairs it.
 */
const withoutScript = (r: ReadBack | null): Omit<ReadBack, 'script'> | null => {
  if (!r) return null;
  const { script: _script, ...rest } = r;
  return rest;
};

/** Pure: the status document from what the agent reports. */
export function buildStatus(doc: StateDocument, readiness: Readiness, sync: SyncInfo | null, check?: DriftCheck): StatusDocument {
  const applied: DesiredState | null = doc.lastApplied;
  const objects: Record<string, { desired: number; applied: number | null }> = {};
  for (const def of RESOURCES) {
    objects[def.path] = { desired: doc.desired[def.stateKey].length, applied: applied ? applied[def.stateKey].length : null };
  }
  const appliedDigest = applied ? digestOf(applied) : null;
  return {
    ready: readiness.ready,
    reasons: readiness.reasons,
    interfaces: readiness.interfaces,
    backend: doc.backend,
    mode: doc.mode,
    generation: doc.generation,
    digest: doc.digest,
    appliedDigest,
    inSync: appliedDigest === doc.digest,
    objects,
    // The agent's detail when it has one (kind, duration); readiness's record otherwise.
    lastSync: sync ?? readiness.lastSync,
    drift: {
      repairs: doc.drift.repairs,
      last: withoutScript(doc.drift.last),
      lastRepair: withoutScript(doc.drift.lastRepair),
      ...(check ? { check } : {}),
    },
    warnings: heldDefaultRoutes(doc.desired).map((h) => heldDefaultRouteText(h, doc.desired.interfaces)),
  };
}
