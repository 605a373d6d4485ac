/**
 * No import cycles under src/ (after zod's no-circular-imports test). A cycle means some module
 * in it is evaluated before the ones it depends on have finished, so a value it reads at load
 * time may be in its temporal dead zone; and it blurs the order of the rooms (DESIGN.md).
 *
 * Edges are read with the TypeScript parser, not regexes, so comments, strings and multi-line
 * import lists cannot fool it. Three kinds of reference:
 *   - runtime: `import { a }`, `import * as`, `export … from`, side-effect `import './x.js'`.
 *     Counted even where tsc would elide an import used only as a type: the syntax says value,
 *     and `verbatimModuleSyntax` or another compiler would keep it.
 *   - type-only: `import type`, `export type … from`, or every specifier marked `type`. Erased
 *     at compile time, so such a cycle cannot misorder evaluation; reported, not failed.
 *   - dynamic `import()`: evaluated after every static import has finished, so never part of a
 *     load-order cycle; not an edge (cli/main.ts uses it to keep `--help` fast).
 */
import { readFileSync, readdirSync, existsSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const SRC = join(ROOT, 'src');

type Graph = Map<string, Set<string>>;

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    if (e.isDirectory()) return sourceFiles(p);
    return e.name.endsWith('.ts') && !e.name.endsWith('.d.ts') ? [p] : [];
  });
}

interface Edge {
  readonly to: string;
  readonly typeOnly: boolean;
}

function typeOnly(stmt: ts.ImportDeclaration | ts.ExportDeclaration): boolean {
  if (ts.isExportDeclaration(stmt)) {
    if (stmt.isTypeOnly) return true;
    const c = stmt.exportClause;
    return !!c && ts.isNamedExports(c) && c.elements.length > 0 && c.elements.every((e) => e.isTypeOnly);
  }
  const clause = stmt.importClause;
  if (!clause) return false; // side-effect import
  if (clause.isTypeOnly) return true;
  if (clause.name) return false; // a default import is a value
  const b = clause.namedBindings;
  return !!b && ts.isNamedImports(b) && b.elements.length > 0 && b.elements.every((e) => e.isTypeOnly);
}

function edgesOf(file: string): Edge[] {
  const sf = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, false, ts.ScriptKind.TS);
  const edges: Edge[] = [];
  for (const stmt of sf.statements) {
    if (!ts.isImportDeclaration(stmt) && !ts.isExportDeclaration(stmt)) continue;
    const spec = stmt.moduleSpecifier;
    if (!spec || !ts.isStringLiteral(spec) || !spec.text.startsWith('.')) continue;
    // NodeNext: sources import their compiled name, `./x.js`, which is `./x.ts` here.
    const target = resolve(dirname(file), spec.text.replace(/\.js$/, '.ts'));
    edges.push({ to: target, typeOnly: typeOnly(stmt) });
  }
  return edges;
}

function buildGraphs(): { runtime: Graph; all: Graph; unresolved: string[] } {
  const runtime: Graph = new Map();
  const all: Graph = new Map();
  const unresolved: string[] = [];
  for (const file of sourceFiles(SRC)) {
    const from = relative(SRC, file);
    runtime.set(from, runtime.get(from) ?? new Set());
    all.set(from, all.get(from) ?? new Set());
    for (const e of edgesOf(file)) {
      if (!existsSync(e.to)) {
        unresolved.push(`${from} → ${relative(ROOT, e.to)}`);
        continue;
      }
      const to = relative(SRC, e.to);
      all.get(from)!.add(to);
      if (!e.typeOnly) runtime.get(from)!.add(to);
    }
  }
  return { runtime, all, unresolved };
}

/**
 * Every cycle closed by a back edge of a depth-first walk (madge's report), each written from
 * its smallest module so the same cycle found twice is listed once. Not every elementary cycle
 * (there can be exponentially many), but none is missed as a cycle-free graph: each strongly
 * connected component yields at least one.
 */
function findCycles(graph: Graph): string[][] {
  const seen = new Set<string>();
  const onStack = new Map<string, number>();
  const stack: string[] = [];
  const found = new Map<string, string[]>();
  const visit = (n: string): void => {
    seen.add(n);
    onStack.set(n, stack.length);
    stack.push(n);
    for (const m of [...(graph.get(n) ?? [])].sort()) {
      const at = onStack.get(m);
      if (at !== undefined) {
        const cyc = stack.slice(at);
        const start = cyc.indexOf([...cyc].sort()[0]!);
        const canon = [...cyc.slice(start), ...cyc.slice(0, start)];
        found.set(canon.join(' → '), canon);
      } else if (!seen.has(m)) {
        visit(m);
      }
    }
    stack.pop();
    onStack.delete(n);
  };
  for (const n of [...graph.keys()].sort()) if (!seen.has(n)) visit(n);
  return [...found.values()].sort((a, b) => a.join().localeCompare(b.join()));
}

const show = (cycles: string[][]): string[] => cycles.map((c) => [...c, c[0]].join(' → '));

describe('findCycles', () => {
  const g = (edges: Record<string, string[]>): Graph => new Map(Object.entries(edges).map(([k, v]) => [k, new Set(v)]));

  it('finds none in a DAG, including diamonds', () => {
    expect(findCycles(g({ a: ['b', 'c'], b: ['d'], c: ['d'], d: [] }))).toEqual([]);
  });

  it('finds self-loops, two-cycles and longer ones, each once', () => {
    expect(show(findCycles(g({ a: ['a'] })))).toEqual(['a → a']);
    expect(show(findCycles(g({ b: ['a'], a: ['b'] })))).toEqual(['a → b → a']);
    expect(show(findCycles(g({ a: ['b'], b: ['c'], c: ['a', 'd'], d: ['d'] })))).toEqual(['a → b → c → a', 'd → d']);
  });
});

describe('import graph of src/', () => {
  const { runtime, all, unresolved } = buildGraphs();

  it('reads every relative import (a parser that sees nothing would pass anything)', () => {
    expect(unresolved).toEqual([]);
    expect(runtime.size).toBeGreaterThan(20);
    expect(runtime.get('engine/engine.ts')).toContain('state/store.ts');
    expect(all.get('engine/queue.ts')).toContain('engine/engine.ts');
  });

  it('has no runtime import cycle', () => {
    expect(show(findCycles(runtime))).toEqual([]);
  });

  it('has no cycle through type-only imports either', () => {
    // Harmless at run time (erased), but still a sign two modules want a third to share.
    expect(show(findCycles(all))).toEqual([]);
  });
});
