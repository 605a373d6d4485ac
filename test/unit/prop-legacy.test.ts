/**
 * Property tests (fast-check) of every legacy rule parser and of the legacy command runner:
 * arbitrary text never crashes a parser (it returns a value the zod schemas accept, or throws
 * a ValidationError with one line that says why), refused input never reaches a tool (a real
 * Engine over recording fakes: the count of tool calls does not move), and generated valid
 * rules round-trip through the parser to the value they were written from.
 */
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as P from '../../src/model/legacy.js';
import * as Q from '../../src/model/qosLegacy.js';
import { ValidationError } from '../../src/model/errors.js';
import { dnatSchema, fipSchema, routeSchema, shareDnatSchema, snatSchema } from '../../src/model/rules.js';
import { eipQosSchema, gwQosSchema } from '../../src/model/qos.js';
import { runLegacy } from '../../src/engine/legacy.js';
import type { Engine } from '../../src/engine/engine.js';
import { RecordingKernel } from '../helpers/recordingKernel.js';

const RUNS = Number(process.env.NATGW_PROP_RUNS ?? 300);

/** Text that looks like a rule often enough to get past the first checks: fields of hostile and plausible pieces. */
const piece = fc.oneof(
  fc.constantFrom('172.20.0.10', '10.0.1.6', '0.0.0.0', '255.255.255.255', '1.2.3.4/24', '10.0.0.0/33', '010.0.1.6', '::ffff:10.0.1.6', 'fd00::1'),
  fc.constantFrom('80', '0', '65535', '65536', '-1', '08080', '1e3', ' 80', 'tcp', 'UDP', 'sctp', '--random-fully', '-j ACCEPT'),
  fc.constantFrom(
    '$(reboot)',
    '`id`',
    ';',
    '}',
    '#',
    '\n',
    '\r',
    '\0',
    '|',
    '&&',
    "'",
    '"',
    ' ',
    '@',
    ':',
    'ingress',
    'egress',
    'u32',
    'matchall',
    'net1',
    'eth0',
    'a'.repeat(16),
  ),
  fc.string({ maxLength: 12 }),
  fc.string({ unit: 'binary', maxLength: 8 }),
);
const hostileRule = fc.oneof(
  fc.string({ maxLength: 60 }),
  fc.string({ unit: 'binary', maxLength: 40 }),
  fc.array(piece, { minLength: 1, maxLength: 10 }).map((xs) => xs.join(',')),
  fc.array(piece, { minLength: 1, maxLength: 10 }).map((xs) => xs.join('')),
);

type Parser = (rule: string) => unknown;
const PARSERS: ReadonlyArray<[string, Parser, ((v: unknown) => unknown) | undefined]> = [
  ['parseRouteAdd', P.parseRouteAdd, (v) => routeSchema.parse(v)],
  ['parseRouteDel', P.parseRouteDel, undefined],
  ['parseEip', P.parseEip, undefined],
  ['parseFipAdd', P.parseFipAdd, (v) => fipSchema.parse(v)],
  ['parseFipDel', P.parseFipDel, undefined],
  ['parseDnatAdd', P.parseDnatAdd, (v) => dnatSchema.parse(v)],
  ['parseDnatDel', P.parseDnatDel, undefined],
  ['parseSnatAdd', P.parseSnatAdd, (v) => snatSchema.parse(v)],
  ['parseSnatDel', P.parseSnatDel, undefined],
  ['parseShareDnatAdd', P.parseShareDnatAdd, (v) => shareDnatSchema.parse(v)],
  ['parseShareDnatDel', P.parseShareDnatDel, undefined],
  ['parseEipQosAdd ingress', (r) => Q.parseEipQosAdd(r, 'ingress'), (v) => eipQosSchema.parse(v)],
  ['parseEipQosAdd egress', (r) => Q.parseEipQosAdd(r, 'egress'), (v) => eipQosSchema.parse(v)],
  ['parseEipQosDel', (r) => Q.parseEipQosDel(r, 'egress'), undefined],
  ['parseGwQos', Q.parseGwQos, (v) => gwQosSchema.parse(v)],
  ['parseGwQosDel', Q.parseGwQosDel, undefined],
];

/** Strings a parser hands on must carry nothing a tool could read as syntax. */
const SAFE_TEXT = /^[A-Za-z0-9_.:/-]*$/;
function safeStrings(v: unknown): boolean {
  if (typeof v === 'string') return SAFE_TEXT.test(v);
  if (Array.isArray(v)) return v.every(safeStrings);
  if (v && typeof v === 'object') return Object.values(v).every(safeStrings);
  return true;
}

describe('legacy rule parsers on arbitrary text', () => {
  it.each(PARSERS)('%s returns a schema-valid value or refuses with one line', (_name, parse, schema) => {
    fc.assert(
      fc.property(hostileRule, (rule) => {
        let v: unknown;
        try {
          v = parse(rule);
        } catch (e) {
          expect(e).toBeInstanceOf(ValidationError);
          const msg = (e as Error).message;
          expect(msg).toMatch(/^Error: /);
          expect(msg).not.toMatch(/[\x00-\x1f\x7f]/);
          return;
        }
        if (schema) schema(v);
        expect(safeStrings(v), JSON.stringify(v)).toBe(true);
      }),
      { numRuns: RUNS },
    );
  });
});

// ---- valid rules round-trip ----

const octet = fc.integer({ min: 0, max: 255 });
const ipv4 = fc.tuple(octet, octet, octet, octet).map((o) => o.join('.'));
const port = fc.integer({ min: 1, max: 65535 });
const proto = fc.constantFrom('tcp', 'udp', 'TCP', 'Udp');
const prefix = fc.integer({ min: 0, max: 32 });
/** The network of addr/len, host bits cleared: what natgw canonicalises to. */
function network(addr: string, len: number): string {
  const n = addr.split('.').reduce((a, o) => a * 256 + Number(o), 0);
  const mask = len === 0 ? 0 : (0xffffffff << (32 - len)) >>> 0;
  const net = (n & mask) >>> 0;
  return `${[24, 16, 8, 0].map((s) => (net >>> s) & 255).join('.')}/${len}`;
}

describe('generated valid rules round-trip through the parsers', () => {
  it('dnat-add', () => {
    fc.assert(
      fc.property(ipv4, port, proto, ipv4, port, (eip, p, pr, ip, ip2) => {
        expect(P.parseDnatAdd(`${eip},${p},${pr},${ip},${ip2}`)).toEqual({ eip, port: p, protocol: pr.toLowerCase(), internalIp: ip, internalPort: ip2 });
        expect(P.parseDnatDel(`${eip},${p},${pr}`)).toEqual({ eip, port: p, protocol: pr.toLowerCase() });
      }),
      { numRuns: RUNS },
    );
  });
  it('snat-add', () => {
    fc.assert(
      fc.property(ipv4, ipv4, prefix, fc.boolean(), (eip, addr, len, rf) => {
        expect(P.parseSnatAdd(`${eip},${addr}/${len}${rf ? ',--random-fully' : ''}`)).toEqual({ eip, cidr: network(addr, len), randomFully: rf });
      }),
      { numRuns: RUNS },
    );
  });
  it('floating-ip-add, subnet-route-add, eip-add', () => {
    fc.assert(
      fc.property(ipv4, ipv4, prefix, (a, b, len) => {
        expect(P.parseFipAdd(`${a},${b}`)).toEqual({ eip: a, internalIp: b });
        expect(P.parseRouteAdd(`${a}/${len},${b}`)).toEqual({ cidr: network(a, len), nexthop: b });
        expect(P.parseEip(`${a}/${len}`)).toEqual({ address: a, prefixLength: len });
      }),
      { numRuns: RUNS },
    );
  });
  it('nft-dnat-map-add', () => {
    fc.assert(
      fc.property(ipv4, port, fc.constantFrom('tcp', 'udp', 'TCP', 'UDP'), fc.array(fc.tuple(ipv4, port), { minLength: 1, maxLength: 8 }), (eip, p, pr, bs) => {
        const rule = `${eip},${p},${pr},${bs.map(([ip, bp]) => `${ip}:${bp}`).join('@')}`;
        expect(P.parseShareDnatAdd(rule)).toEqual({
          eip,
          port: p,
          protocol: pr.toLowerCase(),
          protocolText: pr,
          backends: bs.map(([ip, bp]) => ({ ip, port: bp })),
        });
      }),
      { numRuns: RUNS },
    );
  });
  it('eip-*-qos-add', () => {
    fc.assert(
      fc.property(ipv4, fc.integer({ min: 0, max: 65535 }), fc.integer({ min: 1, max: 10000 }), fc.integer({ min: 1, max: 100 }), (ip, prio, rate, burst) => {
        expect(Q.parseEipQosAdd(`${ip},${prio},${rate},${burst}`, 'egress')).toEqual({
          direction: 'egress',
          ip,
          priority: prio,
          rate: String(rate),
          burst: String(burst),
        });
      }),
      { numRuns: RUNS },
    );
  });
});

// ---- refused input never reaches a tool ----

const GUARDED_COMMANDS = [
  'subnet-route-add',
  'subnet-route-del',
  'eip-add',
  'eip-del',
  'floating-ip-add',
  'floating-ip-del',
  'dnat-add',
  'dnat-del',
  'snat-add',
  'snat-del',
  'nft-dnat-map-add',
  'nft-dnat-map-del',
] as const;
const QOS_COMMANDS = ['eip-ingress-qos-add', 'eip-egress-qos-add', 'eip-ingress-qos-del', 'eip-egress-qos-del', 'qos-add', 'qos-del'] as const;
const PARSE_OF: Record<string, Parser> = {
  'subnet-route-add': P.parseRouteAdd,
  'subnet-route-del': P.parseRouteDel,
  'eip-add': P.parseEip,
  'eip-del': P.parseEip,
  'floating-ip-add': P.parseFipAdd,
  'floating-ip-del': P.parseFipDel,
  'dnat-add': P.parseDnatAdd,
  'dnat-del': P.parseDnatDel,
  'snat-add': P.parseSnatAdd,
  'snat-del': P.parseSnatDel,
  'nft-dnat-map-add': P.parseShareDnatAdd,
  'nft-dnat-map-del': P.parseShareDnatDel,
  'eip-ingress-qos-add': (r) => Q.parseEipQosAdd(r, 'ingress'),
  'eip-egress-qos-add': (r) => Q.parseEipQosAdd(r, 'egress'),
  'eip-ingress-qos-del': (r) => Q.parseEipQosDel(r, 'ingress'),
  'eip-egress-qos-del': (r) => Q.parseEipQosDel(r, 'egress'),
  'qos-add': Q.parseGwQos,
  'qos-del': Q.parseGwQosDel,
};
const refusedByParser = (command: string, rule: string): boolean => {
  try {
    PARSE_OF[command]!(rule);
    return false;
  } catch {
    return true;
  }
};

describe('the legacy runner with refused rules', () => {
  let kernel: RecordingKernel;
  let engine: Engine;
  beforeAll(async () => {
    kernel = new RecordingKernel();
    engine = await kernel.initialised();
  });
  afterAll(() => kernel.cleanup());

  it('refuses with status 1, the header and one line on stdout, an empty stderr, and no tool call', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...GUARDED_COMMANDS, ...QOS_COMMANDS),
        // A valid rule first: one bad rule among good ones refuses the whole command.
        fc.array(hostileRule, { minLength: 1, maxLength: 3 }),
        async (command, rules) => {
          // The runner splits its arguments on whitespace, as the script's unquoted loop does.
          const bad = rules.flatMap((a) => a.split(/\s+/)).filter((r) => r !== '' && refusedByParser(command, r));
          fc.pre(bad.length > 0);
          const before = kernel.calls.length;
          const out = await runLegacy(engine, command, rules);
          expect(out.status, out.stdout).toBe(1);
          expect(out.stderr).toBe('');
          const lines = out.stdout.split('\n');
          // The header echoes the rules (a rule may itself hold a newline); the last line is the reason.
          expect(out.stdout.endsWith('\n')).toBe(true);
          expect(lines.at(-2)).toMatch(/^Error: /);
          expect(out.stdout.startsWith(`${command} ${rules.join(' ')}\n`)).toBe(true);
          expect(kernel.calls.slice(before)).toEqual([]);
        },
      ),
      { numRuns: RUNS },
    );
  });
});
