import { createHash } from 'node:crypto';
import type { ShareDnat } from './rules.js';

/** SPEC §2: `dnat-` + the first 12 hex digits of md5(`<eip>:<port>:<protocol as received>`). */
export function shareDnatChainName(d: Pick<ShareDnat, 'eip' | 'port' | 'protocolText'>): string {
  return `dnat-${createHash('md5').update(`${d.eip}:${d.port}:${d.protocolText}`).digest('hex').slice(0, 12)}`;
}
