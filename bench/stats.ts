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

/** The median of a short series (the upper one of an even count). */
export const median = (xs: readonly number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

/** Median and range of a few runs' figure (bench/bulk.ts): on a shared machine one run alone is noise. */
export interface Spread {
  readonly n: number;
  readonly median: number;
  readonly min: number;
  readonly max: number;
}

/** Runs that lack the figure (undefined, NaN: a failed step) are left out; undefined when none has it. */
export function spread(xs: ReadonlyArray<number | undefined>): Spread | undefined {
  const s = xs.filter((x): x is number => x !== undefined && Number.isFinite(x));
  if (s.length === 0) return undefined;
  return { n: s.length, median: round(median(s)), min: round(Math.min(...s)), max: round(Math.max(...s)) };
}

/**
 * The arguments of the in-process micro-benchmarks (bench/render.ts, bench/statePath.ts):
 * `[size] [runs] [--against <other dist/>]`, and this build's dist/ root.
 */
export function microArgs(argv: readonly string[], here: string): { size: number; runs: number; builds: Array<{ root: string; name: string }> } {
  const args = [...argv];
  const at = args.indexOf('--against');
  const other = at >= 0 ? args.splice(at, 2)[1] : undefined;
  const builds = [{ root: here, name: 'this build' }];
  if (other) builds.unshift({ root: other, name: other });
  return { size: Number(args[0] ?? 10000), runs: Number(args[1] ?? 15), builds };
}
