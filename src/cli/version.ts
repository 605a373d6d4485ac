import { readFileSync } from 'node:fs';

/**
 * `natgw --version`: the package's version and the source revision it was built from. The
 * build writes both to dist/version.json (scripts/version.mjs: git's commit, or NATGW_REVISION
 * where the build has no .git, as in the image's build stage); where that file or its revision
 * is missing, NATGW_REVISION from the environment, else `unknown`. Two small file reads.
 */
export interface VersionInfo {
  readonly version: string;
  readonly revision: string;
}

const readJson = (url: URL): Record<string, unknown> | undefined => {
  try {
    return JSON.parse(readFileSync(url, 'utf8')) as Record<string, unknown>;
  } catch {
    return undefined;
  }
};

const text = (v: unknown): string | undefined => (typeof v === 'string' && v.trim() && v.trim() !== 'unknown' ? v.trim() : undefined);

/** Pure: what the build recorded, what the package says, what the environment says. */
export function resolveVersion(built: Record<string, unknown> | undefined, pkg: Record<string, unknown> | undefined, env: NodeJS.ProcessEnv): VersionInfo {
  return {
    version: text(built?.version) ?? text(pkg?.version) ?? 'unknown',
    revision: text(built?.revision) ?? text(env.NATGW_REVISION) ?? 'unknown',
  };
}

export function versionLine(env: NodeJS.ProcessEnv = process.env): string {
  // This module sits two folders below dist/ (dist/src/cli).
  const v = resolveVersion(readJson(new URL('../../version.json', import.meta.url)), readJson(new URL('../../../package.json', import.meta.url)), env);
  return `natgw ${v.version} (revision ${v.revision})\n`;
}
