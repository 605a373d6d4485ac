import { readFileSync } from 'node:fs';

/** natgw's package version, from the package.json above `fromUrl` (tsc output, bundle or sources). */
export function natgwVersion(fromUrl: string): string {
  for (const up of ['../../package.json', '../../../package.json']) {
    try {
      const p = JSON.parse(readFileSync(new URL(up, fromUrl), 'utf8')) as { name?: string; version?: string };
      if (p.name === 'natgw' && typeof p.version === 'string') return p.version;
    } catch {}
  }
  return 'unknown';
}
