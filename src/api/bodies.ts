import { z } from 'zod';
import { desiredStateSchema } from '../state/state.js';

/**
 * The API's response bodies, each declared once: the types the code builds are inferred from
 * these schemas, and the OpenAPI document (openapi.ts) is generated from them.
 */
const count = z.int().min(0);
const anyObject = z.looseObject({});

export const errorBody = z.object({
  error: z.string().describe('validation | conflict | not-initialized | not-found | unauthorized | too-large | apply-failed | shutting-down | internal'),
  message: z.string().describe('For conflicts: exactly the message the shim prints'),
  /** For validation errors: the field at fault (dotted path) and where it was. */
  field: z.string().optional(),
  in: z.enum(['body', 'path', 'query', 'header']).optional(),
  issues: z.array(z.object({ field: z.string(), message: z.string() })).optional(),
  errorId: z.string().optional().describe('TCP listener, 5xx: the full error is in the natgw log under this id'),
});
export type ErrorBody = z.infer<typeof errorBody>;

export const commandOutputBody = z.object({ status: z.int(), stdout: z.string(), stderr: z.string() });

export const healthBody = z.object({ status: z.literal('ok'), pid: z.int(), uptimeSeconds: count });

export const readinessBody = z
  .object({
    ready: z.boolean(),
    interfaces: z.object({ present: z.boolean(), missing: z.array(z.string()).readonly() }),
    lastSync: z.object({ ok: z.boolean(), at: z.string(), error: z.string().optional() }).nullable(),
    reasons: z.array(z.string()).readonly(),
  })
  .describe('Over TCP only `ready`; on the Unix socket with replica sync also `ha`, its health');
export type Readiness = z.infer<typeof readinessBody>;

const readBackBody = z.object({
  at: z.string(),
  reason: z.string(),
  changes: z
    .object({ netfilter: count, shareDnat: count, link: count, qos: count, neighbours: count.optional() })
    .describe('Objects the resync had to add or remove: non-zero means drift was found and repaired'),
  repaired: z.boolean(),
  script: z.string().describe('What the repair applied (empty when nothing drifted)'),
});
export type ReadBack = z.infer<typeof readBackBody>;

const backendBody = z.object({ kind: z.string(), variant: z.string().optional(), pendingCleanup: z.unknown().optional() }).nullable();

export const stateDocumentBody = z.object({
  desired: desiredStateSchema,
  lastApplied: desiredStateSchema.nullable(),
  drift: z
    .object({ last: readBackBody.nullable(), lastRepair: readBackBody.nullable(), repairs: count })
    .describe(
      "What the resyncs' read-back of the kernel found: `last` (the latest), `lastRepair` (the latest that found drift and repaired it), `repairs` (how many did)",
    ),
  backend: backendBody,
  mode: z.string(),
  generation: count,
  digest: z.string().describe('sha256 of the canonical JSON of desired'),
});
export type StateDocument = z.infer<typeof stateDocumentBody>;

const objectDiffBody = z.object({ added: count, removed: count, changed: count });
export type ObjectDiff = z.infer<typeof objectDiffBody>;

export const replaceResultBody = z.object({
  dryRun: z.boolean(),
  plan: z.record(z.string(), objectDiffBody).describe('Per kind: how many objects the new state adds, removes and changes'),
  report: z.object({
    netfilterChanges: count,
    shareDnatChanges: count,
    linkChanges: count,
    qosChanges: count,
    neighbourChanges: count,
    notes: z.array(z.string()).readonly(),
  }),
  script: z.string().optional().describe('The rendered backend script that would be applied (dryRun=true only)'),
  generation: count,
  digest: z.string(),
});
export type ReplaceResult = z.infer<typeof replaceResultBody>;

const syncInfoBody = z.object({ ok: z.boolean(), at: z.string(), kind: z.enum(['full', 'partial']), ms: count, error: z.string().optional() });
export type SyncInfo = z.infer<typeof syncInfoBody>;

const driftCheckBody = z.object({
  at: z.string(),
  changes: readBackBody.shape.changes,
  drifted: z.boolean(),
  script: z.string().describe('What a resync would apply to repair it'),
});
export type DriftCheck = z.infer<typeof driftCheckBody>;

const readBackSummary = readBackBody.omit({ script: true }).nullable();

export const statusBody = z.object({
  ready: z.boolean(),
  reasons: readinessBody.shape.reasons,
  interfaces: readinessBody.shape.interfaces,
  backend: backendBody,
  mode: z.string(),
  generation: count,
  digest: z.string().describe('Digest of the desired state'),
  appliedDigest: z.string().nullable().describe('Digest of what this process applied last; null before its first apply'),
  inSync: z.boolean().describe('digest equals appliedDigest'),
  objects: z
    .record(z.string(), z.object({ desired: count, applied: count.nullable() }))
    .describe('Per kind (resource path): desired and applied counts (applied null before the first apply)'),
  lastSync: syncInfoBody.partial({ kind: true, ms: true }).nullable(),
  drift: z
    .object({ repairs: count, last: readBackSummary, lastRepair: readBackSummary, check: driftCheckBody.optional() })
    .describe('`repairs`: resyncs that found and repaired drift; `last`/`lastRepair`: their read-backs; `check`: the read-back asked for with ?check=true'),
  warnings: z
    .array(z.string())
    .describe('What the desired state holds but the kernel does not, and why (a subnet route to a default route the external gateway owns)'),
  draining: z
    .array(
      z.object({
        snat: z.object({ eip: z.string(), cidr: z.string() }),
        eip: z.string(),
        connections: count.nullable().describe('Connections from the CIDR still translated to the EIP (null: conntrack unreadable)'),
      }),
    )
    .readonly()
    .optional()
    .describe('EIPs draining out of SNAT pools (present only while some drain)'),
  snatPorts: z
    .array(
      z.object({
        eip: z.string(),
        destinations: count,
        maxPorts: count,
        maxShare: z.number(),
        top: z.array(z.object({ ip: z.string(), port: count, protocol: z.string(), ports: count, share: z.number() })).readonly(),
      }),
    )
    .readonly()
    .optional()
    .describe(
      'Per EIP: destinations (ip, port, protocol) with open SNAT connections, the most source ports any one uses and its share of the port range, and the busiest few; absent while conntrack is not followed',
    ),
});
export type StatusDocument = z.infer<typeof statusBody>;

const healthCheckBody = z.object({ enabled: z.boolean(), healthy: z.boolean(), reasons: z.array(z.string()).readonly() });

/** Built by the replica manager (src/ha), which returns it as a plain record: the schema documents it. */
export const haStatusBody = z.object({
  enabled: z.boolean(),
  mode: z.enum(['single', 'takeover']).optional().describe('takeover: NATGW_HA_PEERS is set'),
  role: z.enum(['active', 'standby']).optional().describe('Only the active replica sends gratuitous ARP; a takeover makes it active'),
  since: z.string().optional().describe('When the role began (start or takeover)'),
  digest: z.string().describe('The same digest as GET /v1/state'),
  health: healthCheckBody.optional(),
  conntrackd: anyObject.nullable().optional().describe('The supervised process: state, pid, restarts, last exit'),
  sync: anyObject
    .nullable()
    .optional()
    .describe('Peers (`peer` the first, `peers` all), multicast `group` (null for a pair), local sync address, last exchange, conntrackd statistics'),
  peerApi: anyObject.nullable().optional().describe("The peer's digest as last read, whether it differs, the last error"),
  peerApis: z.array(anyObject).optional().describe('The same for every peer of NATGW_HA_PEER_API, the first one first'),
  lastTakeover: anyObject.nullable().optional(),
});

export const takeoverBody = z.object({
  reason: z.string(),
  at: z.string(),
  committed: z.boolean().describe("The peer's flows were written into the kernel (conntrackd -c)"),
  commitError: z.string().optional(),
  announced: z.array(z.string()).readonly().describe('EIPs announced by gratuitous ARP, after the commit'),
  interface: z.string(),
  ms: count,
});

export const resendBody = z.object({ resent: z.boolean(), flows: count, reason: z.string().optional() });

/** Built by the BGP manager (src/routing), which returns it as a plain record: the schema documents it. */
export const bgpStatusBody = z.object({
  enabled: z.boolean(),
  off: z.string().optional(),
  asn: z.int().nullable().optional(),
  peerAsn: z.int().nullable().optional(),
  routerId: z.string().nullable().optional(),
  bfd: anyObject.nullable().optional().describe('intervalMs and multiplier; null: no BFD'),
  bird: anyObject.nullable().optional().describe('The supervised process: state, pid, restarts, last exit, config and socket paths'),
  announcing: z.boolean().optional().describe('The data plane is ready: the EIPs are offered to the peers'),
  reasons: z.array(z.string()).optional().describe('Why not, when announcing is false'),
  lastChange: anyObject.nullable().optional().describe('The last reconfiguration of BIRD: when, how many EIPs, why'),
  health: healthCheckBody.optional(),
  sessions: z
    .array(
      z.object({
        name: z.string().optional(),
        peer: z.string(),
        local: z.string().optional().describe('This replica’s address on the session: the next hop the peer installs'),
        state: z.string(),
        established: z.boolean(),
        since: z.string().nullable().optional(),
        info: z.string().optional(),
        bfd: z.string().nullable().optional(),
        exported: count.optional().describe('Routes advertised on this session'),
      }),
    )
    .optional(),
  eips: z
    .array(
      z.object({
        address: z.string(),
        prefix: z.string(),
        offered: z.boolean().describe('In the routes BIRD offers'),
        advertised: z.boolean().describe('Exported on at least one established session'),
        peers: z.array(z.string()),
      }),
    )
    .optional(),
});
