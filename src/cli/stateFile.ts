import { isMap, isSeq, LineCounter, parseDocument, type Document } from 'yaml';
import type { z } from 'zod';
import { HttpError } from '../api/errors.js';
import { NatgwError } from '../model/errors.js';
import { normaliseDesired } from '../api/stateDoc.js';
import { RESOURCES } from '../api/resources.js';
import { CliError } from './client.js';
import { desiredStateSchema, type DesiredState } from '../state/state.js';

/**
 * A state file for `natgw apply -f`: the document GET /v1/state returns (only `desired`
 * counts) or a bare desired state, in JSON or YAML. Checked here, strictly, with the daemon's
 * own schema and normalisation, so a bad file fails before anything is sent: every error at
 * once (zod's issues, and every field the schema does not know), each with its line and field.
 * The daemon validates again; this is for the message.
 */
export interface ParsedStateFile {
  /** The file's desired state as the schema read it (defaults filled, not yet normalised): what apply merges. */
  readonly data: FileState;
  /** The same, normalised as the daemon will (placeholder interfaces where the file has none). */
  readonly desired: DesiredState;
  /** Top-level keys of the desired state the file sets: apply leaves the others as they are. */
  readonly present: ReadonlySet<string>;
  readonly objects: number;
}

/** A file may leave the interfaces out: apply keeps the daemon's. */
const fileStateSchema = desiredStateSchema.extend({ interfaces: desiredStateSchema.shape.interfaces.optional() });
type FileState = z.infer<typeof fileStateSchema>;

/** The read-only fields of GET /v1/state's document, which apply ignores beside `desired`. */
const DOCUMENT_KEYS = new Set(['desired', 'lastApplied', 'drift', 'backend', 'mode', 'generation', 'digest']);

export interface FileIssue {
  readonly line: number | undefined;
  readonly field: string;
  readonly reason: string;
}

const issueText = (file: string, i: FileIssue): string => `${file}${i.line !== undefined ? `:${i.line}` : ''}: ${i.field ? `${i.field}: ` : ''}${i.reason}`;

/** A bad file: every issue, each with its line and field (exit 1, as any CLI failure). */
export class StateFileError extends CliError {
  override readonly name: string = 'StateFileError';
  constructor(
    readonly file: string,
    readonly issues: readonly FileIssue[],
  ) {
    const [first] = issues;
    super(
      issues.length === 1 && first
        ? issueText(file, first)
        : `${file}: ${issues.length} errors, nothing was applied:\n${issues.map((i) => issueText(file, i)).join('\n')}`,
    );
  }
  /** The first issue's parts. */
  get line(): number | undefined {
    return this.issues[0]?.line;
  }
  get field(): string | undefined {
    return this.issues[0]?.field || undefined;
  }
  get reason(): string {
    return this.issues[0]?.reason ?? '';
  }
}

type Path = readonly (string | number)[];

/** `desired.dnats[3].port` → ['desired', 'dnats', 3, 'port'] (the API's field names). */
export function pathOfField(field: string): Path {
  const out: (string | number)[] = [];
  for (const m of field.matchAll(/([^.[\]]+)|\[(\d+)\]/g)) out.push(m[2] !== undefined ? Number(m[2]) : m[1]!);
  return out;
}

function fieldOfPath(path: Path): string {
  return path.reduce<string>((acc, p) => (typeof p === 'number' ? `${acc}[${p}]` : acc ? `${acc}.${p}` : p), '');
}

/**
 * The line of the deepest node on `path` that the file has: a missing field is reported at
 * the object that lacks it.
 */
function lineOf(doc: Document, lc: LineCounter, path: Path): number | undefined {
  let node: unknown = doc.contents;
  let line: number | undefined;
  const lineOfNode = (n: unknown) => {
    const r = (n as { range?: [number, number, number] } | null)?.range;
    return r ? lc.linePos(r[0]).line : undefined;
  };
  line = lineOfNode(node);
  for (const seg of path) {
    let next: unknown;
    if (isMap(node)) {
      const pair = node.items.find((p) => {
        const k = p.key as { value?: unknown } | null;
        return String(k && typeof k === 'object' && 'value' in k ? k.value : k) === String(seg);
      });
      if (!pair) break;
      // A scalar's own line is the value's; an object's the key's (its first line).
      next = pair.value;
      line = lineOfNode(pair.key) ?? line;
    } else if (isSeq(node) && typeof seg === 'number') {
      next = node.items[seg];
      if (next === undefined) break;
    } else {
      break;
    }
    line = lineOfNode(next) ?? line;
    node = next;
  }
  return line;
}

function parseYaml(file: string, text: string): { doc: Document; lc: LineCounter } {
  const lc = new LineCounter();
  const doc = parseDocument(text, { lineCounter: lc, prettyErrors: false, uniqueKeys: true });
  const err = doc.errors[0];
  if (err) {
    // The first syntax error only: the parser's later ones follow from it.
    // Positions are offsets here (prettyErrors off keeps the message one line): the counter turns them into lines.
    const pos = err.linePos?.[0] ?? lc.linePos(err.pos[0]);
    throw new StateFileError(file, [{ line: pos.line, field: '', reason: `not valid JSON or YAML: ${err.message.split('\n')[0]} (column ${pos.col})` }]);
  }
  return { doc, lc };
}

type SchemaDef = {
  readonly type: string;
  readonly innerType?: z.ZodType;
  readonly in?: z.ZodType;
  readonly element?: z.ZodType;
  readonly shape?: Record<string, z.ZodType>;
  readonly catchall?: z.ZodType;
  readonly options?: readonly z.ZodType[];
};
const defOf = (schema: z.ZodType): SchemaDef => (schema as unknown as { _zod: { def: SchemaDef } })._zod.def;

/** A field the schema does not know, and the fields its object may have (for a suggestion). */
export interface UnknownField {
  readonly path: Path;
  readonly known: readonly string[];
}

/**
 * The fields `schema` does not know in `value` (zod strips them silently: a misspelt optional
 * field would otherwise vanish without a word).
 */
export function unknownFields(schema: z.ZodType, value: unknown, path: Path = []): UnknownField[] {
  const def = defOf(schema);
  switch (def.type) {
    case 'optional':
    case 'nullable':
    case 'default':
    case 'prefault':
    case 'nonoptional':
    case 'readonly':
    case 'catch':
      return def.innerType ? unknownFields(def.innerType, value, path) : [];
    case 'pipe':
      return def.in ? unknownFields(def.in, value, path) : [];
    case 'array':
      return Array.isArray(value) && def.element ? value.flatMap((v, i) => unknownFields(def.element as z.ZodType, v, [...path, i])) : [];
    case 'object': {
      if (value === null || typeof value !== 'object' || Array.isArray(value)) return [];
      const shape = def.shape ?? {};
      const open = def.catchall !== undefined && defOf(def.catchall).type !== 'never';
      return Object.entries(value).flatMap(([k, v]) => {
        const field = shape[k];
        if (field) return unknownFields(field, v, [...path, k]);
        return open ? [] : [{ path: [...path, k], known: Object.keys(shape) }];
      });
    }
    case 'union': {
      // The option that fits best: the fewest unknown fields.
      let best: UnknownField[] | undefined;
      for (const o of def.options ?? []) {
        const u = unknownFields(o, value, path);
        if (!best || u.length < best.length) best = u;
      }
      return best ?? [];
    }
    default:
      return [];
  }
}

/** A known field that an unknown one is probably a misspelling of (case, one or two letters). */
export function closestField(name: string, known: readonly string[]): string | undefined {
  const lower = name.toLowerCase().replace(/[-_]/g, '');
  const exact = known.find((k) => k.toLowerCase() === lower);
  if (exact) return exact;
  let best: { k: string; d: number } | undefined;
  for (const k of known) {
    const d = editDistance(lower, k.toLowerCase());
    if (d <= 2 && d < lower.length / 2 && (!best || d < best.d)) best = { k, d };
  }
  return best?.k;
}

function editDistance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++) cur[j] = Math.min((prev[j] ?? 0) + 1, (cur[j - 1] ?? 0) + 1, (prev[j - 1] ?? 0) + (a[i - 1] === b[j - 1] ? 0 : 1));
    prev = cur;
  }
  return prev[b.length] ?? 0;
}

const countObjects = (s: DesiredState): number => RESOURCES.reduce((n, def) => n + s[def.stateKey].length, 0);

/** Placeholder interfaces for normalising a file that leaves them out (nothing in normalisation reads them). */
const NO_INTERFACES = { vpc: 'eth0', ext: 'net1' };

/** Parse and validate strictly; throws StateFileError listing every error with its line and field. */
export function parseStateFile(file: string, text: string): ParsedStateFile {
  let value: unknown;
  let yaml: { doc: Document; lc: LineCounter } | undefined;
  // JSON the fast way (a state of thousands of objects); YAML (which also reports positions) otherwise.
  try {
    value = JSON.parse(text);
  } catch {
    yaml = parseYaml(file, text);
    value = yaml.doc.toJS({ maxAliasCount: 100 });
  }
  const located = (path: Path, reason: string): FileIssue => {
    yaml ??= parseYaml(file, text);
    return { line: lineOf(yaml.doc, yaml.lc, path), field: fieldOfPath(path) || '(root)', reason };
  };
  const fail = (issues: FileIssue[]): never => {
    throw new StateFileError(
      file,
      issues.sort((a, b) => (a.line ?? 0) - (b.line ?? 0)),
    );
  };
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    fail([located([], 'must be an object: a desired state, or the document GET /v1/state returns (with `desired`)')]);
  }
  const obj = value as Record<string, unknown>;
  const wrapped = 'desired' in obj;
  const prefix: Path = wrapped ? ['desired'] : [];
  const inner = wrapped ? obj.desired : obj;
  const issues: FileIssue[] = [];
  if (wrapped) {
    for (const k of Object.keys(obj))
      if (!DOCUMENT_KEYS.has(k)) issues.push(located([k], `unknown field (a state document has ${[...DOCUMENT_KEYS].join(', ')})`));
  }
  for (const { path, known } of unknownFields(fileStateSchema, inner)) {
    const hint = closestField(String(path[path.length - 1]), known);
    issues.push(located([...prefix, ...path], `unknown field${hint ? ` (did you mean ${hint}?)` : ''}`));
  }
  const parsed = fileStateSchema.safeParse(inner);
  if (!parsed.success) {
    for (const issue of parsed.error.issues) issues.push(located([...prefix, ...(issue.path as (string | number)[])], issue.message));
    fail(issues);
  }
  const data = (parsed as { data: FileState }).data;
  let desired: DesiredState | undefined;
  try {
    desired = normaliseDesired({ ...data, interfaces: data.interfaces ?? NO_INTERFACES }, wrapped ? 'desired.' : '');
  } catch (e) {
    if (e instanceof HttpError) {
      const field = e.extra.field ?? '';
      const reason = field && e.message.startsWith(`${field}: `) ? e.message.slice(field.length + 2) : e.message;
      issues.push(located(pathOfField(field), reason));
    } else if (e instanceof NatgwError && e.kind === 'validation') {
      issues.push(located(pathOfField(`${wrapped ? 'desired.' : ''}${e.field ?? ''}`), e.message));
    } else throw e;
  }
  if (issues.length || !desired) return fail(issues);
  const present = new Set(inner !== null && typeof inner === 'object' ? Object.keys(inner) : []);
  return { data, desired, present, objects: countObjects(desired) };
}
