import { z } from 'zod';
import * as Ops from '../state/operations.js';
import * as QOps from '../state/qosOperations.js';
import type { OpResult } from '../state/operations.js';
import type { DesiredState } from '../state/state.js';
import {
  type Dnat,
  type Eip,
  type Fip,
  type Route,
  type ShareDnat,
  type Snat,
  type DnatId,
  dnatKey,
  dnatSchema,
  eipKey,
  portText,
  eipSchema,
  fipKey,
  fipSchema,
  ipSchema,
  ipv4Schema,
  networkCidrSchema,
  portSchema,
  protocolSchema,
  routeKey,
  routeSchema,
  shareDnatSchema,
  snatKey,
  snatSchema,
  ifnameSchema,
} from '../model/rules.js';
import { type EipQos, type GwQos, type GwQosId, canonicalQosCidr, directionSchema, eipQosKey, eipQosSchema, gwQosKey, gwQosSchema } from '../model/qos.js';
import { familyOf } from '../model/net.js';
import { type Neighbour, neighbourKey, neighbourSchema } from '../model/neighbour.js';
import * as NOps from '../state/neighbourOperations.js';
import { HttpError } from './errors.js';
import type { UplinkNetwork } from '../model/uplinks.js';

/**
 * The API's resources (SPEC §4.2). Each is a list in the desired state with an identity —
 * the same identity under which the script's add is strict and its delete lenient. In a URL
 * the identity is one path segment: its fields joined by commas in the order of the script's
 * delete rule (`/v1/dnats/172.20.0.10,8080,tcp`); a CIDR's `/` is written `%2F`.
 *
 * PUT is create-or-update by identity with the script's semantics: where the script refuses
 * another target (a DNAT or FIP bound elsewhere), PUT answers 409 with the script's message,
 * unless `?replace=true` asks to replace it (the old binding is removed, and its conntrack
 * entries flushed, in the same transaction). Where the script updates in place (EIP prefix,
 * route nexthop, share-DNAT backends, QoS rate), PUT does too. A SNAT's identity is
 * (eip, cidr): re-adding it with another `randomFully` changes nothing, as in the script,
 * unless `?replace=true`. DELETE of an absent identity succeeds.
 */
type StateKey = 'eips' | 'snats' | 'dnats' | 'fips' | 'shareDnats' | 'routes' | 'eipQos' | 'qos' | 'neighbours';

interface PutContext {
  readonly gateways: { readonly v4?: string; readonly v6?: string };
  /** Several external interfaces: their networks (where an EIP without `interface` lives); none with one. */
  readonly networks: readonly UplinkNetwork[];
}

export interface ResourceDef<T = unknown, I = unknown> {
  readonly stateKey: StateKey;
  /** URL segment: /v1/<path>, the state key in kebab case. */
  readonly path: string;
  readonly title: string;
  readonly description: string;
  /** Identity fields, in URL order. */
  readonly idFields: readonly string[];
  readonly idExample: string;
  /** More on the identity's form, for the API document (e.g. a DNAT's port range). */
  readonly idNote?: string;
  /** Identity fields that are numbers in the body (ports, priorities). */
  readonly numericIdFields: readonly string[];
  readonly idSchema: z.ZodType<I>;
  /** The whole object, as a PUT body merged with the identity from the path. */
  readonly schema: z.ZodType<T>;
  /** Fields natgw owns (allocated ids): ignored in a body. */
  readonly readOnly: readonly string[];
  /** A body with this example is valid for the identity idExample. */
  readonly bodyExample: Record<string, unknown>;
  readonly guarded: boolean;
  readonly qos: boolean;
  /**
   * ?replace=true makes a PUT that the operation would refuse or ignore (another target, another
   * randomFully) remove the object and add the new one in the same transaction.
   */
  readonly replaceable: boolean;
  key(x: I | T): string;
  /** Last checks a schema cannot express (e.g. prefix length per family). */
  check?(x: T): void;
  /** The identity segment when it is not the idFields joined by commas (a DNAT's port range). */
  idText?(x: T): string;
  /** Fill in body fields derived from the identity (e.g. a share-DNAT's protocol text). */
  prepare?(idRaw: Record<string, unknown>, body: Record<string, unknown>): Record<string, unknown>;
  /** The script's add: strict where the script is, in place where it updates. */
  put(s: DesiredState, x: T, ctx: PutContext): OpResult;
  del(s: DesiredState, id: I): OpResult;
}

/** The flags most resources share, left out of their definitions: no numeric or read-only fields, guarded, not QoS, no ?replace. */
const DEFAULTS = { numericIdFields: [], readOnly: [], guarded: true, qos: false, replaceable: false } as const;

function define<T, I>(def: Omit<ResourceDef<T, I>, keyof typeof DEFAULTS | 'path'> & Partial<Pick<ResourceDef<T, I>, keyof typeof DEFAULTS>>): ResourceDef {
  const path = def.stateKey.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
  return { ...DEFAULTS, ...def, path } as unknown as ResourceDef;
}

const eips = define<Eip, { address: string }>({
  stateKey: 'eips',
  title: 'EIP',
  description:
    'An external address on EXT (eip-add / eip-del), with its hairpin SNAT; creating one installs the default routes from GATEWAY_V4/GATEWAY_V6 as eip-add does.',
  idFields: ['address'],
  idExample: '172.20.0.10',
  idSchema: z.object({ address: ipSchema }),
  schema: eipSchema,
  bodyExample: { prefixLength: 24 },
  key: (x) => eipKey(x),
  check: (x) => {
    if (familyOf(x.address) === 4 && x.prefixLength > 32) {
      throw new HttpError(400, 'validation', 'prefixLength: must be at most 32 for an IPv4 address', { field: 'prefixLength', in: 'body' });
    }
  },
  put: (s, x, ctx) => Ops.addEip(s, x, ctx.gateways, ctx.networks),
  del: (s, id) => Ops.delEip(s, id.address),
});

const snats = define<Snat, Pick<Snat, 'eip' | 'cidr'>>({
  stateKey: 'snats',
  title: 'SNAT',
  description:
    "Source NAT of a VPC CIDR behind an EIP (snat-add / snat-del), or behind a pool of EIPs (`eips`, starting with the identity's eip): new connections take the pool's EIPs in turn; EIPs listed in `draining` take no new connections while their established ones carry on (PUT with `?replace=true` to change a SNAT). The CIDR is canonicalised; rules are kept longest prefix first.",
  idFields: ['eip', 'cidr'],
  idExample: '172.20.0.10,10.0.1.0%2F24',
  idSchema: z.object({ eip: ipSchema, cidr: networkCidrSchema }),
  schema: snatSchema,
  bodyExample: { randomFully: true },
  replaceable: true,
  key: (x) => snatKey(x),
  put: (s, x) => Ops.addSnat(s, x),
  del: (s, id) => Ops.delSnat(s, id),
});

/** A port `8080` or a port range `8000-8100` in a DNAT's path: { port, portEnd? }. */
const portOrRangeSchema = z.union([
  portSchema.transform((port) => ({ port })),
  z
    .string()
    .regex(/^\d{1,5}-\d{1,5}$/, 'must be a port or a port range a-b')
    .transform((t, ctx) => {
      const [port = 0, portEnd = 0] = t.split('-').map(Number);
      if (port < 1 || portEnd > 65535 || portEnd <= port) {
        ctx.addIssue({ code: 'custom', message: 'must be a port range a-b with 1 <= a < b <= 65535' });
        return z.NEVER;
      }
      return { port, portEnd };
    }),
]);

const dnats = define<Dnat, DnatId>({
  stateKey: 'dnats',
  title: 'DNAT',
  description:
    'A port forward from an EIP to a VPC address (dnat-add / dnat-del), or of a port range (path `172.20.0.10,8000-8100,tcp`, body `portEnd`), each port onto the same port of internalIp. Another target for an existing identity, or a range overlapping another DNAT of that eip and protocol, is a conflict (409, naming the holder) unless ?replace=true replaces the same identity.',
  idFields: ['eip', 'port', 'protocol'],
  idExample: '172.20.0.10,8080,tcp',
  idNote: 'The port may be a range a-b, e.g. 172.20.0.10,8000-8100,tcp (the body then needs only internalIp)',
  numericIdFields: ['port'],
  idSchema: z.object({ eip: ipSchema, port: portOrRangeSchema, protocol: protocolSchema }).transform(({ port, ...rest }) => ({ ...rest, ...port })),
  idText: (x) => `${x.eip},${portText(x)},${x.protocol}`,
  // A range in the path becomes the body's port and portEnd (and the internal port, which must equal it).
  prepare: (idRaw, body) => {
    const m = typeof idRaw.port === 'string' ? /^(\d{1,5})-(\d{1,5})$/.exec(idRaw.port) : null;
    if (!m) return body;
    const port = Number(m[1]);
    return { ...body, port, portEnd: body.portEnd ?? Number(m[2]), internalPort: body.internalPort ?? port };
  },
  schema: dnatSchema,
  bodyExample: { internalIp: '10.0.1.6', internalPort: 80 },
  replaceable: true,
  key: (x) => dnatKey(x),
  put: (s, x) => Ops.addDnat(s, x),
  del: (s, id) => Ops.delDnat(s, id),
});

const fips = define<Fip, Pick<Fip, 'eip'>>({
  stateKey: 'fips',
  title: 'FIP',
  description:
    'A floating IP: 1:1 NAT between an EIP and a VPC address (floating-ip-add / floating-ip-del). Another internal address is a conflict (409) unless ?replace=true.',
  idFields: ['eip'],
  idExample: '172.20.0.11',
  idSchema: z.object({ eip: ipSchema }),
  schema: fipSchema,
  bodyExample: { internalIp: '10.0.1.7' },
  replaceable: true,
  key: (x) => fipKey(x),
  put: (s, x) => Ops.addFip(s, x),
  del: (s, id) => Ops.delFip(s, id.eip),
});

const shareDnats = define<ShareDnat, Pick<ShareDnat, 'eip' | 'port' | 'protocol'>>({
  stateKey: 'shareDnats',
  title: 'Share DNAT',
  description:
    'A load-balanced DNAT in nftables table ip kube-ovn (nft-dnat-map-add / -del). PUT replaces the backends atomically. protocolText (default: the protocol as written in the path) names the chain, as in the script.',
  idFields: ['eip', 'port', 'protocol'],
  idExample: '172.20.0.10,9000,tcp',
  numericIdFields: ['port'],
  idSchema: z.object({ eip: ipv4Schema, port: portSchema, protocol: protocolSchema }),
  schema: shareDnatSchema,
  bodyExample: {
    backends: [
      { ip: '10.0.1.6', port: 80 },
      { ip: '10.0.1.7', port: 80 },
    ],
  },
  key: (x) => dnatKey(x),
  prepare: (idRaw, body) => ({
    ...body,
    protocolText: body.protocolText ?? (typeof body.protocol === 'string' ? body.protocol : idRaw.protocol),
  }),
  put: (s, x) => Ops.addShareDnat(s, x),
  del: (s, id) => Ops.delShareDnat(s, id),
});

const routes = define<Route, Pick<Route, 'cidr'>>({
  stateKey: 'routes',
  title: 'Subnet route',
  description:
    'A route for a VPC subnet via a nexthop on the VPC interface (subnet-route-add / -del). PUT replaces the nexthop. A route to 0.0.0.0/0 or ::/0 while the external default route (eip-add with GATEWAY_V4 / GATEWAY_V6) owns that family is a conflict (409): the gateway has one default route per family.',
  idFields: ['cidr'],
  idExample: '10.0.2.0%2F24',
  idSchema: z.object({ cidr: networkCidrSchema }),
  schema: routeSchema,
  bodyExample: { nexthop: '10.0.1.254' },
  key: (x) => routeKey(x),
  put: (s, x) => Ops.addRoute(s, x),
  del: (s, id) => Ops.delRoute(s, id.cidr),
});

const eipQos = define<EipQos, Pick<EipQos, 'direction' | 'ip'>>({
  stateKey: 'eipQos',
  title: 'EIP QoS',
  description:
    'Shaping of the traffic from (egress) or to (ingress) one EIP (eip-*-qos-add / -del). PUT updates the rate in place. classId and handle are allocated by natgw.',
  idFields: ['direction', 'ip'],
  idExample: 'egress,172.20.0.10',
  idSchema: z.object({ direction: directionSchema, ip: ipv4Schema }),
  schema: eipQosSchema,
  readOnly: ['classId', 'handle'],
  bodyExample: { priority: 1, rate: '10', burst: '1' },
  guarded: false,
  qos: true,
  key: (x) => eipQosKey(x),
  put: (s, x) => QOps.addEipQos(s, x),
  del: (s, id) => QOps.delEipQos(s, id.direction, id.ip),
});

const qos = define<GwQos, GwQosId>({
  stateKey: 'qos',
  title: 'Gateway QoS',
  description:
    'A gateway-wide shaping rule (qos-add / qos-del). Identity: direction,dev,priority,classifier,matchDirection,cidr (the last two empty for matchall). matchType defaults to ip for u32 and empty for matchall. classId and handle are allocated by natgw.',
  idFields: ['direction', 'dev', 'priority', 'classifier', 'matchDirection', 'cidr'],
  idExample: 'egress,net1,10,u32,dst,10.0.1.0%2F24',
  numericIdFields: ['priority'],
  idSchema: z.object({
    direction: directionSchema,
    dev: ifnameSchema,
    priority: z.number().int().min(0).max(65535),
    classifier: z.enum(['u32', 'matchall']),
    matchDirection: z.enum(['src', 'dst', '']),
    cidr: z.string().transform((s) => canonicalQosCidr(s) ?? s),
  }),
  schema: gwQosSchema,
  readOnly: ['classId', 'handle'],
  bodyExample: { rate: '100', burst: '2' },
  guarded: false,
  qos: true,
  key: (x) => gwQosKey(x),
  prepare: (idRaw, body) => ({
    ...body,
    matchType: body.matchType ?? ((body.classifier ?? idRaw.classifier) === 'u32' ? 'ip' : ''),
  }),
  put: (s, x) => QOps.addGwQos(s, x),
  del: (s, id) => QOps.delGwQos(s, id),
});

const neighbours = define<Neighbour, Pick<Neighbour, 'address' | 'dev'>>({
  stateKey: 'neighbours',
  title: 'Static neighbour',
  description:
    'A PERMANENT neighbour entry natgw owns: address on dev with mac, or without mac the synthetic 0a:58 followed by the IPv4 address (IPv6: its last four bytes), so the kernel never sends ARP or neighbour solicitations for it. Re-applied when the device is recreated or its entries are flushed. PUT updates the MAC in place.',
  idFields: ['dev', 'address'],
  idExample: 'eth0,10.0.1.50',
  idSchema: z.object({ dev: ifnameSchema, address: ipSchema }),
  schema: neighbourSchema,
  bodyExample: { mac: '0a:58:0a:00:01:32' },
  guarded: false,
  key: (x) => neighbourKey(x),
  put: (s, x) => NOps.addNeighbour(s, x),
  del: (s, id) => NOps.delNeighbour(s, id),
});

export const RESOURCES: readonly ResourceDef[] = [eips, snats, dnats, fips, shareDnats, routes, eipQos, qos, neighbours];

/** The identity segment of a stored object, as it appears in URLs (before percent-encoding). */
export function idOf(def: ResourceDef, x: unknown): string {
  if (def.idText) return def.idText(x);
  const o = x as Record<string, unknown>;
  return def.idFields.map((f) => String(o[f] ?? '')).join(',');
}

/** The raw identity fields of a URL segment (numbers where the body has numbers). */
export function splitId(def: ResourceDef, id: string): Record<string, unknown> {
  const parts = id.split(',');
  if (parts.length !== def.idFields.length) {
    throw new HttpError(400, 'validation', `id: must be ${def.idFields.join(',')} (e.g. ${decodeURIComponent(def.idExample)}), got ${parts.length} field(s)`, {
      field: 'id',
      in: 'path',
    });
  }
  const raw: Record<string, unknown> = {};
  def.idFields.forEach((f, i) => {
    const v = parts[i] ?? '';
    raw[f] = def.numericIdFields.includes(f) && /^\d{1,6}$/.test(v) ? Number(v) : v;
  });
  return raw;
}
