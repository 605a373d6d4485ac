/**
 * The bundles resolve 'mime-types' to scripts/mimeTypesLean.cjs (scripts/bundle.mjs): its table
 * answers the API's own types without loading mime-db, and every answer, from the table or not,
 * is the package's.
 */
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

const root = new URL('../../', import.meta.url).pathname;
const require = createRequire(import.meta.url);
const LEAN = join(root, 'scripts', 'mimeTypesLean.cjs');

interface Mime {
  lookup(p: unknown): string | false;
  contentType(t: unknown): string | false;
  charset(t: unknown): string | false;
  extension(t: unknown): string | false;
  types: Record<string, string>;
  extensions: Record<string, string[]>;
}

describe('the lean mime-types of the bundles', () => {
  const lean = require(LEAN) as Mime;
  const full = require('mime-types') as Mime;
  const db = require('mime-db') as Record<string, unknown>;

  it('answers lookup and contentType as the package does, for every type and extension it knows and the odd inputs', () => {
    const inputs: unknown[] = [
      ...Object.keys(db),
      ...Object.keys(full.types),
      ...Object.keys(full.types).map((e) => `file.${e}`),
      ...['json', 'html', 'text', 'txt', 'bin', 'JSON', '.json', 'x.json', 'a/b.txt', 'urlencoded', 'application/x-www-form-urlencoded'],
      ...['application/json', 'text/html', 'text/plain', 'application/octet-stream', 'TEXT/HTML', 'text/plain; charset=latin1'],
      ...['text/plain; version=0.0.4; charset=utf-8', 'application/json; q=1', '', ' ', 'nope', 'foo/bar', undefined, null, 42, {}],
    ];
    for (const x of inputs) {
      expect(lean.lookup(x), `lookup(${JSON.stringify(x)})`).toBe(full.lookup(x));
      expect(lean.contentType(x), `contentType(${JSON.stringify(x)})`).toBe(full.contentType(x));
    }
    expect(lean.charset('text/html')).toBe(full.charset('text/html'));
    expect(lean.extension('application/json')).toBe(full.extension('application/json'));
    expect(lean.types.json).toBe('application/json');
  });

  it("answers the API's own types without loading mime-db", () => {
    // A fresh process: this one's require cache already holds the package.
    const script = `
      const lean = require(${JSON.stringify(LEAN)});
      const answers = [lean.contentType('application/json'), lean.contentType('json'), lean.lookup('json'), lean.contentType('text/plain; version=0.0.4; charset=utf-8'), lean.contentType('html')];
      const loaded = Object.keys(require.cache).some((f) => f.includes('mime-db'));
      const before = loaded;
      lean.lookup('png');
      const after = Object.keys(require.cache).some((f) => f.includes('mime-db'));
      process.stdout.write(JSON.stringify({ answers, before, after }));`;
    const out = JSON.parse(execFileSync(process.execPath, ['-e', script], { encoding: 'utf8' })) as { answers: string[]; before: boolean; after: boolean };
    expect(out.answers).toEqual([
      'application/json; charset=utf-8',
      'application/json; charset=utf-8',
      'application/json',
      'text/plain; version=0.0.4; charset=utf-8',
      'text/html; charset=utf-8',
    ]);
    expect(out.before).toBe(false);
    // Any other type loads the package (and its answer is the package's: above).
    expect(out.after).toBe(true);
  });
});
