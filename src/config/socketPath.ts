import { readEnvFile } from './envFile.js';

export const DEFAULT_ENV_FILE = '/etc/kube-ovn/nat-gateway.env';
export const DEFAULT_SOCKET = '/run/natgw/natgw.sock';
export const DEFAULT_STATE_DIR = '/var/lib/natgw';

/**
 * The daemon's socket path, read the cheap way (no schema library loaded): the shim's fast
 * path to a running daemon needs only this. Same precedence as loadConfig: file over
 * environment over default.
 */
export async function socketPathFromEnv(env: NodeJS.ProcessEnv = process.env): Promise<string> {
  const envFile = env.NATGW_ENV_FILE?.trim() || DEFAULT_ENV_FILE;
  const fromFile = await readEnvFile(envFile).catch(() => ({}) as Record<string, string>);
  return fromFile.NATGW_SOCKET || env.NATGW_SOCKET || DEFAULT_SOCKET;
}
