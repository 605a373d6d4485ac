import { readEnvFile } from './envFile.js';

export const DEFAULT_ENV_FILE = '/etc/kube-ovn/nat-gateway.env';
export const DEFAULT_SOCKET = '/run/natgw/natgw.sock';

/**
 * The daemon's socket path, read without validating the rest of the configuration (and without
 * loading zod): the shim's Node.js path reaches a running daemon with only this, as its `nc` path
 * does, so both answer alike even when another key of the env file is invalid. Measured in
 * docs/performance.md. Same precedence as loadConfig: file over environment over default.
 */
export async function socketPathFromEnv(env: NodeJS.ProcessEnv = process.env): Promise<string> {
  const envFile = env.NATGW_ENV_FILE?.trim() || DEFAULT_ENV_FILE;
  const fromFile = await readEnvFile(envFile).catch(() => ({}) as Record<string, string>);
  return fromFile.NATGW_SOCKET || env.NATGW_SOCKET || DEFAULT_SOCKET;
}
