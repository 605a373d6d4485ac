import { readFile } from 'node:fs/promises';
import type { ReplaceResult } from '../../api/bodies.js';
import type { DesiredState } from '../../state/state.js';
import { CliError, request, requestJson, apiError, type Target } from '../client.js';
import { mergeState, renderResults, type Merged } from '../merge.js';
import { diffIsEmpty, diffStates, renderDiff } from '../render.js';
import { parseStateFile } from '../stateFile.js';
import { CONNECTION_OPTIONS, OUTPUT_OPTIONS, outputOf, parseOptions, targetOf, type Io } from './common.js';
import { commandHelp } from './help.js';

/** Lines of each action (diff: sign) per kind unless --all: thousands of objects stay readable. */
const LINES_PER_KIND = 50;

/**
 * Phases of a long apply on stderr — only when stderr is a terminal or --progress asks, so
 * stdout stays the diff (or the one JSON document) and a quiet run stays quiet.
 */
export class Progress {
  private readonly started = performance.now();
  constructor(
    private readonly io: Io,
    readonly enabled: boolean,
  ) {}

  phase(text: string): void {
    if (this.enabled) this.io.err(`natgw apply: ${text}\n`);
  }

  /** A phase that waits on the daemon; on a terminal a line every few seconds says it is still going. */
  async during<T>(text: string, p: Promise<T>): Promise<T> {
    this.phase(text);
    if (!this.enabled || !this.io.errIsTty) return p;
    const from = performance.now();
    const timer = setInterval(
      () => this.io.err(`natgw apply: … still ${text.replace(/^\w/, (c) => c.toLowerCase())} (${Math.round((performance.now() - from) / 1000)} s)\n`),
      5000,
    );
    timer.unref();
    try {
      return await p;
    } finally {
      clearInterval(timer);
    }
  }

  get ms(): number {
    return Math.round(performance.now() - this.started);
  }
}

const size = (bytes: number): string =>
  bytes >= 1 << 20 ? `${(bytes / (1 << 20)).toFixed(1)} MB` : bytes >= 1024 ? `${(bytes / 1024).toFixed(1)} KB` : `${bytes} B`;

async function readSource(file: string): Promise<string> {
  try {
    if (file === '-') {
      const chunks: Buffer[] = [];
      for await (const c of process.stdin) chunks.push(c as Buffer);
      return Buffer.concat(chunks).toString('utf8');
    }
    return await readFile(file, 'utf8');
  } catch (e) {
    throw new CliError(`${file}: ${(e as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (e as Error).message}`);
  }
}

async function putState(target: Target, body: string, digest: string, dryRun: boolean): Promise<ReplaceResult> {
  const path = dryRun ? '/v1/state?dryRun=true' : '/v1/state';
  const a = await request(target, 'PUT', path, body, { 'if-match': `"${digest}"` });
  if (a.status === 412) {
    throw new CliError('the desired state changed while this apply ran (another writer): nothing was applied; run natgw apply again to see the new plan');
  }
  if (a.status !== 200) throw apiError(dryRun ? 'planning' : 'applying', a);
  return JSON.parse(a.text) as ReplaceResult;
}

export const APPLY_OPTIONS = {
  ...CONNECTION_OPTIONS,
  filename: { type: 'string', short: 'f' },
  prune: { type: 'boolean' },
  all: { type: 'boolean' },
} as const;

/** The file read and validated strictly, merged into the daemon's desired state (apply and diff). */
export async function planFile(
  command: 'apply' | 'diff',
  values: { filename?: string; prune?: boolean; socket?: string; server?: string; 'token-file'?: string },
  io: Io,
  progress?: Progress,
): Promise<{ target: Target; current: { desired: DesiredState; digest: string }; merged: Merged; objects: number }> {
  const file = values.filename;
  if (file === undefined)
    throw new CliError(`natgw ${command}: -f FILE is required (a state as JSON or YAML, '-' for stdin); see 'natgw ${command} --help'`, 2);
  progress?.phase(`reading ${file === '-' ? 'stdin' : file}`);
  const text = await readSource(file);
  progress?.phase(`parsing and validating ${size(Buffer.byteLength(text))}`);
  const parsed = parseStateFile(file === '-' ? '<stdin>' : file, text);
  progress?.phase(`validated ${parsed.objects} object(s)`);
  const target = await targetOf(values, io.env);
  const read = requestJson<{ desired: DesiredState; digest: string }>(target, 'GET', '/v1/state');
  const current = progress ? await progress.during('reading the desired state from the daemon', read) : await read;
  const merged = mergeState(current.desired, parsed, values.prune === true);
  if (merged.results.length === 0 && !values.prune) throw new CliError(`${file}: no objects to apply (the file lists no kind and no gateway field)`);
  return { target, current, merged, objects: parsed.objects };
}

/**
 * `natgw apply -f FILE [--prune] [--dry-run]`: create or update what the file lists, remove
 * the rest only with --prune; one line per object, as kubectl prints them.
 */
export async function apply(args: readonly string[], io: Io): Promise<number> {
  const { values } = parseOptions('apply', args, {
    ...APPLY_OPTIONS,
    'dry-run': { type: 'boolean' },
    output: OUTPUT_OPTIONS.output,
    json: OUTPUT_OPTIONS.json,
    progress: { type: 'boolean' },
    'show-script': { type: 'boolean' },
  });
  if (values.help) {
    io.out(commandHelp('apply'));
    return 0;
  }
  const json = outputOf('apply', values, ['text', 'json'], 'text') === 'json';
  const dryRun = values['dry-run'] === true;
  const progress = new Progress(io, values.progress === true || io.errIsTty);
  const { target, current, merged, objects } = await planFile('apply', values, io, progress);
  const body = JSON.stringify(merged.next);
  const diff = diffStates(current.desired, merged.next);
  const applying = !dryRun && merged.results.some((r) => r.action !== 'unchanged');
  // A dry run, or nothing to change: the daemon's own plan (and script) of the merged state, against the digest it was made from.
  const answer = applying
    ? await progress.during(`daemon applying ${objects} object(s)`, putState(target, body, current.digest, false))
    : dryRun || json || values['show-script']
      ? await progress.during(`sending ${size(Buffer.byteLength(body))} for a dry run`, putState(target, body, current.digest, true))
      : undefined;
  if (json) {
    const outcome = applying ? { generation: answer?.generation, digest: answer?.digest } : { script: answer?.script, digest: current.digest };
    const doc = { dryRun, applied: applying, results: merged.results, diff, plan: answer?.plan, report: answer?.report, ...outcome };
    io.out(`${JSON.stringify(doc, null, 2)}\n`);
  } else {
    io.out(renderResults(merged.results, dryRun, values.all ? Infinity : LINES_PER_KIND));
    if (!applying && values['show-script'] && answer?.script) io.out(`\nScript:\n${answer.script}`);
  }
  progress.phase(`done in ${progress.ms} ms`);
  return 0;
}

/**
 * `natgw diff -f FILE [--prune]`: what apply would change, field by field, as kubectl diff:
 * exit 0 without differences, 1 with, 2 on an error.
 */
export async function diff(args: readonly string[], io: Io): Promise<number> {
  const { values } = parseOptions('diff', args, APPLY_OPTIONS);
  if (values.help) {
    io.out(commandHelp('diff'));
    return 0;
  }
  try {
    const { current, merged } = await planFile('diff', values, io);
    const d = diffStates(current.desired, merged.next);
    io.out(renderDiff(d, values.all ? Infinity : LINES_PER_KIND));
    return diffIsEmpty(d) ? 0 : 1;
  } catch (e) {
    if (e instanceof CliError && e.exitCode === 1) throw new CliError(e.message, 2);
    throw e;
  }
}
