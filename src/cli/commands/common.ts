import { parseArgs, type ParseArgsConfig } from 'node:util';
import { CliError, resolveTarget, type Target } from '../client.js';

/** Options every agent command takes: where the daemon is. */
export const CONNECTION_OPTIONS = {
  socket: { type: 'string' },
  server: { type: 'string' },
  'token-file': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const satisfies ParseArgsConfig['options'];

export interface Io {
  readonly out: (text: string) => void;
  readonly err: (text: string) => void;
  /** stderr is a terminal: progress is shown unless asked otherwise. */
  readonly errIsTty: boolean;
  readonly env: NodeJS.ProcessEnv;
}

export const processIo = (): Io => ({
  out: (t) => process.stdout.write(t),
  err: (t) => process.stderr.write(t),
  errIsTty: process.stderr.isTTY === true,
  env: process.env,
});

/** parseArgs with a usage error (exit 2) that names the command's help. */
export function parseOptions<O extends NonNullable<ParseArgsConfig['options']>>(
  command: string,
  args: readonly string[],
  options: O,
  allowPositionals = false,
) {
  try {
    return parseArgs({ args: [...args], options, allowPositionals, strict: true });
  } catch (e) {
    throw new CliError(`${(e as Error).message.split('\n')[0]}\nSee 'natgw ${command} --help'.`, 2);
  }
}

export function targetOf(values: { socket?: string; server?: string; 'token-file'?: string }, env: NodeJS.ProcessEnv): Promise<Target> {
  return resolveTarget({ socket: values.socket, server: values.server, tokenFile: values['token-file'] }, env);
}
