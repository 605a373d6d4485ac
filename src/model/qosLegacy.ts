import { ValidationError } from './errors.js';
import { printable } from './printable.js';
import { isInterfaceName, isIpv4, parseCidr } from './net.js';
import { type Direction, type EipQos, type GwQos, type GwQosId, burstSchema, canonicalQosCidr, gwQosShapeIssues, rateSchema } from './qos.js';

/**
 * Parsers for the script's QoS rule strings (SPEC §2 QoS). Each returns a typed value or
 * throws a ValidationError whose one line names the rule and the field that is wrong.
 * Every field is checked strictly, so nothing but validated values reaches tc.
 */

const kindOf = (direction: Direction): string => `eip-${direction}-qos`;

function bad(kind: string, rule: string, why: string): ValidationError {
  return new ValidationError(printable(`Error: invalid ${kind} rule '${rule}': ${why}`));
}

/** `a.b.c.d` or `a.b.c.d/len`: the address part counts (the script strips the suffix too). */
function eipAddress(kind: string, rule: string, s: string): string {
  const slash = s.indexOf('/');
  const addr = slash === -1 ? s : s.slice(0, slash);
  if (!isIpv4(addr) || (slash !== -1 && !parseCidr(s, { family: 4 }))) {
    throw bad(kind, rule, `ip '${s}' is not a dotted IPv4 address`);
  }
  return addr;
}

function priority(kind: string, rule: string, s: string): number {
  if (!/^\d{1,5}$/.test(s) || Number(s) > 65535) throw bad(kind, rule, `priority '${s}' is not an integer 0-65535`);
  return Number(s);
}

/** The model's own check (rateSchema, burstSchema), its message after the field and its value. */
function positiveDecimal(kind: string, rule: string, what: 'rate' | 'burst', s: string): string {
  const r = (what === 'rate' ? rateSchema : burstSchema).safeParse(s);
  if (!r.success) throw bad(kind, rule, `${what} '${s}' ${r.error.issues[0]?.message ?? 'is not valid'}`);
  return r.data;
}

/** `ip,priority,rate,burst` for eip-ingress-qos-add / eip-egress-qos-add. */
export function parseEipQosAdd(rule: string, direction: Direction): EipQos {
  const kind = kindOf(direction);
  const parts = rule.split(',');
  if (parts.length !== 4) throw bad(kind, rule, `expected 4 comma-separated fields (ip,priority,rate,burst), got ${parts.length}`);
  const [ip = '', prio = '', rate = '', burst = ''] = parts;
  return {
    direction,
    ip: eipAddress(kind, rule, ip),
    priority: priority(kind, rule, prio),
    rate: positiveDecimal(kind, rule, 'rate', rate),
    burst: positiveDecimal(kind, rule, 'burst', burst),
  };
}

/** `ip` for eip-*-qos-del; only the first field counts and a `/len` suffix is tolerated. */
export function parseEipQosDel(rule: string, direction: Direction): string {
  const [ip = ''] = rule.split(',');
  return eipAddress(kindOf(direction), rule, ip);
}

function gwIdentity(rule: string, parts: readonly string[]): GwQosId & Pick<GwQos, 'matchType'> {
  const kind = 'qos';
  const [direction = '', dev = '', prio = '', classifier = '', matchType = '', matchDirection = '', cidr = ''] = parts;
  if (direction !== 'ingress' && direction !== 'egress') throw bad(kind, rule, `unknown direction '${direction}' (ingress or egress)`);
  if (!isInterfaceName(dev)) throw bad(kind, rule, `dev '${dev}' is not a Linux interface name (1-15 of A-Z a-z 0-9 _ . -)`);
  const p = priority(kind, rule, prio);
  if (classifier !== 'u32' && classifier !== 'matchall') throw bad(kind, rule, `unknown classifier '${classifier}' (u32 or matchall)`);
  const shape = { direction, dev, classifier, matchType, matchDirection, cidr } as const;
  const issue = gwQosShapeIssues(shape as Parameters<typeof gwQosShapeIssues>[0])[0];
  if (issue) throw bad(kind, rule, issue.message);
  return {
    direction,
    dev,
    priority: p,
    classifier,
    matchType: matchType as GwQos['matchType'],
    matchDirection: matchDirection as GwQos['matchDirection'],
    cidr: classifier === 'u32' ? (canonicalQosCidr(cidr) ?? cidr) : '',
  };
}

/**
 * `direction,dev,priority,classifier,matchType,matchDirection,cidr,rate,burst` (qos-add,
 * and qos-del, which receives the same nine fields). Empty fields are meaningful, so the
 * rule is split on every comma.
 */
export function parseGwQos(rule: string): GwQos {
  const parts = rule.split(',');
  if (parts.length !== 9) {
    throw bad(
      'qos',
      rule,
      `expected 9 comma-separated fields (direction,dev,priority,classifier,matchType,matchDirection,cidr,rate,burst), got ${parts.length}`,
    );
  }
  return {
    ...gwIdentity(rule, parts),
    rate: positiveDecimal('qos', rule, 'rate', parts[7] ?? ''),
    burst: positiveDecimal('qos', rule, 'burst', parts[8] ?? ''),
  };
}

/**
 * qos-del's identity. Accepts the nine fields of qos-add, or the seven identity fields a
 * newer controller sends; rate and burst play no part in a delete, so they are not checked.
 */
export function parseGwQosDel(rule: string): GwQosId {
  const parts = rule.split(',');
  if (parts.length !== 7 && parts.length !== 9) {
    throw bad(
      'qos',
      rule,
      `expected 7 or 9 comma-separated fields (direction,dev,priority,classifier,matchType,matchDirection,cidr[,rate,burst]), got ${parts.length}`,
    );
  }
  const { matchType: _unused, ...id } = gwIdentity(rule, parts);
  return id;
}
