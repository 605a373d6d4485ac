/**
 * A replica's SNAT source-port slice (NATGW_SNAT_PORT_SLICE). Replicas behind ECMP translate
 * on their own, and conntrackd copies each replica's entries into the others' kernels: two
 * replicas giving one EIP:port to two flows toward one server would clash there. Disjoint
 * slices make that impossible, and the reply's port names the replica that owns the flow.
 *
 * Written either `<index>/<count>` (replica index from 0, of count replicas: the unprivileged
 * ports 1024–65535 cut into count equal slices) or as an explicit `<lo>-<hi>`.
 */
export interface PortSlice {
  readonly lo: number;
  readonly hi: number;
  /** As configured, for status and logs. */
  readonly spec: string;
}

/** The range `index/count` slices. */
const SLICED_RANGE = { lo: 1024, hi: 65535 } as const;
/** Fewer ports than this per slice would leave a replica a few hundred flows per server. */
const MIN_SLICE_PORTS = 256;

/** The slice, or an error message that says how to fix it (loadConfig names the key). */
export function parsePortSlice(text: string): PortSlice | string {
  const s = text.trim();
  const frac = /^(\d{1,3})\/(\d{1,3})$/.exec(s);
  if (frac) {
    const index = Number(frac[1]);
    const count = Number(frac[2]);
    if (count < 1 || count > 64) return `the replica count must be 1 to 64, got ${count}`;
    if (index >= count) return `the replica index counts from 0 and must be below ${count}, got ${index}`;
    const width = Math.floor((SLICED_RANGE.hi - SLICED_RANGE.lo + 1) / count);
    const lo = SLICED_RANGE.lo + index * width;
    return { lo, hi: index === count - 1 ? SLICED_RANGE.hi : lo + width - 1, spec: s };
  }
  const range = /^(\d{1,5})-(\d{1,5})$/.exec(s);
  if (range) {
    const lo = Number(range[1]);
    const hi = Number(range[2]);
    if (lo < 1 || hi > 65535 || lo > hi) return `a range must be lo-hi within 1-65535 with lo <= hi, got ${s}`;
    if (hi - lo + 1 < MIN_SLICE_PORTS) return `a slice needs at least ${MIN_SLICE_PORTS} ports, got ${hi - lo + 1} (${s})`;
    return { lo, hi, spec: s };
  }
  return `must be <index>/<count> (e.g. 0/2, 1/2) or a port range <lo>-<hi> (e.g. 1024-33279), got ${s || 'nothing'}`;
}
