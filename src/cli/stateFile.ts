import { LineCounter, parseDocument, type Document } from 'yaml';
import { z } from 'zod';
import { fieldName, HttpError } from '../api/errors.js';
import { NatgwError } from '../model/errors.js';
import { normaliseDesired } from '../api/stateDoc.js';
import { RESOURCES } from '../api/resources.js';
import { stateDocumentBody } from '../api/bodies.js';
import { CliError } from './client.js';
import { desiredStateSchema } from '../state/state.js';

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
  /** Top-level keys of the desired state the file sets: apply leaves the others as they are. */
  readonly present: ReadonlySet<string>;
  readonly objects: number;
}

/** A file may leave the interfaces out: apply keeps the daemon's. */
const fileStateSchema = desiredStateSchema.extend({ interfaces: desiredStateSchema.shape.interfaces.optional() });
type FileState = z.infer<typeof fileStateSchema>;

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
}

type Path = readonly (string | number)[];

/** `desired.dnats[3].port` → ['desired', 'dnats', 3, 'port'] (the API's field names). */
export function pathOfField(field: string): Path {
  const out: (string | number)[] = [];
  for (const m of field.matchAll(/([^.[\]]+)|\[(\d+)\]/g)) out.push(m[2] !== undefined ? Number(m[2]) : m[1]!);
  return out;
}

/**
 * The line of the deepest node on `path` that the file has: a missing field is reported at
 * the object that lacks it.
 */
function lineOf(doc: Document, lc: LineCounter, path: Path): number | undefined {
  for (let depth = path.length; depth >= 0; depth--) {
    const node: unknown = depth === 0 ? doc.contents : doc.getIn(path.slice(0, depth), true);
    const range = (node as { range?: [number, number, number] } | null | undefined)?.range;
    if (range) return lc.linePos(range[0]).line;
  }
  return undefined;
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

/** A field the schema does not know, and the fields its object may have (for a suggestion). */
export interface UnknownField {
  readonly path: Path;
  readonly known: readonly string[];
}

/**
 * The fields `schema` does not know in `value` (zod strips them silently: a misspelt optional
 * field would otherwise vanish without a word). The state's schema is built of objects, arrays,
 * optional and default fields and transforms (pipes); anything else is a leaf.
 */
export function unknownFields(schema: z.ZodType, value: unknown, path: Path = []): UnknownField[] {
  if (schema instanceof z.ZodOptional || schema instanceof z.ZodDefault) return unknownFields(schema.unwrap() as z.ZodType, value, path);
  if (schema instanceof z.ZodPipe) return unknownFields(schema.in as z.ZodType, value, path);
  if (schema instanceof z.ZodArray) {
    return Array.isArray(value) ? value.flatMap((v, i) => unknownFields(schema.element as z.ZodType, v, [...path, i])) : [];
  }
  if (!(schema instanceof z.ZodObject) || value === null || typeof value !== 'object' || Array.isArray(value)) return [];
  const shape = schema.shape as Record<string, z.ZodType>;
  return Object.entries(value).flatMap(([k, v]) => {
    const field = shape[k];
    return field ? unknownFields(field, v, [...path, k]) : [{ path: [...path, k], known: Object.keys(shape) }];
  });
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
    return { line: lineOf(yaml.doc, yaml.lc, path), field: fieldName(path) || '(root)', reason };
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
  // GET /v1/state's document: apply reads `desired` and ignores the read-only rest.
  const documentKeys = Object.keys(stateDocumentBody.shape);
  for (const k of wrapped ? Object.keys(obj) : [])
    if (!documentKeys.includes(k)) issues.push(located([k], `unknown field (a state document has ${documentKeys.join(', ')})`));
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
  try {
    // As the daemon will normalise it (placeholder interfaces where the file has none): for its errors.
    normaliseDesired({ ...data, interfaces: data.interfaces ?? NO_INTERFACES }, wrapped ? 'desired.' : '');
  } catch (e) {
    if (e instanceof HttpError) {
      const field = e.extra.field ?? '';
      const reason = field && e.message.startsWith(`${field}: `) ? e.message.slice(field.length + 2) : e.message;
      issues.push(located(pathOfField(field), reason));
    } else if (e instanceof NatgwError && e.kind === 'validation') {
      issues.push(located(pathOfField(`${wrapped ? 'desired.' : ''}${e.field ?? ''}`), e.message));
    } else throw e;
  }
  if (issues.length) return fail(issues);
  const present = new Set(inner !== null && typeof inner === 'object' ? Object.keys(inner) : []);
  return { data, present, objects: RESOURCES.reduce((n, def) => n + data[def.stateKey].length, 0) };
}
