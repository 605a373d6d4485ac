import { promises as fs } from 'node:fs';
import { isInterfaceName } from '../model/net.js';

/**
 * The pod's Multus `network-status` annotation, as the downward API writes it to a file
 * (`key="<escaped JSON>"` lines). The default network's interface faces the VPC; the first
 * attachment that is not the default is the external one.
 */
const KEY = 'k8s.v1.cni.cncf.io/network-status=';

interface NetworkStatusEntry {
  readonly name?: string;
  readonly interface?: string;
  readonly default?: boolean;
}

export function parseNetworkStatus(text: string): { vpc?: string; ext?: string } {
  const line = text.split('\n').find((l) => l.startsWith(KEY));
  if (!line) return {};
  try {
    const quoted = line.slice(KEY.length).trim();
    const entries = JSON.parse(quoted.startsWith('"') ? (JSON.parse(quoted) as string) : quoted) as NetworkStatusEntry[];
    if (!Array.isArray(entries)) return {};
    const named = entries.filter((e) => typeof e.interface === 'string' && isInterfaceName(e.interface));
    const vpc = named.find((e) => e.default === true)?.interface;
    const ext = named.find((e) => e.default !== true)?.interface;
    return { ...(vpc ? { vpc } : {}), ...(ext ? { ext } : {}) };
  } catch {
    return {};
  }
}

export async function readNetworkStatus(file: string): Promise<{ vpc?: string; ext?: string }> {
  try {
    return parseNetworkStatus(await fs.readFile(file, 'utf8'));
  } catch {
    return {};
  }
}
