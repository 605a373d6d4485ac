/** Order statistics over samples in milliseconds; nearest rank, so p99 of a short series is its worst sample. */
export interface Summary {
  readonly n: number;
  readonly median: number;
  readonly p99: number;
  readonly min: number;
  readonly max: number;
  /** Samples whose command failed: counted, never mixed into the times. */
  readonly failures: number;
}

export function quantile(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.min(sorted.length, Math.max(1, Math.ceil(q * sorted.length)));
  return sorted[rank - 1] ?? Number.NaN;
}

export function summarize(samples: readonly number[], failures = 0): Summary {
  const s = [...samples].sort((a, b) => a - b);
  return {
    n: s.length,
    median: round(quantile(s, 0.5)),
    p99: round(quantile(s, 0.99)),
    min: round(s[0] ?? Number.NaN),
    max: round(s.at(-1) ?? Number.NaN),
    failures,
  };
}

/** Two decimals: enough for ratios of millisecond figures, short enough for the JSON line. */
export function round(x: number): number {
  return Number.isFinite(x) ? Math.round(x * 100) / 100 : Number.NaN;
}

export function ratio(a: number, b: number): number {
  return Number.isFinite(a) && Number.isFinite(b) && b > 0 ? round(a / b) : Number.NaN;
}

export async function timed<T>(fn: () => Promise<T>): Promise<[T, number]> {
  const t = process.hrtime.bigint();
  const r = await fn();
  return [r, Number(process.hrtime.bigint() - t) / 1e6];
}
