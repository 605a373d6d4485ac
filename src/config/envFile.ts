import { promises as fs } from 'node:fs';
import path from 'node:path';

/**
 * The env file is parsed as KEY=VALUE lines (comments, `export`, single or double quotes),
 * never executed: the script sourced it, natgw only reads it.
 */
const LINE = /^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$/;

export function parseEnvFile(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const raw of text.split('\n')) {
    if (/^\s*(#|$)/.test(raw)) continue;
    const m = LINE.exec(raw);
    if (!m) continue;
    const [, key = '', rawValue = ''] = m;
    out[key] = unquote(rawValue);
  }
  return out;
}

/**
 * A quoted value ends at its closing quote, and an inline comment after it is not part of it
 * (`GATEWAY_V4="10.0.0.1" # gw` is 10.0.0.1, as bash reads it). In double quotes a backslash
 * escapes `"`, `\\`, `$` and `` ` ``. An unquoted value ends at an inline comment.
 */
function unquote(v: string): string {
  const q = v[0];
  if (q === '"' || q === "'") {
    let inner = '';
    let i = 1;
    for (; i < v.length && v[i] !== q; i++) {
      if (q === '"' && v[i] === '\\' && i + 1 < v.length && '"\\$`'.includes(v[i + 1] as string)) i++;
      inner += v[i];
    }
    if (i < v.length && /^\s*(#.*)?$/.test(v.slice(i + 1))) return inner;
  }
  return v.replace(/\s+#.*$/, '');
}

export async function readEnvFile(file: string): Promise<Record<string, string>> {
  try {
    return parseEnvFile(await fs.readFile(file, 'utf8'));
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return {};
    throw e;
  }
}

/** Set keys in the env file, keeping every other line as it was; written atomically. */
export async function updateEnvFile(file: string, values: Record<string, string>): Promise<void> {
  let lines: string[] = [];
  try {
    lines = (await fs.readFile(file, 'utf8')).split('\n');
    if (lines.at(-1) === '') lines.pop();
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
  }
  const pending = new Map(Object.entries(values));
  const written = new Set<string>();
  const next: string[] = [];
  for (const line of lines) {
    const key = LINE.exec(line)?.[1];
    if (key === undefined || /^\s*#/.test(line) || !pending.has(key)) {
      next.push(line);
    } else if (!written.has(key)) {
      // The first assignment is rewritten in place; later ones would win when read, so they go.
      next.push(`${key}=${pending.get(key) ?? ''}`);
      written.add(key);
    }
  }
  for (const [k, v] of pending) if (!written.has(k)) next.push(`${k}=${v}`);
  await fs.mkdir(path.dirname(file), { recursive: true });
  const tmp = `${file}.tmp-${process.pid}`;
  const fh = await fs.open(tmp, 'w', 0o644);
  try {
    await fh.writeFile(`${next.join('\n')}\n`);
    await fh.sync();
  } catch (e) {
    await fh.close().catch(() => undefined);
    await fs.rm(tmp, { force: true });
    throw e;
  }
  await fh.close();
  await fs.rename(tmp, file);
}
