/** The tables on stdout. Every figure is milliseconds unless its row says otherwise. */
import type { BulkRun } from './bulk.js';
import { COMMANDS, type Command, type CommandFigures } from './commands.js';
import { SEQUENCE, type CompareRun } from './compare.js';
import type { Memory } from './daemon.js';
import type { BackendFigures, Results, SizeFigures } from './results.js';
import { ratio, spread, type Spread, type Summary } from './stats.js';

type Row = readonly string[];

function table(title: string, head: Row, rows: readonly Row[]): string {
  const all = [head, ...rows];
  const widths = head.map((_, i) => Math.max(...all.map((r) => (r[i] ?? '').length)));
  const line = (r: Row) =>
    r
      .map((c, i) => (i === 0 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0)))
      .join('  ')
      .trimEnd();
  return [title, line(head), ...rows.map(line)].join('\n');
}

const num = (x: number | undefined, digits = 1): string => (x === undefined || !Number.isFinite(x) ? '–' : x.toFixed(digits));
const factor = (r: number): string => (r < 10 ? r.toFixed(1) : r.toFixed(0));
const times = (r: number): string => (Number.isFinite(r) ? `×${factor(r)}` : '');

/** `median/p99 ×ratio` with failures flagged. */
function cell(s: Summary | undefined, floor?: number): string {
  if (!s) return '–';
  const fail = s.failures ? ` !${s.failures}` : '';
  if (s.n === 0) return `failed${fail}`;
  const r = floor === undefined ? '' : ` ${times(ratio(s.median, floor))}`;
  return `${num(s.median)}/${num(s.p99)}${r}${fail}`;
}

const mib = (m: Memory | undefined): string => (m ? `${(m.rssKiB / 1024).toFixed(0)}/${(m.peakKiB / 1024).toFixed(0)}` : '–');

const API_LABEL: Record<Command, string> = {
  'dnat-add': 'API PUT /v1/dnats/…',
  'dnat-del': 'API DELETE /v1/dnats/…',
  'snat-add': 'API PUT /v1/snats/…',
  'snat-del': 'API DELETE /v1/snats/…',
  'floating-ip-add': 'API PUT /v1/fips/…',
  'floating-ip-del': 'API DELETE /v1/fips/…',
};

/**
 * What a shim call cannot go below: a bash, its client and the kernel change. The shim reaches
 * the daemon through `nc -U` over the Unix socket (its client floor: a request the daemon
 * answers at once); where nc is missing, through Node.js.
 */
export function idealShim(s: SizeFigures): number {
  const f = s.floors;
  return f.bash.median + (f.client ?? f.node).median + f.kernel.median;
}

export function backendSection(b: BackendFigures): string {
  const out: string[] = [];
  const variant = b.info?.variant ? ` (variant ${b.info.variant})` : '';
  out.push(`\n==================== ${b.backend}${variant} ====================`);
  const sizes = b.sizes;
  if (sizes.length > 0) {
    const head = ['', ...sizes.map((s) => `size ${s.mix.size}`)];
    out.push(
      table('\nState and memory', head, [
        ['objects DNAT/FIP/SNAT/EIP', ...sizes.map((s) => `${s.mix.dnats}/${s.mix.fips}/${s.mix.snats}/${s.mix.eips}`)],
        ['fill: PUT /v1/state from previous size, ms', ...sizes.map((s) => num(s.fillMs, 0))],
        ['daemon RSS now/peak, MiB', ...sizes.map((s) => mib(s.memory))],
      ]),
    );
    const fl = sizes[0]!.floors;
    out.push(
      table('\nFloors, ms median/p99 (same namespace, same runner; the kernel floor sampled once per round of API commands)', head, [
        [`kernel: ${fl.kernelWhat}`, ...sizes.map((s) => cell(s.floors.kernel))],
        ...(fl.kernelDelete
          ? [['kernel: nft delete element (the same, again: a delete waits for RCU)', ...sizes.map((s) => cell(s.floors.kernelDelete))] as Row]
          : []),
        ['node -e 0', ...sizes.map((s) => cell(s.floors.node))],
        ['bash -c true', ...sizes.map((s) => cell(s.floors.bash))],
        [fl.client ? "client: nc -U … GET /healthz (the shim's client)" : 'client: nc not installed', ...sizes.map((s) => cell(s.floors.client))],
        [fl.client ? 'ideal shim call = bash + nc client + kernel' : 'ideal shim call = bash + node + kernel', ...sizes.map((s) => num(idealShim(s)))],
      ]),
    );
    const rows = (figs: (s: SizeFigures) => CommandFigures, label: (c: Command) => string): Row[] =>
      COMMANDS.map((c) => [label(c), ...sizes.map((s) => cell(figs(s)[c], s.floors.kernel.median))]);
    out.push(
      table('\nPer command, ms median/p99 ×(median ÷ kernel floor median); !n = n failed samples', head, [
        ...rows(
          (s) => s.api,
          (c) => API_LABEL[c],
        ),
        ...rows(
          (s) => s.shim,
          (c) => `shim ${c}`,
        ),
      ]),
    );
    const warm = sizes.filter((s) => s.warmup);
    if (warm.length > 0) {
      const w = warm[0]!.warmup!;
      out.push(
        table(
          `\nWarm-up: a fresh daemon's first ${w.rounds} rounds of every command, before the figures above (not in them), ms median/p99 ×(÷ kernel floor)`,
          ['', ...warm.map((s) => `size ${s.mix.size}`)],
          [
            ...COMMANDS.map((c) => [API_LABEL[c], ...warm.map((s) => cell(s.warmup?.api[c], s.floors.kernel.median))]),
            ...COMMANDS.map((c) => [`shim ${c}`, ...warm.map((s) => cell(s.warmup?.shim[c], s.floors.kernel.median))]),
          ],
        ),
      );
    }
    out.push(
      table(
        '\nShim ÷ ideal shim call (bash + client + kernel floor), medians',
        head,
        COMMANDS.map((c) => [`shim ${c}`, ...sizes.map((s) => times(ratio(s.shim[c]?.median ?? Number.NaN, idealShim(s))))]),
      ),
    );
    const errs = sizes.flatMap((s) =>
      [...Object.entries(s.api), ...Object.entries(s.shim)].filter(([, f]) => f?.firstError).map(([c, f]) => `size ${s.mix.size} ${c}: ${f?.firstError}`),
    );
    if (errs.length) out.push(`\nFirst failure per series:\n  ${[...new Set(errs)].join('\n  ')}`);
  }
  if (b.connRate) {
    const c = b.connRate;
    const pos = (p: number | undefined) => (c.positions && p !== undefined ? ` (rule ${p} of ${c.positions.of} in SHARED_DNAT)` : '');
    out.push(
      `\nNew TCP connections/s through a DNAT at size ${c.size}: first ${c.firstPerSec}${pos(c.positions?.first)}, last ${c.lastPerSec}${pos(c.positions?.last)}`,
    );
  }
  if (b.bulk) out.push(bulkReport(b));
  if (b.errors.length) out.push(`\nERRORS:\n  ${b.errors.join('\n  ')}`);
  return out.join('\n');
}

const range = (s: Spread | undefined, digits: number): string => (s ? `${num(s.min, digits)}–${num(s.max, digits)}` : '–');

/** The median of the runs' own ratios, each against the same run's raw apply (the load moves between runs). */
function ratioCell(runs: readonly BulkRun[], ms: (r: BulkRun) => number | undefined, raw: (r: BulkRun) => number | undefined): string {
  const s = spread(runs.map((r) => ratio(ms(r) ?? Number.NaN, raw(r) ?? Number.NaN)));
  return s ? `${times(s.median)} (${factor(s.min)}–${factor(s.max)})` : '';
}

function bulkReport(b: BackendFigures): string {
  const k = b.bulk!;
  const rawNf = (r: BulkRun) => r.rawNetfilterMs;
  const rawAll = (r: BulkRun) => (r.rawNetfilterMs === undefined ? undefined : r.rawNetfilterMs + (r.rawLinkMs ?? 0));
  const tool = b.backend === 'nftables' ? 'nft -f -' : 'iptables-restore --noflush';
  const row = (label: string, ms: (r: BulkRun) => number | undefined, vs = true): Row => {
    const s = spread(k.runs.map(ms));
    return [label, num(s?.median, 0), range(s, 0), vs ? ratioCell(k.runs, ms, rawNf) : '', vs ? ratioCell(k.runs, ms, rawAll) : ''];
  };
  const n = k.runs.length;
  const runs = n < k.runsAsked ? `${n} of ${k.runsAsked} runs (the others failed: ERRORS below)` : `${n} runs`;
  const title = `\nBulk at size ${k.size} (state document ${(k.documentBytes / 1048576).toFixed(1)} MiB; rendered script: ${k.scriptLines.netfilter} netfilter + ${k.scriptLines.link} address/route lines), ${runs}: ms median and min–max; ×: median (min–max) of each run's ratio to its own raw apply`;
  const rows: Row[] = [
    row(`raw: ONE ${tool}, fresh namespace`, rawNf, false),
    row('raw: ONE ip -batch (addresses, routes), fresh namespace', (r) => r.rawLinkMs, false),
    row('PUT /v1/state?dryRun=true (plan + render)', (r) => r.dryRunMs),
    row('PUT /v1/state into an empty gateway', (r) => r.putStateMs),
    row('restore at start: spawn → /readyz, fresh namespace, state dir kept', (r) => r.restoreCold.readyzMs),
    row('  (of which spawn → /healthz)', (r) => r.restoreCold.healthzMs),
    row('restart: spawn → /readyz, kernel intact', (r) => r.restartWarm.readyzMs),
  ];
  const mem = `daemon RSS now/peak MiB, medians: after PUT ${mib(k.rssAfterPut)}, after cold restore ${mib(k.restoreCold?.rss)}, after warm restart ${mib(k.restartWarm?.rss)}`;
  const head = ['', 'ms median', 'min–max', '×raw netfilter', '×raw netfilter+ip'];
  return `${table(title, head, rows)}\n${mem}${k.rawError ? `\nraw apply failed: ${k.rawError}` : ''}`;
}

function compareReport(prefix: string, run: CompareRun): string {
  const backends = Object.keys(run.natgw) as Array<keyof CompareRun['natgw']>;
  const head = ['command', 'target', ...backends.flatMap((b) => [`natgw ${b}`, 'target÷natgw'])];
  const rows: Row[] = SEQUENCE.map((c) => {
    const t = run.target.perCommand[c];
    return [
      c,
      cell(t),
      ...backends.flatMap((b) => {
        const s = run.natgw[b]?.perCommand[c];
        return [cell(s), times(ratio(t.median, s?.median ?? Number.NaN))];
      }),
    ];
  });
  rows.push([
    'whole sequence, s (sum of calls)',
    num(run.target.totalMs / 1000),
    ...backends.flatMap((b) => [num((run.natgw[b]?.totalMs ?? Number.NaN) / 1000), times(ratio(run.target.totalMs, run.natgw[b]?.totalMs ?? Number.NaN))]),
  ]);
  const errs = [
    ...SEQUENCE.filter((c) => run.target.perCommand[c].firstError).map((c) => `target ${c}: ${run.target.perCommand[c].firstError}`),
    ...backends.flatMap((b) =>
      SEQUENCE.filter((c) => run.natgw[b]?.perCommand[c].firstError).map((c) => `natgw ${b} ${c}: ${run.natgw[b]?.perCommand[c].firstError}`),
    ),
  ];
  const title = `\nCompare N=${run.n}: '${prefix}' vs natgw's shim (daemon running), ms median/p99, one exec per call; !n = n calls failed (timed all the same)`;
  return table(title, head, rows) + (errs.length ? `\nfailures (first of each):\n  ${errs.join('\n  ')}` : '');
}

/**
 * The report in sections, each printed as soon as its figures exist: a run cut short (killed,
 * or out of time) still leaves what it measured on stdout.
 */
export function headerSection(r: Results): string {
  const o = r.options;
  return [
    `natgw bench — ${Object.entries(r.environment)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ')}`,
    `samples ${o.samples} per figure, in rounds (one sample of every command per round, the kernel floor's beside it); warm-up ${o.warmup} rounds on a fresh daemon; daemon resync period ${o.resync}; libnftables helper ${o.libnft}; sizes ${o.sizes.join(', ')}; mix per size N: N DNAT + N FIP + N/10 SNAT, EIPs N/50${o.fipEips ? ' + one per FIP' : ''} (+1 probe)`,
  ].join('\n');
}

export function compareSection(c: NonNullable<Results['compare']>): string {
  const out = [`\n==================== compare ====================`];
  for (const run of c.runs) out.push(compareReport(c.prefix, run));
  if (c.error) out.push(`\ncompare failed: ${c.error}`);
  return out.join('\n');
}

export function closingSection(r: Results): string {
  return [`\nload average at the end: ${r.environment['load at end'] ?? '?'}`, ...(r.notes.length ? [`\nNotes:\n  ${r.notes.join('\n  ')}`] : [])].join('\n');
}
