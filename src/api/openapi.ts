import { z } from 'zod';
import { desiredStateSchema } from '../state/state.js';
import {
  bgpStatusBody,
  commandOutputBody,
  errorBody,
  haStatusBody,
  healthBody,
  readinessBody,
  replaceResultBody,
  resendBody,
  stateDocumentBody,
  statusBody,
  takeoverBody,
} from './bodies.js';
import { RESOURCES, type ResourceDef } from './resources.js';

/**
 * The OpenAPI 3 description of the v1 API, served at /v1/openapi.json. Every schema comes from
 * the zod schemas that validate the request bodies and type the response bodies; a test walks
 * the express router and keeps this document's paths and methods in step with the routes.
 */
type Json = Record<string, unknown>;

/** The named schemas of the document, each a component the operations refer to. */
function componentSchemas(): Json {
  const registry = z.registry<{ id: string }>();
  const named: Record<string, z.ZodType> = {
    Error: errorBody,
    CommandOutput: commandOutputBody,
    DesiredState: desiredStateSchema,
    StateDocument: stateDocumentBody,
    ReplaceResult: replaceResultBody,
    Status: statusBody,
    Health: healthBody,
    Readiness: readinessBody,
    HaStatus: haStatusBody,
    Takeover: takeoverBody,
    Resend: resendBody,
    BgpStatus: bgpStatusBody,
  };
  for (const def of RESOURCES) named[schemaName(def)] = def.schema;
  for (const [id, schema] of Object.entries(named)) registry.add(schema, { id });
  const { schemas } = z.toJSONSchema(registry, { io: 'input', unrepresentable: 'any', uri: (id) => `#/components/schemas/${id}` });
  return Object.fromEntries(Object.entries(schemas).map(([id, { $schema: _s, $id: _i, ...schema }]) => [id, schema]));
}

const ref = (name: string): Json => ({ $ref: `#/components/schemas/${name}` });
const json = (schema: Json, description: string): Json => ({ description, content: { 'application/json': { schema } } });
const errorResponse = (description: string): Json => json(ref('Error'), description);
const query = (name: string, schema: Json, description: string): Json => ({ name, in: 'query', required: false, schema, description });
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
const notDaemon = errorResponse('Not the daemon (no replica part), or shutting down.');

/** One operation of the document: a path, a method and what the OpenAPI operation object holds. */
interface Operation {
  /** `<method> <path>`, the path in OpenAPI's form (`/v1/dnats/{id}`). */
  readonly route: `${'get' | 'put' | 'post' | 'delete'} ${string}`;
  readonly operationId: string;
  readonly tag: string;
  readonly summary: string;
  readonly description?: string | undefined;
  readonly parameters?: Json[];
  readonly requestBody?: Json;
  readonly responses: Json;
}

function resourceOperations(def: ResourceDef): Operation[] {
  const name = schemaName(def);
  const item = { allOf: [{ type: 'object', properties: { id: { type: 'string', description: 'The identity, as in URLs (unencoded)' } } }, ref(name)] };
  const guard = def.guarded ? ' Refused (409, not-initialized) until init has run.' : '';
  const one = `/v1/${def.path}/{id}`;
  const tag = def.title;
  const id = {
    name: 'id',
    in: 'path',
    required: true,
    description: `The identity: ${def.idFields.join(',')} (comma-separated; a CIDR's "/" written %2F)${def.idNote ? `. ${def.idNote}` : ''}`,
    schema: { type: 'string' },
    example: def.idExample,
  };
  return [
    {
      route: `get /v1/${def.path}`,
      operationId: `list-${def.path}`,
      tag,
      summary: `List ${def.title} objects`,
      description: def.description,
      responses: { '200': json({ type: 'object', required: ['items'], properties: { items: { type: 'array', items: item } } }, 'The desired objects') },
    },
    {
      route: `get ${one}`,
      operationId: `get-${def.path}`,
      tag,
      summary: `Get one ${def.title}`,
      parameters: [id],
      responses: { '200': json(item, 'The object'), ...errors('400'), '404': errorResponse('No such object') },
    },
    {
      route: `put ${one}`,
      operationId: `put-${def.path}`,
      tag,
      summary: `Create or update a ${def.title} (idempotent)`,
      description: `${def.description}${guard} Identity fields may be repeated in the body but must match the path.${def.readOnly.length ? ` Read-only fields ignored: ${def.readOnly.join(', ')}.` : ''}`,
      parameters: def.replaceable
        ? [id, query('replace', { type: 'boolean', default: false }, 'Replace an existing object with another target instead of answering 409')]
        : [id],
      requestBody: { required: true, content: { 'application/json': { schema: ref(name), example: def.bodyExample } } },
      responses: { '200': json(item, 'Already present (unchanged or updated)'), '201': json(item, 'Created'), ...commonErrors },
    },
    {
      route: `delete ${one}`,
      operationId: `delete-${def.path}`,
      tag,
      summary: `Delete a ${def.title} (absent is success)`,
      description: guard.trim() || undefined,
      parameters: [id],
      responses: { '204': { description: 'Deleted, or was not there' }, ...errors('400', '401', '409', '500', '503') },
    },
  ];
}

/** The script's command with its rules, as JSON or as the shim's curl client sends it. */
const legacyFields = (rules: string, rulesSchema: Json): Json => ({
  type: 'object',
  required: ['command'],
  additionalProperties: false,
  properties: { command: { type: 'string' }, [rules]: rulesSchema },
});

const OPERATIONS: readonly Operation[] = [
  {
    route: 'get /healthz',
    operationId: 'healthz',
    tag: 'Probes',
    summary: 'Process alive (open over TCP)',
    responses: { '200': json(ref('Health'), 'Alive') },
  },
  {
    route: 'get /readyz',
    operationId: 'readyz',
    tag: 'Probes',
    summary: 'Interfaces present and last sync succeeded (open over TCP)',
    parameters: [
      query(
        'waitMs',
        { type: 'integer', minimum: 0, maximum: 30000 },
        'Hold the answer until ready or this many milliseconds passed (at most 30000), then answer as without it',
      ),
    ],
    responses: { '200': json(ref('Readiness'), 'Ready'), '503': json(ref('Readiness'), 'Not ready; `reasons` says why') },
  },
  {
    route: 'get /metrics',
    operationId: 'metrics',
    tag: 'Probes',
    summary: 'Prometheus metrics',
    responses: { '200': { description: 'Prometheus text format', content: { 'text/plain': { schema: { type: 'string' } } } } },
  },
  {
    route: 'get /v1/openapi.json',
    operationId: 'openapi',
    tag: 'Meta',
    summary: 'This document',
    responses: { '200': json({ type: 'object' }, 'OpenAPI 3 document') },
  },
  {
    route: 'post /v1/legacy',
    operationId: 'legacy',
    tag: 'Legacy',
    summary: 'Run a nat-gateway.sh command exactly as the shim would',
    description: 'HTTP 200 whenever the command ran, whatever its own status (in the body); 4xx only for a malformed request.',
    requestBody: {
      required: true,
      content: {
        'application/json': {
          schema: legacyFields('rules', { type: 'array', items: { type: 'string' }, default: [] }),
          example: { command: 'dnat-add', rules: ['172.20.0.10,8080,tcp,10.0.1.6,80'] },
        },
      },
    },
    responses: { '200': json(ref('CommandOutput'), 'The command ran'), ...errors('400', '401', '413', '503') },
  },
  {
    route: 'post /v1/legacy/raw',
    operationId: 'legacy-raw',
    tag: 'Legacy',
    summary: "Run a nat-gateway.sh command; form-encoded request, raw output (the shim's curl client)",
    description:
      'The same command as POST /v1/legacy, shaped for a client without a JSON parser: the body is `command=<c>` followed by one `rule=<r>` per argument, in order (`curl --data-urlencode`); empty rules are kept. ' +
      "On HTTP 200 the response body is the command's stdout byte for byte, `X-Natgw-Status` its exit status and `X-Natgw-Stderr` its stderr, in which every byte but printable ASCII other than space and backslash is written `\\xHH` (bash: `printf %b`). " +
      'HTTP 200 whenever the command ran, whatever its own status; 4xx only for a malformed request. Same body limit as JSON.',
    requestBody: {
      required: true,
      content: {
        'application/x-www-form-urlencoded': {
          schema: legacyFields('rule', { type: 'array', items: { type: 'string' }, description: 'One field per argument, repeated' }),
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
  {
    route: 'get /v1/state',
    operationId: 'get-state',
    tag: 'State',
    summary: 'Desired state, last applied, drift, backend, generation and digest',
    description: 'The ETag header carries the digest; send it back in If-Match with PUT to write only over the state you read.',
    responses: { '200': json(ref('StateDocument'), 'The state document') },
  },
  {
    route: 'put /v1/state',
    operationId: 'put-state',
    tag: 'State',
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
      '200': json(ref('ReplaceResult'), 'Applied (or planned)'),
      '412': errorResponse('If-Match did not match the current digest'),
      ...commonErrors,
    },
  },
  {
    route: 'get /v1/status',
    operationId: 'status',
    tag: 'State',
    summary: 'Readiness, backend, desired against applied per kind, last apply, drift (natgw status)',
    parameters: [
      query(
        'check',
        { type: 'boolean', default: false },
        'Also read the kernel back now and report what a resync would repair (drift.check); nothing is applied',
      ),
    ],
    responses: { '200': json(ref('Status'), 'The status'), '400': errorResponse('check is not a boolean') },
  },
  {
    route: 'get /v1/ha',
    operationId: 'get-ha',
    tag: 'Replicas',
    summary: 'Replica sync (conntrackd), the desired-state digest, the peer comparison and the last takeover',
    description:
      'A peer replica reads `digest` from here to compare desired states (NATGW_HA_PEER_API). Without replica sync, `enabled` is false and `digest` is still there.',
    responses: { '200': json(ref('HaStatus'), 'Replica status'), ...errors('401') },
  },
  {
    route: 'get /v1/bgp',
    operationId: 'get-bgp',
    tag: 'Replicas',
    summary: "EIPs announced by BGP: BIRD's state, whether the data plane lets this replica announce, each session and each EIP's advertisement",
    description: 'Read from BIRD at the time of the request. Without NATGW_BGP_PEERS, `enabled` is false and `off` says why.',
    responses: { '200': json(ref('BgpStatus'), 'BGP status'), ...errors('401') },
  },
  {
    route: 'post /v1/ha/takeover',
    operationId: 'ha-takeover',
    tag: 'Replicas',
    summary: "This replica becomes the active path: commit the peer's flows (conntrackd -c), then gratuitous ARP for every EIP",
    description: 'For a BFD or keepalived hook (SIGUSR2 does the same). Without replica sync it only announces the EIPs.',
    parameters: [query('reason', { type: 'string', maxLength: 200 }, 'Recorded in the log and in lastTakeover')],
    responses: { '200': json(ref('Takeover'), 'Done'), ...errors('401'), '503': notDaemon },
  },
  {
    route: 'post /v1/ha/resend',
    operationId: 'ha-resend',
    tag: 'Replicas',
    summary: 'Resend the whole kernel table to the peer (conntrackd -R, then -B)',
    description: 'Called by an active-active peer that (re)joins, over its NATGW_HA_PEER_API: it reports ready only once these flows arrived.',
    responses: { '200': json(ref('Resend'), 'Done (resent false: conntrackd is not running here)'), ...errors('401'), '503': notDaemon },
  },
];

export function buildOpenApi(): Json {
  const paths: Record<string, Json> = {};
  for (const { route, tag, ...operation } of [...OPERATIONS, ...RESOURCES.flatMap(resourceOperations)]) {
    const [method = '', path = ''] = route.split(' ');
    paths[path] = { ...paths[path], [method]: { ...operation, tags: [tag] } };
  }
  return {
    openapi: '3.1.0',
    info: {
      title: 'natgw',
      version: '1',
      description:
        'In-pod NAT gateway agent for Kube-OVN VPC NAT gateways. Served on a Unix socket (no auth; mode 0600) and optionally on TCP, where everything but /healthz and /readyz needs a bearer token or a verified client certificate.',
    },
    components: { schemas: componentSchemas(), securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } } },
    security: [{ bearer: [] }, {}],
    paths,
  };
}
