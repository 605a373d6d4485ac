import { readFile } from 'node:fs/promises';
import type { ReplaceResult } from '../../api/service.js';
import type { DesiredState } from '../../state/state.js';
import { CliError, request, apiError, type Target } from '../client.js';
import { diffIsEmpty, diffStates, renderDiff } from '../render.js';
import { parseStateFile, StateFileError } from '../stateFile.js';
import { CONNECTION_OPTIONS, parseOptions, targetOf, type Io } from './common.js';
import { commandHelp } from './help.js';

/** Lines of each sign per kind in the diff unless --all: thousands of objects stay readable. */
const DIFF_LINES_PER_KIND = 50;

/**
 * Phases of a long apply on stderr — only when stderr is a terminal or --progress asks, so
 * stdout stays the diff (or the one JSON document) and a quiet run stays quiet.
 */
class Progress {
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

/** `natgw apply -f FILE [--dry-run]`: the plan as a diff against the daemon's desired state, then apply it. */
export async function apply(args: readonly string[], io: Io): Promise<number> {
  const { values } = parseOptions('apply', args, {
    ...CONNECTION_OPTIONS,
    filename: { type: 'string', short: 'f' },
    'dry-run': { type: 'boolean' },
    json: { type: 'boolean' },
    progress: { type: 'boolean' },
    all: { type: 'boolean' },
    'show-script': { type: 'boolean' },
  });
  if (values.help) {
    io.out(commandHelp('apply'));
    return 0;
  }
  const file = values.filename;
  if (file === undefined) throw new CliError("natgw apply: -f FILE is required (a state as JSON or YAML, '-' for stdin)\nSee 'natgw apply --help'.", 2);
  const dryRun = values['dry-run'] === true;
  const progress = new Progress(io, values.progress === true || io.errIsTty);

  progress.phase(`reading ${file === '-' ? 'stdin' : file}`);
  const text = await readSource(file);
  progress.phase(`parsing and validating ${size(Buffer.byteLength(text))}`);
  const parsed = (() => {
    try {
      return parseStateFile(file === '-' ? '<stdin>' : file, text);
    } catch (e) {
      if (e instanceof StateFileError) throw new CliError(e.message);
      throw e;
    }
  })();
  progress.phase(`validated ${parsed.objects} object(s)`);

  const target = await targetOf(values, io.env);
  const current = await progress.during(
    'reading the desired state from the daemon',
    (async () => {
      const a = await request(target, 'GET', '/v1/state');
      if (a.status !== 200) throw apiError('GET /v1/state', a);
      return JSON.parse(a.text) as { desired: DesiredState; digest: string };
    })(),
  );
  const diff = diffStates(current.desired, parsed.desired);
  const body = JSON.stringify(parsed.body);
  // The dry run against the digest the diff was made from: the daemon's plan is the one shown.
  const plan = await progress.during(`sending ${size(Buffer.byteLength(body))} for a dry run`, putState(target, body, current.digest, true));
  const noChange = diffIsEmpty(diff) && Object.values(plan.plan).every((p) => p.added + p.removed + p.changed === 0);

  if (!values.json) {
    io.out(renderDiff(diff, values.all ? Infinity : DIFF_LINES_PER_KIND));
    if (values['show-script'] && plan.script) io.out(`\nScript:\n${plan.script}`);
  }
  if (dryRun || noChange) {
    if (values.json)
      io.out(
        `${JSON.stringify({ dryRun, applied: false, diff, plan: plan.plan, report: plan.report, script: plan.script, digest: current.digest }, null, 2)}\n`,
      );
    else io.out(dryRun ? 'Dry run: nothing applied.\n' : 'Nothing to apply.\n');
    progress.phase(`done in ${progress.ms} ms`);
    return 0;
  }
  const result = await progress.during(`daemon applying ${parsed.objects} object(s)`, putState(target, body, current.digest, false));
  if (values.json) {
    io.out(
      `${JSON.stringify({ dryRun: false, applied: true, diff, plan: result.plan, report: result.report, generation: result.generation, digest: result.digest }, null, 2)}\n`,
    );
  } else {
    io.out(`Applied: generation ${result.generation}, digest ${result.digest}.\n`);
  }
  progress.phase(`done in ${progress.ms} ms`);
  return 0;
}
