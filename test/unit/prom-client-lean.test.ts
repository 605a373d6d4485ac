/**
 * The bundles resolve 'prom-client' to scripts/promClientLean.cjs (scripts/bundle.mjs): every
 * value src/ imports from prom-client must be there, and be prom-client's own.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

const root = new URL('../../', import.meta.url).pathname;
const require = createRequire(import.meta.url);

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sources(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : [],
  );
}

/** The value names (not `type` ones) imported from 'prom-client' anywhere in src/. */
function importedValues(): Set<string> {
  const names = new Set<string>();
  for (const file of sources(join(root, 'src'))) {
    for (const m of readFileSync(file, 'utf8').matchAll(/import\s+(type\s+)?(\{[^}]*\}|\*\s+as\s+\w+|\w+)\s+from\s+'prom-client'/g)) {
      if (m[1]) continue;
      const clause = m[2] as string;
      // A namespace or default import would take anything: the lean entry could not be checked.
      expect(clause.startsWith('{'), `${file}: import ${clause} from 'prom-client'`).toBe(true);
      for (const part of clause.slice(1, -1).split(',')) {
        const t = part.trim();
        if (t && !t.startsWith('type ')) names.add(t.split(/\s+as\s+/)[0] as string);
      }
    }
  }
  return names;
}

describe('the lean prom-client of the bundles', () => {
  it("exports prom-client's own value of every name src/ imports", () => {
    const lean = require(join(root, 'scripts', 'promClientLean.cjs')) as Record<string, unknown>;
    const full = require('prom-client') as Record<string, unknown>;
    const names = importedValues();
    expect(names.size).toBeGreaterThan(0);
    for (const n of names) {
      expect(lean[n], n).toBeDefined();
      expect(lean[n], n).toBe(full[n]);
    }
  });
});
