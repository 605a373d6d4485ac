import { canonicalIp, isIp } from '../model/net.js';
import { type Neighbour, macOf, neighbourKey } from '../model/neighbour.js';

/** One PERMANENT entry as `ip -j neigh show nud permanent` reports it. */
export interface HeldNeighbour {
  readonly address: string;
  readonly dev: string;
  readonly mac: string;
}

/** What the kernel holds that the plan needs: PERMANENT entries and the devices that exist. */
export interface NeighbourView {
  readonly entries: readonly HeldNeighbour[];
  readonly devices: ReadonlySet<string>;
}

interface NeighJson {
  dst?: string;
  dev?: string;
  lladdr?: string;
  state?: string[];
}

/** PURE: `ip -j neigh show nud permanent` → entries (those without a link-layer address are skipped). */
export function parseNeighbours(json: unknown): HeldNeighbour[] {
  if (!Array.isArray(json)) return [];
  return (json as NeighJson[])
    .filter((n) => n.dst && n.dev && n.lladdr && isIp(n.dst) && (n.state ?? []).includes('PERMANENT'))
    .map((n) => ({ address: canonicalIp(n.dst ?? ''), dev: n.dev ?? '', mac: (n.lladdr ?? '').toLowerCase() }));
}

/**
 * PURE: the `ip -batch` lines that take `have` to `want` (values come from validated schemas:
 * addresses, names, MACs). Only entries natgw programmed before
 * (`previous`) are ever deleted: a PERMANENT entry of another owner is left alone. An entry on
 * a device that does not exist is skipped (it comes back with the device: the link event
 * brings a full sync).
 */
export function planNeighbours(have: NeighbourView, want: readonly Neighbour[], previous: readonly Neighbour[]): string[] {
  const held = new Map(have.entries.map((e) => [neighbourKey(e), e.mac]));
  const lines: string[] = [];
  const wanted = new Set<string>();
  for (const n of want) {
    const k = neighbourKey(n);
    wanted.add(k);
    if (!have.devices.has(n.dev)) continue;
    const mac = macOf(n);
    if (held.get(k) !== mac) lines.push(`neigh replace ${n.address} lladdr ${mac} nud permanent dev ${n.dev}`);
  }
  for (const n of previous) {
    const k = neighbourKey(n);
    if (!wanted.has(k) && held.has(k)) lines.push(`neigh del ${n.address} dev ${n.dev}`);
  }
  return lines;
}

/**
 * PURE: the entry an `ip -o monitor neigh` line names when it reports a deletion
 * (`Deleted 10.0.1.50 dev eth0 ...`); undefined for anything else.
 */
export function deletedNeighbourOf(line: string): { address: string; dev: string } | undefined {
  const m = /^Deleted (\S+) dev (\S+)/.exec(line);
  if (!m || !isIp(m[1] ?? '')) return undefined;
  return { address: canonicalIp(m[1] ?? ''), dev: m[2] ?? '' };
}

/** PURE: whether an `ip -o monitor` line is a neighbour event (it starts with an address). */
export function isNeighbourLine(line: string): boolean {
  const first = /^(?:Deleted )?(\S+)/.exec(line)?.[1] ?? '';
  return isIp(first);
}
