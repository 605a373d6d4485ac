import type { DesiredState } from '../state/state.js';
import type { ConntrackEntry, Tuple } from '../model/conntrackLine.js';

/** What translated a connection, as the `kind` of a flow line and label of the flow metrics. */
export type FlowKind = 'snat' | 'dnat' | 'fip' | 'share-dnat';

export interface FlowClass {
  readonly kind: FlowKind;
  readonly eip: string;
}

/**
 * PURE: natgw's desired state as lookup tables for classifying conntrack entries, built once
 * per state change so that an event costs a few map lookups however large the gateway is.
 */
export class FlowIndex {
  private readonly eips = new Set<string>();
  /** `eip|internalIp` of every floating IP. */
  private readonly fips = new Set<string>();
  /** `eip|port|protocol` → kind, for DNAT and share-DNAT rules. */
  private readonly ports = new Map<string, FlowKind>();

  constructor(state?: Pick<DesiredState, 'eips' | 'snats' | 'dnats' | 'fips' | 'shareDnats'>) {
    if (!state) return;
    for (const e of state.eips) this.eips.add(e.address);
    for (const s of state.snats) this.eips.add(s.eip);
    for (const f of state.fips) {
      this.eips.add(f.eip);
      this.fips.add(`${f.eip}|${f.internalIp}`);
    }
    for (const d of state.dnats) {
      this.eips.add(d.eip);
      this.ports.set(`${d.eip}|${d.port}|${d.protocol}`, 'dnat');
    }
    for (const d of state.shareDnats) {
      this.eips.add(d.eip);
      this.ports.set(`${d.eip}|${d.port}|${d.protocol}`, 'share-dnat');
    }
  }

  /**
   * The translation natgw applied to this entry, judged from its reply tuple: a reply from
   * another address than the original destination means the destination was rewritten (DNAT,
   * FIP inbound); a reply to an EIP that the original did not come from means the source was
   * (SNAT, FIP outbound). Undefined for untranslated entries and for addresses natgw does not own.
   */
  classify(e: Pick<ConntrackEntry, 'protocol' | 'original' | 'reply'>): FlowClass | undefined {
    const { original: o, reply: r } = e;
    if (o.dst !== r.src && this.eips.has(o.dst)) {
      const eip = o.dst;
      if (this.fips.has(`${eip}|${r.src}`)) return { kind: 'fip', eip };
      const kind = o.dport !== undefined ? this.ports.get(`${eip}|${o.dport}|${e.protocol}`) : undefined;
      return { kind: kind ?? 'dnat', eip };
    }
    if (o.src !== r.dst && this.eips.has(r.dst)) {
      const eip = r.dst;
      return { kind: this.fips.has(`${eip}|${o.src}`) ? 'fip' : 'snat', eip };
    }
    return undefined;
  }
}

/** PURE: the original direction after translation (the reply tuple reversed). */
export function translatedOf(r: Tuple): Tuple {
  return { src: r.dst, dst: r.src, ...(r.dport !== undefined ? { sport: r.dport } : {}), ...(r.sport !== undefined ? { dport: r.sport } : {}) };
}
