import { isMap, isSeq, LineCounter, parseDocument, type Document } from 'yaml';
import { HttpError } from '../api/errors.js';
import { NatgwError } from '../model/errors.js';
import { normaliseDesired } from '../api/stateDoc.js';
import { desiredStateSchema, type DesiredState } from '../state/state.js';

/**
 * A state file for `natgw apply -f`: the document GET /v1/state returns (only `desired`
 * counts) or a bare desired state, in JSON or YAML. Checked here with the daemon's own schema
 * and normalisation, so a bad file fails before anything is sent, naming the line and the
 * field. The daemon validates again; this is for the message.
 */
export interface ParsedStateFile {
  /** What goes to PUT /v1/state: the file's value as written. */
  readonly body: unknown;
  /** The same, validated and normalised as the daemon will (for the diff). */
  readonly desired: DesiredState;
  readonly objects: number;
}

export class StateFileError extends Error {
  override readonly name = 'StateFileError';
  constructor(
    readonly file: string,
    readonly line: number | undefined,
    readonly field: string | undefined,
    readonly reason: string,
  ) {
    super(`${file}${line !== undefined ? `:${line}` : ''}: ${field ? `${field}: ` : ''}${reason}`);
  }
}

type Path = readonly (string | number)[];

/** `desired.dnats[3].port` → ['desired', 'dnats', 3, 'port'] (the API's field names). */
export function pathOfField(field: string): Path {
  const out: (string | number)[] = [];
  for (const m of field.matchAll(/([^.[\]]+)|\[(\d+)\]/g)) out.push(m[2] !== undefined ? Number(m[2]) : m[1]!);
  return out;
}

export function fieldOfPath(path: Path): string {
  return path.reduce<string>((acc, p) => (typeof p === 'number' ? `${acc}[${p}]` : acc ? `${acc}.${p}` : p), '');
}

/**
 * The line of the deepest node on `path` that the file has: a missing field is reported at
 * the object that lacks it.
 */
export function lineOf(doc: Document, lc: LineCounter, path: Path): number | undefined {
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
    // Positions are offsets here (prettyErrors off keeps the message one line): the counter turns them into lines.
    const pos = err.linePos?.[0] ?? lc.linePos(err.pos[0]);
    throw new StateFileError(file, pos.line, undefined, `not valid JSON or YAML: ${err.message.split('\n')[0]} (column ${pos.col})`);
  }
  return { doc, lc };
}

const countObjects = (s: DesiredState): number =>
  s.eips.length + s.snats.length + s.dnats.length + s.fips.length + s.shareDnats.length + s.routes.length + s.eipQos.length + s.qos.length;

/** Parse and validate; throws StateFileError naming line and field. */
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
  const located = (path: Path, reason: string): StateFileError => {
    yaml ??= parseYaml(file, text);
    return new StateFileError(file, lineOf(yaml.doc, yaml.lc, path), fieldOfPath(path) || '(root)', reason);
  };
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw located([], 'must be an object: a desired state, or the document GET /v1/state returns (with `desired`)');
  }
  const wrapped = 'desired' in value;
  const prefix: Path = wrapped ? ['desired'] : [];
  const parsed = desiredStateSchema.safeParse(wrapped ? (value as { desired: unknown }).desired : value);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw located([...prefix, ...(issue.path as (string | number)[])], issue.message);
  }
  let desired: DesiredState;
  try {
    desired = normaliseDesired(parsed.data, wrapped ? 'desired.' : '');
  } catch (e) {
    if (e instanceof HttpError) {
      const field = e.extra.field ?? '';
      const reason = field && e.message.startsWith(`${field}: `) ? e.message.slice(field.length + 2) : e.message;
      throw located(pathOfField(field), reason);
    }
    if (e instanceof NatgwError && e.kind === 'validation') throw located(pathOfField(`${wrapped ? 'desired.' : ''}${e.field ?? ''}`), e.message);
    throw e;
  }
  return { body: value, desired, objects: countObjects(desired) };
}
