import { MAX_UPLINKS } from './uplinks.js';
import { ValidationError } from './errors.js';
import { isIpv4, parseCidr, formatCidr, parsePort } from './net.js';
import { printable } from './printable.js';
import type { Dnat, DnatId, Fip, Protocol, Route, ShareDnat, Snat } from './rules.js';

/**
 * Parsers for the script's comma-separated rule strings (SPEC §2). Each returns a typed
 * value or throws a ValidationError whose one line says what is wrong and with which rule.
 * Every field is checked strictly, so no shell or iptables syntax can ride along in a field.
 */

function fields(rule: string, kind: string, min: number, max = min): string[] {
  const parts = rule.split(',');
  if (parts.length < min || parts.length > max) {
    const want = min === max ? `${min}` : `${min} to ${max}`;
    throw bad(kind, rule, `expected ${want} comma-separated fields, got ${parts.length}`);
  }
  return parts;
}

function bad(kind: string, rule: string, why: string): ValidationError {
  return new ValidationError(printable(`Error: invalid ${kind} rule '${rule}': ${why}`));
}

function ipv4(kind: string, rule: string, what: string, s: string): string {
  if (!isIpv4(s)) throw bad(kind, rule, `${what} '${s}' is not a dotted IPv4 address`);
  return s;
}

/** An EIP field may carry a prefix (`1.2.3.4/24`); the address part is what counts. */
function eipField(kind: string, rule: string, s: string): string {
  const addr = s.includes('/') ? s.slice(0, s.indexOf('/')) : s;
  if (s.includes('/') && !parseCidr(s, { family: 4 })) throw bad(kind, rule, `eip '${s}' is not an IPv4 address or CIDR`);
  return ipv4(kind, rule, 'eip', addr);
}

function port(kind: string, rule: string, what: string, s: string): number {
  const p = parsePort(s);
  if (p === null) throw bad(kind, rule, `${what} '${s}' is not a port number 1-65535`);
  return p;
}

function protocol(kind: string, rule: string, s: string): Protocol {
  const p = s.toLowerCase();
  if (p !== 'tcp' && p !== 'udp') throw bad(kind, rule, `protocol '${s}' is not tcp or udp`);
  return p;
}

function cidr4(kind: string, rule: string, what: string, s: string): string {
  const c = parseCidr(s, { clearHostBits: true, family: 4 });
  if (!c) throw bad(kind, rule, `${what} '${s}' is not an IPv4 CIDR (a.b.c.d/0-32)`);
  return formatCidr(c);
}

export function parseRouteAdd(rule: string): Route {
  const [cidr = '', nexthop = ''] = fields(rule, 'subnet-route', 2);
  return { cidr: cidr4('subnet-route', rule, 'cidr', cidr), nexthop: ipv4('subnet-route', rule, 'nexthop', nexthop) };
}

export function parseRouteDel(rule: string): string {
  const [cidr = ''] = rule.split(',');
  return cidr4('subnet-route', rule, 'cidr', cidr);
}

export function parseEip(rule: string): { address: string; prefixLength: number } {
  const [first = ''] = fields(rule, 'eip', 1, 2);
  const c = parseCidr(first, { family: 4 });
  if (!c || !isIpv4(first.split('/')[0] ?? '')) throw bad('eip', rule, `'${first}' is not an IPv4 address with prefix length (a.b.c.d/n)`);
  return { address: c.address, prefixLength: c.prefix };
}

export function parseFipAdd(rule: string): Fip {
  const [eip = '', internalIp = ''] = fields(rule, 'floating-ip', 2);
  return { eip: eipField('floating-ip', rule, eip), internalIp: ipv4('floating-ip', rule, 'internal ip', internalIp) };
}

export function parseFipDel(rule: string): string {
  const [eip = ''] = fields(rule, 'floating-ip', 1, 2);
  return eipField('floating-ip', rule, eip);
}

/** A port or a port range `a-b` (a < b), as the dnat rules' port fields take it. */
function portOrRange(kind: string, rule: string, what: string, s: string): { port: number; portEnd?: number } {
  const m = /^(\d+)-(\d+)$/.exec(s);
  if (!m) return { port: port(kind, rule, what, s) };
  const a = parsePort(m[1] ?? '');
  const b = parsePort(m[2] ?? '');
  if (a === null || b === null || b <= a) throw bad(kind, rule, `${what} '${s}' is not a port range a-b with 1 <= a < b <= 65535`);
  return { port: a, portEnd: b };
}

/**
 * `eip,port,protocol,internalIp,internalPort`, where port may be a range `8000-8100`; the
 * internal port of a range is the same range (or its first port): each port maps onto itself.
 */
export function parseDnatAdd(rule: string): Dnat {
  const [eip = '', p = '', proto = '', ip = '', ip2 = ''] = fields(rule, 'dnat', 5);
  const e = eipField('dnat', rule, eip);
  const ext = portOrRange('dnat', rule, 'port', p);
  const pr = protocol('dnat', rule, proto);
  const internalIp = ipv4('dnat', rule, 'internal ip', ip);
  const int = portOrRange('dnat', rule, 'internal port', ip2);
  if (ext.portEnd !== undefined && (int.port !== ext.port || (int.portEnd !== undefined && int.portEnd !== ext.portEnd))) {
    throw bad('dnat', rule, `internal port '${ip2}' must be the external range '${p}' (or its first port): nftables NAT cannot shift a port range`);
  }
  if (ext.portEnd === undefined && int.portEnd !== undefined) throw bad('dnat', rule, `internal port '${ip2}' is a range but port '${p}' is not`);
  return {
    eip: e,
    port: ext.port,
    ...(ext.portEnd !== undefined ? { portEnd: ext.portEnd } : {}),
    protocol: pr,
    internalIp,
    internalPort: int.port,
  };
}

export function parseDnatDel(rule: string): DnatId {
  // The controller may send the full five-field rule to a delete; only the identity counts.
  const [eip = '', p = '', proto = ''] = fields(rule, 'dnat', 3, 5);
  const e = eipField('dnat', rule, eip);
  const ext = portOrRange('dnat', rule, 'port', p);
  return { eip: e, ...ext, protocol: protocol('dnat', rule, proto) };
}

export function parseSnatAdd(rule: string): Snat {
  const [eip = '', cidr = '', opt] = fields(rule, 'snat', 2, 3);
  if (opt !== undefined && opt !== '' && opt !== '--random-fully') {
    throw bad('snat', rule, `option '${opt}' is not --random-fully`);
  }
  return { eip: eipField('snat', rule, eip), cidr: cidr4('snat', rule, 'cidr', cidr), randomFully: opt === '--random-fully' };
}

export function parseSnatDel(rule: string): Pick<Snat, 'eip' | 'cidr'> {
  const [eip = '', cidr = ''] = fields(rule, 'snat', 2, 3);
  return { eip: eipField('snat', rule, eip), cidr: cidr4('snat', rule, 'cidr', cidr) };
}

// ---- share DNAT: the script's own messages, exactly (SPEC §2 nft-dnat-map-add) ----

export function parseShareDnatAdd(rule: string): ShareDnat {
  const parts = rule.split(',');
  if (parts.length < 4) throw new ValidationError(printable(`Error: invalid nft-dnat-map rule: ${rule}`));
  const identity = parseShareDnatDel(rule);
  const backendText = parts[3];
  const backendTexts = parts
    .slice(3)
    .join(',')
    .split('@')
    .filter((b) => b !== '');
  if (backendText === '' || backendTexts.length === 0) throw new ValidationError(printable(`Error: no backends specified in rule: ${rule}`));
  const backends = backendTexts.map((b) => {
    const colon = b.lastIndexOf(':');
    const ip = colon === -1 ? b : b.slice(0, colon);
    const bp = colon === -1 ? '' : b.slice(colon + 1);
    if (!isIpv4(ip)) throw new ValidationError(printable(`Error: invalid backend ip in nft-dnat-map rule: ${ip}`));
    const n = parsePort(bp);
    if (n === null) throw new ValidationError(printable(`Error: invalid backend port in nft-dnat-map rule: ${bp}`));
    return { ip, port: n };
  });
  return { ...identity, backends };
}

export function parseShareDnatDel(rule: string): Pick<ShareDnat, 'eip' | 'port' | 'protocol' | 'protocolText'> {
  const parts = rule.split(',');
  const [eip = '', p = '', proto = ''] = parts;
  if (parts.length < 3 || eip === '' || p === '' || proto === '') {
    throw new ValidationError(printable(`Error: invalid nft-dnat-map rule: ${rule}`));
  }
  if (!isIpv4(eip)) throw new ValidationError(printable(`Error: invalid eip in nft-dnat-map rule: ${eip}`));
  const n = parsePort(p);
  if (n === null) throw new ValidationError(printable(`Error: invalid external port in nft-dnat-map rule: ${p}`));
  if (!/^(tcp|udp|TCP|UDP)$/.test(proto)) throw new ValidationError(printable(`Error: invalid protocol in nft-dnat-map rule: ${proto}`));
  return { eip, port: n, protocol: proto.toLowerCase() as Protocol, protocolText: proto };
}

/**
 * `init` takes one optional `vpcIf,extIf[,extIf2...]` argument; the arguments are joined with
 * spaces first. Further external interfaces are secondary uplinks (Kube-OVN PR #7238).
 */
export function parseInitArgs(args: readonly string[]): { vpc: string; ext: string; secondary?: string[] } | undefined {
  const joined = args.join(' ').trim();
  if (joined === '') return undefined;
  const parts = joined.split(',').map((s) => s.trim());
  if (parts.length < 2) {
    throw new ValidationError('Error: Expected two interfaces separated by a comma (e.g., net1,net2)', undefined, 'stderr');
  }
  if (parts.some((p) => p === '')) throw new ValidationError('Error: Interface names cannot be empty', undefined, 'stderr');
  const [vpc = '', ext = '', ...secondary] = parts;
  if (parts.length - 1 > MAX_UPLINKS) throw new ValidationError(`Error: at most ${MAX_UPLINKS} external interfaces`, undefined, 'stderr');
  const twice = parts.find((p, i) => parts.indexOf(p) !== i);
  if (twice !== undefined) throw new ValidationError(`Error: interface '${twice}' is named twice`, undefined, 'stderr');
  return secondary.length > 0 ? { vpc, ext, secondary } : { vpc, ext };
}
