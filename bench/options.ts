/** Command-line flags, each with an environment twin (flags win), so `npm run bench -- …` and CI both work. */
import type { BackendName } from './gateway.js';

export interface Options {
  readonly sizes: readonly number[];
  readonly backends: readonly BackendName[];
  readonly samples: number;
  /** Size of the bulk / restore comparison; 0 skips it. */
  readonly bulkSize: number;
  /** Runs of the whole bulk sequence, each in fresh namespaces; figures are their medians. */
  readonly bulkRuns: number;
  readonly compare?: string;
  readonly compareSizes: readonly number[];
  readonly resync: string;
  readonly fipEips: boolean;
  readonly connRate: boolean;
  /** Rounds of every command run on a fresh daemon before its first figures (reported apart). */
  readonly warmup: number;
  /** The daemons' NATGW_LIBNFTABLES: `off` measures nftables with an `nft` process per change. */
  readonly libnft: 'auto' | 'off';
}

const HELP = `npm run bench -- [flags]            (root; everything runs in throw-away network namespaces)
  --sizes 20,1000,10000,20000   gateway sizes (objects per kind; SNAT = size/10);   [BENCH_SIZES]
                                'none' skips the per-size phase
  --backends iptables,nftables                                                        [BENCH_BACKENDS]
  --samples 30                  samples per figure (median and p99 of these)          [BENCH_SAMPLES]
  --warmup 10                   rounds of every command (API and shim) a fresh daemon  [BENCH_WARMUP]
                                runs before its first figures; reported apart, 0 skips
  --bulk-size N                 bulk PUT /v1/state and restore-at-start size; 0 skips  [BENCH_BULK_SIZE]
                                (default 10000, or the largest --sizes below that)
  --bulk-runs 5                 runs of the bulk sequence, fresh namespaces each:      [BENCH_BULK_RUNS]
                                medians and min–max of these; ratios per run, then median
  --compare '<prefix>'          also run the legacy sequence through '<prefix> <command> <rule>'
                                (e.g. 'bash /tmp/orig/nat-gateway.sh') and natgw's shim  [BENCH_COMPARE]
  --compare-sizes 100,1000      N of the compared sequence                            [BENCH_COMPARE_SIZES]
  --resync 1h                   the daemon's NATGW_RESYNC_PERIOD during the bench       [BENCH_RESYNC]
  --fip-eips                    put every FIP's EIP on net1 too                       [BENCH_FIP_EIPS=1]
  --no-connrate                 skip the connections-per-second figure                [BENCH_CONNRATE=0]
  --libnft auto|off             the daemons' NATGW_LIBNFTABLES (off: an nft process   [BENCH_LIBNFT]
                                per change, to measure what the helper gains)`;

const list = (s: string): number[] =>
  s
    .split(',')
    .filter(Boolean)
    .map((x) => {
      const n = Number(x.trim());
      if (!Number.isInteger(n) || n < 1) throw new Error(`not a positive integer: ${x}`);
      return n;
    });

export function parseOptions(argv: readonly string[], env: NodeJS.ProcessEnv): Options {
  const flags = new Map<string, string>();
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] ?? '';
    if (a === '--help' || a === '-h') {
      console.log(HELP);
      process.exit(0);
    }
    if (!a.startsWith('--')) throw new Error(`unexpected argument ${a}\n${HELP}`);
    const eq = a.indexOf('=');
    if (eq > 0) flags.set(a.slice(2, eq), a.slice(eq + 1));
    else if (a === '--fip-eips' || a === '--no-connrate') flags.set(a.slice(2), '1');
    else flags.set(a.slice(2), argv[++i] ?? '');
  }
  const known = ['sizes', 'backends', 'samples', 'warmup', 'bulk-size', 'bulk-runs', 'compare', 'compare-sizes', 'resync', 'fip-eips', 'no-connrate', 'libnft'];
  for (const k of flags.keys()) if (!known.includes(k)) throw new Error(`unknown flag --${k}\n${HELP}`);
  const get = (flag: string, envKey: string): string | undefined => flags.get(flag) ?? env[envKey];

  const sizesText = get('sizes', 'BENCH_SIZES') ?? '20,1000,10000,20000';
  // `none`: no per-size phase (e.g. only --compare).
  const sizes = sizesText === 'none' ? [] : list(sizesText).sort((a, b) => a - b);
  const backends = (get('backends', 'BENCH_BACKENDS') ?? 'iptables,nftables').split(',').filter(Boolean);
  for (const b of backends) if (b !== 'iptables' && b !== 'nftables') throw new Error(`unknown backend ${b}`);
  const samples = list(get('samples', 'BENCH_SAMPLES') ?? '30')[0] ?? 30;
  const warmupRaw = get('warmup', 'BENCH_WARMUP') ?? '10';
  const warmup = Number(warmupRaw);
  if (!Number.isInteger(warmup) || warmup < 0) throw new Error(`--warmup: not a number of rounds: ${warmupRaw}`);
  const bulkRaw = get('bulk-size', 'BENCH_BULK_SIZE');
  const bulkSize = bulkRaw === undefined ? Math.min(10_000, Math.max(0, ...sizes)) : Number(bulkRaw);
  if (!Number.isInteger(bulkSize) || bulkSize < 0) throw new Error(`--bulk-size: not a size: ${bulkRaw}`);
  const bulkRunsRaw = get('bulk-runs', 'BENCH_BULK_RUNS') ?? '5';
  const bulkRuns = Number(bulkRunsRaw);
  if (!Number.isInteger(bulkRuns) || bulkRuns < 1) throw new Error(`--bulk-runs: not a number of runs (1 or more): ${bulkRunsRaw}`);
  const compare = get('compare', 'BENCH_COMPARE')?.trim() || undefined;
  const libnft = get('libnft', 'BENCH_LIBNFT') ?? 'auto';
  if (libnft !== 'auto' && libnft !== 'off') throw new Error(`--libnft: auto or off, not ${libnft}`);
  return {
    sizes,
    backends: backends as BackendName[],
    samples,
    bulkSize,
    bulkRuns,
    compare,
    compareSizes: list(get('compare-sizes', 'BENCH_COMPARE_SIZES') ?? '100,1000'),
    resync: get('resync', 'BENCH_RESYNC') ?? '1h',
    fipEips: flags.has('fip-eips') || env.BENCH_FIP_EIPS === '1',
    connRate: !(flags.has('no-connrate') || env.BENCH_CONNRATE === '0'),
    warmup,
    libnft,
  };
}
