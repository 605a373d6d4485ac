/**
 * SNAT source ports in use, per EIP and destination. The kernel gives each SNAT connection a
 * reply tuple (destination ip:port → EIP:port, protocol) that must be unique, so toward one
 * destination an EIP has at most as many connections as its port range has ports: the share of
 * the range one destination uses is what runs out first (AWS NAT gateway's ErrorPortAllocation,
 * Cloud NAT's OUT_OF_RESOURCES). Counted from the conntrack entries natgw already follows.
 *
 * Cost: one row per (EIP, destination) with at least one connection, shared by all of its
 * connections; a connection holds a reference to its row (the monitor's id map), nothing more.
 */

/** The SNAT port range: `[min, max]`, both included. */
export interface PortRange {
  readonly min: number;
  readonly max: number;
}

/**
 * The kernel's range for a SNAT rule without one (nf_nat_l4proto_unique_tuple) and a sender
 * port of 1024 or above: natgw's rules name no range, and VPC clients use ephemeral ports.
 */
export const KERNEL_SNAT_PORTS: PortRange = { min: 1024, max: 65535 };

export const rangeSize = (r: PortRange): number => r.max - r.min + 1;

/**
 * One destination of one EIP and the connections toward it; `tag` is the caller's, given at its
 * first connection. The destination is kept as its key alone (`ip|port|protocol`), read apart
 * only for a report.
 */
export interface PortRow<T = unknown> {
  readonly tag: T;
  readonly eip: string;
  readonly key: string;
  /** Connections, which is source ports of the EIP in use toward this destination. */
  n: number;
}

interface DestinationUsage {
  readonly ip: string;
  readonly port: number;
  readonly protocol: string;
  /** Source ports of the EIP in use toward this destination. */
  readonly ports: number;
  /** ports / the size of the port range, 0 to 1. */
  readonly share: number;
}

export interface EipPortUsage {
  readonly eip: string;
  /** Destinations with at least one connection. */
  readonly destinations: number;
  /** The most ports any one destination uses, and its share of the range. */
  readonly maxPorts: number;
  readonly maxShare: number;
  /** The busiest destinations, most ports first (none when report() was asked for none). */
  readonly top: readonly DestinationUsage[];
}

/** The number of destinations per EIP the status lists. */
export const TOP_DESTINATIONS = 5;

export class PortUsage<T = unknown> {
  private readonly byEip = new Map<string, Map<string, PortRow<T>>>();
  private readonly size: number;

  constructor(range: PortRange = KERNEL_SNAT_PORTS) {
    this.size = rangeSize(range);
  }

  /** One more connection from `eip` toward ip:port/protocol; the row to hand back to remove(). */
  add(eip: string, ip: string, port: number, protocol: string, tag: T): PortRow<T> {
    let rows = this.byEip.get(eip);
    if (!rows) {
      rows = new Map();
      this.byEip.set(eip, rows);
    }
    // Joined, not a template: one flat string, which holds no reference to the event line the
    // address was read from (a row outlives the line; a hundred thousand lines would stay).
    const key = [ip, port, protocol].join('|');
    let row = rows.get(key);
    if (!row) {
      row = { tag, eip, key, n: 0 };
      rows.set(key, row);
    }
    row.n++;
    return row;
  }

  remove(row: PortRow<T>): void {
    if (--row.n > 0) return;
    const rows = this.byEip.get(row.eip);
    // A row no longer in the map (dropped at its last connection) leaves the map's own alone.
    if (rows?.get(row.key) !== row) return;
    rows.delete(row.key);
    if (rows.size === 0) this.byEip.delete(row.eip);
  }

  /**
   * Per EIP: destinations, the busiest one, and its `top` busiest destinations (ties in the order
   * they first appeared); with `top` 0 nothing is sorted (scrapes).
   */
  report(top = TOP_DESTINATIONS): EipPortUsage[] {
    return [...this.byEip].map(([eip, rows]) => {
      let max = 0;
      for (const r of rows.values()) if (r.n > max) max = r.n;
      const best = top > 0 ? [...rows.values()].sort((a, b) => b.n - a.n).slice(0, top) : [];
      return {
        eip,
        destinations: rows.size,
        maxPorts: max,
        maxShare: this.share(max),
        top: best.map((r) => {
          const [ip = '', port = '', protocol = ''] = r.key.split('|');
          return { ip, port: Number(port), protocol, ports: r.n, share: this.share(r.n) };
        }),
      };
    });
  }

  private share(n: number): number {
    return Math.min(1, n / this.size);
  }
}
