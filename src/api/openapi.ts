import { z } from 'zod';
import { desiredStateSchema } from '../state/state.js';
import { RESOURCES, type ResourceDef } from './resources.js';

/**
 * The OpenAPI 3 description of the v1 API, served at /v1/openapi.json. Object schemas come
 * from the same zod schemas that validate the bodies; a test walks the express router and
 * keeps this document's paths and methods in step with the routes.
 */
type Json = Record<string, unknown>;

function jsonSchema(schema: z.ZodType): Json {
  const { $schema: _drop, ...rest } = z.toJSONSchema(schema, { io: 'input', unrepresentable: 'any' }) as Json;
  return rest;
}

const ref = (name: string): Json => ({ $ref: `#/components/schemas/${name}` });
const json = (schema: Json, description: string): Json => ({ description, content: { 'application/json': { schema } } });
const errorResponse = (description: string): Json => json(ref('Error'), description);

const idParam = (def: ResourceDef): Json => ({
  name: 'id',
  in: 'path',
  required: true,
  description: `The identity: ${def.idFields.join(',')} (comma-separated; a CIDR's "/" written %2F)${def.idNote ? `. ${def.idNote}` : ''}`,
  schema: { type: 'string' },
  example: def.idExample,
});

const schemaName = (def: ResourceDef): string => def.title.replace(/[^A-Za-z]/g, '');

const commonErrors = {
  '400': errorResponse('Invalid identity or body: `field` names the field and `message` the reason. Nothing was applied.'),
  '401': errorResponse('TCP only: missing or wrong bearer token.'),
  '409': errorResponse("Conflict (the script's message) or gateway not initialized. Nothing was applied."),
  '413': errorResponse('Body larger than NATGW_BODY_LIMIT.'),
  '500': errorResponse('The kernel refused the change. Nothing was applied.'),
  '503': errorResponse('Shutting down, or an interface is missing.'),
};

/** The common error responses with these codes. */
const errors = (...codes: (keyof typeof commonErrors)[]): Json => Object.fromEntries(codes.map((c) => [c, commonErrors[c]]));
const query = (name: string, schema: Json, description: string): Json => ({ name, in: 'query', required: false, schema, description });
const notDaemon = errorResponse('Not the daemon (no replica part), or shutting down.');

function resourcePaths(def: ResourceDef): Record<string, Json> {
  const name = schemaName(def);
  const item = { allOf: [{ type: 'object', properties: { id: { type: 'string', description: 'The identity, as in URLs (unencoded)' } } }, ref(name)] };
  const guard = def.guarded ? ' Refused (409, not-initialized) until init has run.' : '';
  return {
    [`/v1/${def.path}`]: {
      get: {
        operationId: `list-${def.path}`,
        tags: [def.title],
        summary: `List ${def.title} objects`,
        description: def.description,
        responses: { '200': json({ type: 'object', required: ['items'], properties: { items: { type: 'array', items: item } } }, 'The desired objects') },
      },
    },
    [`/v1/${def.path}/{id}`]: {
      parameters: [idParam(def)],
      get: {
        operationId: `get-${def.path}`,
        tags: [def.title],
        summary: `Get one ${def.title}`,
        responses: { '200': json(item, 'The object'), ...errors('400'), '404': errorResponse('No such object') },
      },
      put: {
        operationId: `put-${def.path}`,
        tags: [def.title],
        summary: `Create or update a ${def.title} (idempotent)`,
        description: `${def.description}${guard} Identity fields may be repeated in the body but must match the path.${def.readOnly.length ? ` Read-only fields ignored: ${def.readOnly.join(', ')}.` : ''}`,
        parameters: def.replaceable
          ? [query('replace', { type: 'boolean', default: false }, 'Replace an existing object with another target instead of answering 409')]
          : [],
        requestBody: { required: true, content: { 'application/json': { schema: ref(name), example: def.bodyExample } } },
        responses: {
          '200': json(item, 'Already present (unchanged or updated)'),
          '201': json(item, 'Created'),
          ...commonErrors,
        },
      },
      delete: {
        operationId: `delete-${def.path}`,
        tags: [def.title],
        summary: `Delete a ${def.title} (absent is success)`,
        description: guard.trim() || undefined,
        responses: {
          '204': { description: 'Deleted, or was not there' },
          ...errors('400', '401', '409', '500', '503'),
        },
      },
    },
  };
}

export function buildOpenApi(): Json {
  const counts = { type: 'object', properties: { desired: { type: 'integer' }, applied: { type: ['integer', 'null'] } } };
  const schemas: Json = {
    Error: {
      type: 'object',
      required: ['error', 'message'],
      properties: {
        error: {
          type: 'string',
          description: 'validation | conflict | not-initialized | not-found | unauthorized | too-large | apply-failed | shutting-down | internal',
        },
        message: { type: 'string', description: 'For conflicts: exactly the message the shim prints' },
        field: { type: 'string' },
        in: { type: 'string', enum: ['body', 'path', 'query', 'header'] },
        issues: { type: 'array', items: { type: 'object', properties: { field: { type: 'string' }, message: { type: 'string' } } } },
      },
    },
    DesiredState: jsonSchema(desiredStateSchema),
    CommandOutput: {
      type: 'object',
      required: ['status', 'stdout', 'stderr'],
      properties: { status: { type: 'integer' }, stdout: { type: 'string' }, stderr: { type: 'string' } },
    },
  };
  for (const def of RESOURCES) schemas[schemaName(def)] = jsonSchema(def.schema);

  const paths: Json = {
    '/healthz': {
      get: { operationId: 'healthz', tags: ['Probes'], summary: 'Process alive (open over TCP)', responses: { '200': json({ type: 'object' }, 'Alive') } },
    },
    '/readyz': {
      get: {
        operationId: 'readyz',
        tags: ['Probes'],
        summary: 'Interfaces present and last sync succeeded (open over TCP)',
        parameters: [
          query(
            'waitMs',
            { type: 'integer', minimum: 0, maximum: 30000 },
            'Hold the answer until ready or this many milliseconds passed (at most 30000), then answer as without it',
          ),
        ],
        responses: { '200': json({ type: 'object' }, 'Ready'), '503': json({ type: 'object' }, 'Not ready; `reasons` says why') },
      },
    },
    '/metrics': {
      get: {
        operationId: 'metrics',
        tags: ['Probes'],
        summary: 'Prometheus metrics',
        responses: { '200': { description: 'Prometheus text format', content: { 'text/plain': { schema: { type: 'string' } } } } },
      },
    },
    '/v1/openapi.json': {
      get: { operationId: 'openapi', tags: ['Meta'], summary: 'This document', responses: { '200': json({ type: 'object' }, 'OpenAPI 3 document') } },
    },
    '/v1/legacy': {
      post: {
        operationId: 'legacy',
        tags: ['Legacy'],
        summary: 'Run a nat-gateway.sh command exactly as the shim would',
        description: 'HTTP 200 whenever the command ran, whatever its own status (in the body); 4xx only for a malformed request.',
        requestBody: {
          required: true,
          content: {
            'application/json': {
              schema: {
                type: 'object',
                required: ['command'],
                additionalProperties: false,
                properties: { command: { type: 'string' }, rules: { type: 'array', items: { type: 'string' }, default: [] } },
              },
              example: { command: 'dnat-add', rules: ['172.20.0.10,8080,tcp,10.0.1.6,80'] },
            },
          },
        },
        responses: {
          '200': json(ref('CommandOutput'), 'The command ran'),
          ...errors('400', '401', '413', '503'),
        },
      },
    },
    '/v1/legacy/raw': {
      post: {
        operationId: 'legacy-raw',
        tags: ['Legacy'],
        summary: "Run a nat-gateway.sh command; form-encoded request, raw output (the shim's curl client)",
        description:
          'The same command as POST /v1/legacy, shaped for a client without a JSON parser: the body is `command=<c>` followed by one `rule=<r>` per argument, in order (`curl --data-urlencode`); empty rules are kept. ' +
          "On HTTP 200 the response body is the command's stdout byte for byte, `X-Natgw-Status` its exit status and `X-Natgw-Stderr` its stderr, in which every byte but printable ASCII other than space and backslash is written `\\xHH` (bash: `printf %b`). " +
          'HTTP 200 whenever the command ran, whatever its own status; 4xx only for a malformed request. Same body limit as JSON.',
        requestBody: {
          required: true,
          content: {
            'application/x-www-form-urlencoded': {
              schema: {
                type: 'object',
                required: ['command'],
                additionalProperties: false,
                properties: {
                  command: { type: 'string' },
                  rule: { type: 'array', items: { type: 'string' }, description: 'One field per argument, repeated' },
                },
              },
              encoding: { rule: { explode: true, style: 'form' } },
              example: 'command=dnat-add&rule=172.20.0.10%2C8080%2Ctcp%2C10.0.1.6%2C80',
            },
          },
        },
        responses: {
          '200': {
            description: 'The command ran: stdout in the body, status and stderr in headers',
            headers: {
              'X-Natgw-Status': { required: true, description: "The command's exit status", schema: { type: 'integer' } },
              'X-Natgw-Stderr': {
                required: true,
                description: "The command's stderr, bytes outside printable ASCII (and space and backslash) as \\xHH",
                schema: { type: 'string' },
              },
            },
            content: { 'text/plain': { schema: { type: 'string' } } },
          },
          ...errors('400', '401', '413', '503'),
        },
      },
    },
    '/v1/state': {
      get: {
        operationId: 'get-state',
        tags: ['State'],
        summary: 'Desired state, last applied, drift, backend, generation and digest',
        description: 'The ETag header carries the digest; send it back in If-Match with PUT to write only over the state you read.',
        responses: {
          '200': json(
            {
              type: 'object',
              properties: {
                desired: ref('DesiredState'),
                lastApplied: { oneOf: [ref('DesiredState'), { type: 'null' }] },
                drift: {
                  type: 'object',
                  description:
                    "What the resyncs' read-back of the kernel found: `last` (the latest), `lastRepair` (the latest that found drift and repaired it), `repairs` (how many did)",
                  properties: { last: { type: ['object', 'null'] }, lastRepair: { type: ['object', 'null'] }, repairs: { type: 'integer' } },
                },
                backend: { type: ['object', 'null'] },
                mode: { type: 'string' },
                generation: { type: 'integer' },
                digest: { type: 'string', description: 'sha256 of the canonical JSON of desired' },
              },
            },
            'The state document',
          ),
        },
      },
      put: {
        operationId: 'put-state',
        tags: ['State'],
        summary: 'Replace the whole desired state in one transaction',
        description: 'Accepts the document GET /v1/state returns (read-only fields ignored) or a bare desired state. Duplicate identities are a 400.',
        parameters: [
          query('dryRun', { type: 'boolean', default: false }, 'Return the plan and the rendered backend script; change nothing'),
          { name: 'If-Match', in: 'header', required: false, schema: { type: 'string' }, description: 'Digest the current desired state must have (else 412)' },
        ],
        requestBody: {
          required: true,
          content: {
            'application/json': {
              schema: { oneOf: [ref('DesiredState'), { type: 'object', required: ['desired'], properties: { desired: ref('DesiredState') } }] },
            },
          },
        },
        responses: {
          '200': json(
            {
              type: 'object',
              properties: {
                dryRun: { type: 'boolean' },
                plan: { type: 'object' },
                report: { type: 'object' },
                script: { type: 'string', description: 'The rendered backend script that would be applied (dryRun=true only)' },
                generation: { type: 'integer' },
                digest: { type: 'string' },
              },
            },
            'Applied (or planned)',
          ),
          '412': errorResponse('If-Match did not match the current digest'),
          ...commonErrors,
        },
      },
    },
    '/v1/status': {
      get: {
        operationId: 'status',
        tags: ['State'],
        summary: 'Readiness, backend, desired against applied per kind, last apply, drift (natgw status)',
        parameters: [
          query(
            'check',
            { type: 'boolean', default: false },
            'Also read the kernel back now and report what a resync would repair (drift.check); nothing is applied',
          ),
        ],
        responses: {
          '200': json(
            {
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
                  description: 'What the desired state holds but the kernel does not, and why (a subnet route to a default route the external gateway owns)',
                },
              },
            },
            'The status',
          ),
          '400': errorResponse('check is not a boolean'),
        },
      },
    },
    '/v1/ha': {
      get: {
        operationId: 'get-ha',
        tags: ['Replicas'],
        summary: 'Replica sync (conntrackd), the desired-state digest, the peer comparison and the last takeover',
        description:
          'A peer replica reads `digest` from here to compare desired states (NATGW_HA_PEER_API). Without replica sync, `enabled` is false and `digest` is still there.',
        responses: {
          '200': json(
            {
              type: 'object',
              required: ['enabled', 'digest'],
              properties: {
                enabled: { type: 'boolean' },
                mode: { type: 'string', enum: ['single', 'takeover'], description: 'takeover: NATGW_HA_PEERS is set' },
                role: { type: 'string', enum: ['active', 'standby'], description: 'Only the active replica sends gratuitous ARP; a takeover makes it active' },
                since: { type: 'string', description: 'When the role began (start or takeover)' },
                digest: { type: 'string', description: 'The same digest as GET /v1/state' },
                health: {
                  type: 'object',
                  properties: { enabled: { type: 'boolean' }, healthy: { type: 'boolean' }, reasons: { type: 'array', items: { type: 'string' } } },
                },
                conntrackd: { type: ['object', 'null'], description: 'The supervised process: state, pid, restarts, last exit' },
                sync: {
                  type: ['object', 'null'],
                  description:
                    'Peers (`peer` the first, `peers` all), multicast `group` (null for a pair), local sync address, last exchange, conntrackd statistics',
                },
                peerApi: { type: ['object', 'null'], description: "The peer's digest as last read, whether it differs, the last error" },
                peerApis: { type: 'array', items: { type: 'object' }, description: 'The same for every peer of NATGW_HA_PEER_API, the first one first' },
                lastTakeover: { type: ['object', 'null'] },
              },
            },
            'Replica status',
          ),
          ...errors('401'),
        },
      },
    },
    '/v1/bgp': {
      get: {
        operationId: 'get-bgp',
        tags: ['Replicas'],
        summary: "EIPs announced by BGP: BIRD's state, whether the data plane lets this replica announce, each session and each EIP's advertisement",
        description: 'Read from BIRD at the time of the request. Without NATGW_BGP_PEERS, `enabled` is false and `off` says why.',
        responses: {
          '200': json(
            {
              type: 'object',
              required: ['enabled'],
              properties: {
                enabled: { type: 'boolean' },
                off: { type: 'string' },
                asn: { type: ['integer', 'null'] },
                peerAsn: { type: ['integer', 'null'] },
                routerId: { type: ['string', 'null'] },
                bfd: { type: ['object', 'null'], description: 'intervalMs and multiplier; null: no BFD' },
                bird: { type: ['object', 'null'], description: 'The supervised process: state, pid, restarts, last exit, config and socket paths' },
                announcing: { type: 'boolean', description: 'The data plane is ready: the EIPs are offered to the peers' },
                reasons: { type: 'array', items: { type: 'string' }, description: 'Why not, when announcing is false' },
                lastChange: { type: ['object', 'null'], description: 'The last reconfiguration of BIRD: when, how many EIPs, why' },
                health: { type: 'object' },
                sessions: {
                  type: 'array',
                  items: {
                    type: 'object',
                    properties: {
                      name: { type: 'string' },
                      peer: { type: 'string' },
                      local: { type: 'string', description: 'This replica’s address on the session: the next hop the peer installs' },
                      state: { type: 'string' },
                      established: { type: 'boolean' },
                      since: { type: ['string', 'null'] },
                      info: { type: 'string' },
                      bfd: { type: ['string', 'null'] },
                      exported: { type: 'integer', description: 'Routes advertised on this session' },
                    },
                  },
                },
                eips: {
                  type: 'array',
                  items: {
                    type: 'object',
                    properties: {
                      address: { type: 'string' },
                      prefix: { type: 'string' },
                      offered: { type: 'boolean', description: 'In the routes BIRD offers' },
                      advertised: { type: 'boolean', description: 'Exported on at least one established session' },
                      peers: { type: 'array', items: { type: 'string' } },
                    },
                  },
                },
              },
            },
            'BGP status',
          ),
          ...errors('401'),
        },
      },
    },
    '/v1/ha/takeover': {
      post: {
        operationId: 'ha-takeover',
        tags: ['Replicas'],
        summary: "This replica becomes the active path: commit the peer's flows (conntrackd -c), then gratuitous ARP for every EIP",
        description: 'For a BFD or keepalived hook (SIGUSR2 does the same). Without replica sync it only announces the EIPs.',
        parameters: [query('reason', { type: 'string', maxLength: 200 }, 'Recorded in the log and in lastTakeover')],
        responses: {
          '200': json(
            {
              type: 'object',
              properties: {
                reason: { type: 'string' },
                at: { type: 'string' },
                committed: { type: 'boolean' },
                commitError: { type: 'string' },
                announced: { type: 'array', items: { type: 'string' } },
                interface: { type: 'string' },
                ms: { type: 'integer' },
              },
            },
            'Done',
          ),
          ...errors('401'),
          '503': notDaemon,
        },
      },
    },
    '/v1/ha/resend': {
      post: {
        operationId: 'ha-resend',
        tags: ['Replicas'],
        summary: 'Resend the whole kernel table to the peer (conntrackd -R, then -B)',
        description: 'Called by an active-active peer that (re)joins, over its NATGW_HA_PEER_API: it reports ready only once these flows arrived.',
        responses: {
          '200': json(
            { type: 'object', properties: { resent: { type: 'boolean' }, flows: { type: 'integer' }, reason: { type: 'string' } } },
            'Done (resent false: conntrackd is not running here)',
          ),
          ...errors('401'),
          '503': notDaemon,
        },
      },
    },
  };
  for (const def of RESOURCES) Object.assign(paths, resourcePaths(def));

  return {
    openapi: '3.1.0',
    info: {
      title: 'natgw',
      version: '1',
      description:
        'In-pod NAT gateway agent for Kube-OVN VPC NAT gateways. Served on a Unix socket (no auth; mode 0600) and optionally on TCP, where everything but /healthz and /readyz needs a bearer token or a verified client certificate.',
    },
    components: { schemas, securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } } },
    security: [{ bearer: [] }, {}],
    paths,
  };
}
