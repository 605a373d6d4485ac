import { z } from 'zod';
import { isIpv4, parseCidr, parsePort } from '../model/net.js';
import { printable } from '../model/printable.js';

/**
 * The rules of Kube-OVN's LoadBalancer-service commands (`bash /kube-ovn/lb-svc.sh <command>
 * [rule ...]`), validated into typed values before anything runs. A rule is comma-separated
 * fields; like the script, natgw also splits arguments on whitespace, so `dnat-add "r1 r2"` is
 * two rules.
 */

const ipv4 = z.string().refine(isIpv4, 'is not a dotted IPv4 address');

const port = z.string().transform((s, ctx) => {
  const n = parsePort(s);
  if (n === null) {
    ctx.addIssue({ code: 'custom', message: 'is not a port from 1 to 65535' });
    return z.NEVER;
  }
  return n;
});

/** Kube-OVN sends `tcp`, `udp` or `sctp`; any case is accepted, kept lower case. */
const protocol = z
  .string()
  .transform((s) => s.toLowerCase())
  .pipe(z.enum(['tcp', 'udp', 'sctp'], { error: 'is not tcp, udp or sctp' }));

/** The EIP of a DNAT; a prefix (`1.2.3.4/24`) is dropped, as the script drops it. */
const dnatEip = z
  .string()
  .transform((s) => s.split('/')[0] ?? '')
  .pipe(ipv4);

const eipCidr = z.string().transform((s, ctx) => {
  const c = parseCidr(s, { family: 4 });
  if (c === null || c.prefix === 0) {
    ctx.addIssue({ code: 'custom', message: 'is not an IPv4 address with a prefix length from 1 to 32 (e.g. 172.20.0.10/24)' });
    return z.NEVER;
  }
  return { address: c.address, prefix: c.prefix, network: parseCidr(s, { family: 4, clearHostBits: true })?.address ?? c.address };
});

const eipAddSchema = z.object({ eip: eipCidr, gateway: ipv4 }).refine((r) => r.gateway !== r.eip.address && inNetwork(r.gateway, r.eip.network, r.eip.prefix), {
  message: 'must be another address inside the EIP network',
  path: ['gateway'],
});

const dnatAddSchema = z.object({ eip: dnatEip, port, protocol, internalIp: ipv4, internalPort: port, defaultGateway: ipv4 });

const dnatDelSchema = z.object({ eip: dnatEip, port, protocol, internalIp: ipv4, internalPort: port });

export type EipAdd = z.infer<typeof eipAddSchema>;
export type DnatAdd = z.infer<typeof dnatAddSchema>;
export type DnatDel = z.infer<typeof dnatDelSchema>;
export type Protocol = DnatAdd['protocol'];

export type LbSvcCommand =
  | { readonly name: 'init' }
  | { readonly name: 'eip-add'; readonly rules: readonly EipAdd[] }
  | { readonly name: 'dnat-add'; readonly rules: readonly DnatAdd[] }
  | { readonly name: 'dnat-del'; readonly rules: readonly DnatDel[] };

export type LbSvcCommandName = LbSvcCommand['name'];

export const COMMANDS: readonly LbSvcCommandName[] = ['init', 'eip-add', 'dnat-add', 'dnat-del'];

interface RuleFormat<T> {
  readonly schema: z.ZodType<T>;
  /** Field names in rule order; a rule has exactly this many fields... */
  readonly fields: readonly string[];
  /** ...or this many, the rest ignored (dnat-del accepts dnat-add's form, whose gateway it does not need). */
  readonly alsoFields?: number;
}

const FORMATS = {
  'eip-add': { schema: eipAddSchema, fields: ['eip', 'gateway'] },
  'dnat-add': { schema: dnatAddSchema, fields: ['eip', 'port', 'protocol', 'internalIp', 'internalPort', 'defaultGateway'] },
  'dnat-del': { schema: dnatDelSchema, fields: ['eip', 'port', 'protocol', 'internalIp', 'internalPort'], alsoFields: 6 },
} as const satisfies Record<Exclude<LbSvcCommandName, 'init'>, RuleFormat<unknown>>;

/** Every message of a rejected command, one line each, ready for stdout; nothing has run. */
export class LbSvcInputError extends Error {
  override readonly name = 'LbSvcInputError';
  constructor(readonly lines: readonly string[]) {
    super(lines.join('\n'));
  }
}

export function isCommandName(s: string | undefined): s is LbSvcCommandName {
  return (COMMANDS as readonly (string | undefined)[]).includes(s);
}

/** The rules of a command, every bad one reported at once; throws LbSvcInputError. */
export function parseCommand(name: LbSvcCommandName, args: readonly string[]): LbSvcCommand {
  // The script ignores init's arguments.
  if (name === 'init') return { name };
  const rules = args.flatMap((a) => a.split(/\s+/)).filter((r) => r !== '');
  const errors: string[] = [];
  const all = <T>(format: RuleFormat<T>): T[] => rules.map((rule) => parseRule(name, format, rule, errors));
  const command: LbSvcCommand =
    name === 'eip-add'
      ? { name, rules: all<EipAdd>(FORMATS[name]) }
      : name === 'dnat-add'
        ? { name, rules: all<DnatAdd>(FORMATS[name]) }
        : { name, rules: all<DnatDel>(FORMATS[name]) };
  if (errors.length > 0) throw new LbSvcInputError(errors);
  return command;
}

function parseRule<T>(command: string, format: RuleFormat<T>, rule: string, errors: string[]): T {
  const values = rule.split(',');
  const quoted = `'${printable(rule)}'`;
  if (values.length !== format.fields.length && values.length !== format.alsoFields) {
    errors.push(`Error: invalid ${command} rule ${quoted}: expected ${format.fields.join(',')}`);
    return undefined as T;
  }
  const r = format.schema.safeParse(Object.fromEntries(format.fields.map((f, i) => [f, values[i]?.trim() ?? ''])));
  if (r.success) return r.data;
  for (const issue of r.error.issues) {
    const field = String(issue.path[0] ?? 'rule');
    const value = values[format.fields.indexOf(field)]?.trim() ?? '';
    errors.push(`Error: invalid ${field} in ${command} rule ${quoted}: '${printable(value)}' ${issue.message}`);
  }
  return undefined as T;
}

function inNetwork(ip: string, network: string, prefix: number): boolean {
  return parseCidr(`${ip}/${prefix}`, { family: 4, clearHostBits: true })?.address === network;
}
