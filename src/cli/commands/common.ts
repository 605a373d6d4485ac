import { readFile } from 'node:fs/promises';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { readEnvFile } from '../../config/envFile.js';
import { DEFAULT_ENV_FILE, socketPathFromEnv } from '../../config/socketPath.js';
import { CliError, type Target } from '../client.js';

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

/**
 * parseArgs, with a one-line usage error (exit 2) in kubectl's words that names the command's
 * help. The fault is found in parseArgs' tokens, not in its error text (which suggests `--`
 * and quotes runtime syntax).
 */
export function parseOptions<O extends NonNullable<ParseArgsConfig['options']>>(
  command: string,
  args: readonly string[],
  options: O,
  allowPositionals = false,
) {
  const usage = (what: string) => new CliError(`natgw ${command}: ${what} (see 'natgw ${command} --help')`, 2);
  const { tokens } = parseArgs({ args: [...args], options, allowPositionals: true, strict: false, tokens: true });
  for (const t of tokens) {
    if (t.kind === 'positional' && !allowPositionals) throw usage(`unexpected argument ${t.value}`);
    if (t.kind !== 'option') continue;
    const type = options[t.name]?.type;
    if (type === undefined) throw usage(`unknown flag ${t.rawName}`);
    if (type === 'string' && t.value === undefined) throw usage(`flag --${t.name} needs a value`);
    if (type === 'boolean' && t.value !== undefined) throw usage(`flag --${t.name} takes no value`);
  }
  try {
    return parseArgs({ args: [...args], options, allowPositionals, strict: true });
  } catch (e) {
    throw usage(String((e as Error).message).split('\n')[0] ?? 'bad arguments');
  }
}

/** `-o FORMAT` (kubectl's), with the older --json and --yaml as its spellings. */
export const OUTPUT_OPTIONS = {
  output: { type: 'string', short: 'o' },
  json: { type: 'boolean' },
  yaml: { type: 'boolean' },
} as const satisfies ParseArgsConfig['options'];

export function outputOf<F extends string>(
  command: string,
  values: { output?: string; json?: boolean; yaml?: boolean },
  formats: readonly F[],
  fallback: F,
): F {
  const asked = [values.output, values.json ? 'json' : undefined, values.yaml ? 'yaml' : undefined].filter((x): x is string => x !== undefined);
  if (new Set(asked).size > 1) throw new CliError(`natgw ${command}: one output format at a time (got ${asked.join(' and ')})`, 2);
  const f = asked[0] ?? fallback;
  if (!(formats as readonly string[]).includes(f)) {
    throw new CliError(`natgw ${command}: unknown output format '${f}'; one of: ${formats.join(', ')}`, 2);
  }
  return f as F;
}

/**
 * The daemon the agent commands talk to: the Unix socket the shim uses (NATGW_SOCKET, same
 * resolution), or TCP with the bearer token. These commands never start a daemon and never
 * touch the kernel themselves: no daemon is an error that says how to get one.
 */
export async function targetOf(values: { socket?: string; server?: string; 'token-file'?: string }, env: NodeJS.ProcessEnv): Promise<Target> {
  const { socket, server } = values;
  if (socket !== undefined && server !== undefined) throw new CliError('--socket and --server exclude each other', 2);
  if (server === undefined) return { kind: 'socket', socket: socket ?? (await socketPathFromEnv(env)) };
  let url: URL;
  try {
    url = new URL(server.includes('://') ? server : `http://${server}`);
  } catch {
    throw new CliError(`--server: '${server}' is not a URL (e.g. http://127.0.0.1:8080)`, 2);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new CliError(`--server: ${url.protocol} is not http: or https:`, 2);
  // The token file as the daemon is configured (env file over environment), unless given.
  const envFile = env.NATGW_ENV_FILE?.trim() || DEFAULT_ENV_FILE;
  const fromFile = await readEnvFile(envFile).catch(() => ({}) as Record<string, string>);
  const tokenFile = values['token-file'] ?? (fromFile.NATGW_TOKEN_FILE || env.NATGW_TOKEN_FILE || undefined);
  if (tokenFile === undefined) return { kind: 'tcp', url };
  let token: string;
  try {
    token = (await readFile(tokenFile, 'utf8')).trim();
  } catch (e) {
    throw new CliError(`token file ${tokenFile}: ${(e as Error).message}`);
  }
  if (!token) throw new CliError(`token file ${tokenFile} is empty`);
  return { kind: 'tcp', url, token };
}
