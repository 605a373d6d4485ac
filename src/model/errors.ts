/**
 * Typed, operational errors. Each carries the exact text a user (or the controller's log)
 * needs, and where the script contract wants it printed (SPEC §1: validation and conflict
 * messages go to stdout, a few documented errors go to stderr).
 */
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
    super('conflict', message, 'stdout');
  }
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
