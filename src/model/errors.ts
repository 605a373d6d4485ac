/**
 * Typed, operational errors. Each carries the exact text a user (or the controller's log)
 * needs, and where the script contract wants it printed (SPEC §1: validation and conflict
 * messages go to stdout, a few documented errors go to stderr).
 */
import { portText, type Dnat, type Fip } from './rules.js';

export type ErrorKind = 'validation' | 'conflict' | 'not-initialized' | 'interface' | 'system';

export class NatgwError extends Error {
  override readonly name: string = 'NatgwError';
  constructor(
    readonly kind: ErrorKind,
    message: string,
    readonly stream: 'stdout' | 'stderr' = 'stdout',
    /** For API errors: the field that was wrong. */
    readonly field?: string,
  ) {
    super(message);
  }
}

export class ValidationError extends NatgwError {
  override readonly name = 'ValidationError';
  constructor(message: string, field?: string, stream: 'stdout' | 'stderr' = 'stdout') {
    super('validation', message, stream, field);
  }
}

export class ConflictError extends NatgwError {
  override readonly name = 'ConflictError';
  constructor(message: string) {
    super('conflict', message);
  }
}

/** An identity already held by another rule (SPEC §2 floating-ip-add, dnat-add): what was asked for and the rule holding it. */
export type RuleConflict =
  | { readonly kind: 'fip'; readonly wanted: Fip; readonly existing: Fip }
  | { readonly kind: 'dnat'; readonly wanted: Dnat; readonly existing: Dnat; readonly overlap: boolean };

/**
 * A conflict carrying both rules, typed. SPEC §2's message quotes the existing rule as the
 * script's iptables rule, a syntax only the netfilter layer writes: the operations throw this
 * error, and the layer that reports it to the user words it with that layer's quote
 * (engine/conflicts.ts), so the text is the same in either backend.
 */
export class RuleConflictError extends ConflictError {
  constructor(
    readonly conflict: RuleConflict,
    /** How the message quotes the existing rule: by its fields, until the layer that reports the error words it. */
    quote = (c: RuleConflict): string => JSON.stringify(c.existing),
  ) {
    super(ruleConflictText(conflict, quote(conflict)));
  }

  worded(quote: (c: RuleConflict) => string): RuleConflictError {
    return new RuleConflictError(this.conflict, quote);
  }
}

function ruleConflictText(c: RuleConflict, rule: string): string {
  if (c.kind === 'fip') return `eip ${c.wanted.eip} already bindTo rule: ${rule}, but expected internalIp ${c.wanted.internalIp}`;
  const d = c.wanted;
  return `dnat (${d.eip}, ${portText(d)}, ${d.protocol}) ${c.overlap ? 'overlaps the existing rule' : 'already exists'}: ${rule}, but expected ${d.internalIp}:${d.internalPort}`;
}

export class NotInitializedError extends NatgwError {
  override readonly name = 'NotInitializedError';
  constructor() {
    super('not-initialized', 'nat gateway not initialized', 'stderr');
  }
}

export class InterfaceMissingError extends NatgwError {
  override readonly name = 'InterfaceMissingError';
  constructor(role: 'VPC' | 'External', ifname: string) {
    super('interface', `Error: ${role} interface '${ifname}' not found`, 'stderr');
  }
}

/** A system failure (a tool's refusal: ExecError, system/exec.ts). Nothing was applied (transactions are atomic). */
export class SystemError extends NatgwError {
  override readonly name: string = 'SystemError';
  constructor(message: string) {
    super('system', message, 'stderr');
  }
}
