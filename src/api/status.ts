import type { Express, Request } from 'express';
import type { DesiredState } from '../state/state.js';
import { HttpError } from './errors.js';
import { RESOURCES } from './resources.js';
import { digestOf } from './stateDoc.js';
import { heldDefaultRoutes, heldDefaultRouteText } from '../model/defaultRoute.js';
import type { DrainingStatus } from '../dataplane/draining.js';
import type { AgentService, DriftCheck, ReadBack, Readiness, StateDocument, SyncInfo } from './service.js';
import type { EipPortUsage } from '../observe/portUsage.js';

/**
 * GET /v1/status: one read-only summary for `natgw status` — readiness, backend, desired
 * against applied per kind, the last apply, and drift. `?check=true` adds a read-back of the
 * kernel now (a resync that renders its repair but applies nothing), so drift shows before
 * the next resync repairs it.
 */
export interface StatusDocument {
  readonly ready: boolean;
  readonly reasons: readonly string[];
  readonly interfaces: Readiness['interfaces'];
  readonly backend: StateDocument['backend'];
  readonly mode: string;
  readonly generation: number;
  readonly digest: string;
  /** Digest of what this process applied last; null before its first apply. */
  readonly appliedDigest: string | null;
  /** The desired state is what was applied last. */
  readonly inSync: boolean;
  /** Per kind (the API's resource paths): objects desired and applied (null before the first apply). */
  readonly objects: Record<string, { readonly desired: number; readonly applied: number | null }>;
  readonly lastSync: (Partial<SyncInfo> & { readonly ok: boolean; readonly at: string; readonly error?: string }) | null;
  readonly drift: {
    readonly repairs: number;
    readonly last: Omit<ReadBack, 'script'> | null;
    readonly lastRepair: Omit<ReadBack, 'script'> | null;
    readonly check?: DriftCheck;
  };
  /** What the desired state holds that is not installed, and why (a subnet route to a default the external one owns). */
  readonly warnings: readonly string[];
  /** EIPs draining out of SNAT pools and the connections still translated to each (only while some drain). */
  readonly draining?: readonly DrainingStatus[];
  /** Per EIP, SNAT source ports in use toward its busiest destinations; absent while conntrack is not followed. */
  readonly snatPorts?: readonly EipPortUsage[];
}

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

function checkQuery(req: Request): boolean {
  const v = req.query.check;
  if (v === undefined || v === 'false' || v === '0') return false;
  if (v === 'true' || v === '1' || v === '') return true;
  throw new HttpError(400, 'validation', 'check: must be true or false', { field: 'check', in: 'query' });
}

export function mountStatus(app: Express, agent: AgentService): void {
  app.get('/v1/status', async (req, res) => {
    const check = checkQuery(req);
    const drift = check && agent.checkDrift ? await agent.checkDrift() : undefined;
    const doc = await agent.stateDocument();
    const snatPorts = agent.portUsage?.();
    const draining = doc.desired.snats.some((x) => x.draining) && agent.draining ? await agent.draining(doc.desired) : [];
    res.json({
      ...buildStatus(doc, agent.readiness(), agent.lastSyncInfo?.() ?? null, drift),
      ...(snatPorts ? { snatPorts } : {}),
      ...(draining.length > 0 ? { draining } : {}),
    });
  });
}

/** The route's OpenAPI path item (merged into /v1/openapi.json). */
export function statusOpenApi(): Record<string, unknown> {
  const counts = { type: 'object', properties: { desired: { type: 'integer' }, applied: { type: ['integer', 'null'] } } };
  return {
    '/v1/status': {
      get: {
        operationId: 'status',
        tags: ['State'],
        summary: 'Readiness, backend, desired against applied per kind, last apply, drift (natgw status)',
        parameters: [
          {
            name: 'check',
            in: 'query',
            required: false,
            schema: { type: 'boolean', default: false },
            description: 'Also read the kernel back now and report what a resync would repair (drift.check); nothing is applied',
          },
        ],
        responses: {
          '200': {
            description: 'The status',
            content: {
              'application/json': {
                schema: {
                  type: 'object',
                  properties: {
                    ready: { type: 'boolean' },
                    reasons: { type: 'array', items: { type: 'string' } },
                    interfaces: { type: 'object' },
                    backend: { type: ['object', 'null'] },
                    mode: { type: 'string' },
                    generation: { type: 'integer' },
                    digest: { type: 'string', description: 'Digest of the desired state' },
                    appliedDigest: { type: ['string', 'null'], description: 'Digest of what this process applied last' },
                    inSync: { type: 'boolean', description: 'digest equals appliedDigest' },
                    objects: { type: 'object', description: 'Per kind (resource path): desired and applied counts', additionalProperties: counts },
                    lastSync: {
                      type: ['object', 'null'],
                      properties: {
                        ok: { type: 'boolean' },
                        at: { type: 'string' },
                        kind: { type: 'string', enum: ['full', 'partial'] },
                        ms: { type: 'integer' },
                        error: { type: 'string' },
                      },
                    },
                    drift: {
                      type: 'object',
                      description:
                        '`repairs`: resyncs that found and repaired drift; `last`/`lastRepair`: their read-backs; `check`: the read-back asked for with ?check=true',
                      properties: {
                        repairs: { type: 'integer' },
                        last: { type: ['object', 'null'] },
                        lastRepair: { type: ['object', 'null'] },
                        check: { type: 'object' },
                      },
                    },
                    draining: {
                      type: 'array',
                      description: 'EIPs draining out of SNAT pools (present only while some drain)',
                      items: {
                        type: 'object',
                        properties: {
                          snat: { type: 'object', properties: { eip: { type: 'string' }, cidr: { type: 'string' } } },
                          eip: { type: 'string' },
                          connections: {
                            type: ['integer', 'null'],
                            description: 'Connections from the CIDR still translated to the EIP (null: conntrack unreadable)',
                          },
                        },
                      },
                    },
                    snatPorts: {
                      type: 'array',
                      description:
                        'Per EIP: destinations (ip, port, protocol) with open SNAT connections, the most source ports any one uses and its share of the port range, and the busiest few; absent while conntrack is not followed',
                      items: {
                        type: 'object',
                        properties: {
                          eip: { type: 'string' },
                          destinations: { type: 'integer' },
                          maxPorts: { type: 'integer' },
                          maxShare: { type: 'number' },
                          top: {
                            type: 'array',
                            items: {
                              type: 'object',
                              properties: {
                                ip: { type: 'string' },
                                port: { type: 'integer' },
                                protocol: { type: 'string' },
                                ports: { type: 'integer' },
                                share: { type: 'number' },
                              },
                            },
                          },
                        },
                      },
                    },
                    warnings: {
                      type: 'array',
                      items: { type: 'string' },
                      description:
                        'What the desired state holds but the kernel does not, and why (a subnet route to a default route the external gateway owns)',
                    },
                  },
                },
              },
            },
          },
          '400': { description: 'check is not a boolean', content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } } },
        },
      },
    },
  };
}
