/**
 * The end of a run, after vitest's own report: the slowest files (where the time goes, to keep
 * CI within its budget) and one plain closing line, `N passed, N failed`, for a log reader.
 * A file that failed to load, and an error outside any test, count as one failure each.
 */
import type { Reporter, SerializedError, TestModule } from 'vitest/node';

const SHOWN = 15;

export default class SlowestFiles implements Reporter {
  onTestRunEnd(modules: ReadonlyArray<TestModule>, unhandledErrors: ReadonlyArray<SerializedError>): void {
    let passed = 0;
    let failed = unhandledErrors.length;
    const files = modules.map((m) => {
      const d = m.diagnostic();
      let failedHere = 0;
      for (const t of m.children.allTests()) {
        const state = t.result().state;
        if (state === 'passed') passed++;
        else if (state === 'failed') failedHere++;
      }
      // A file that failed without a failed test (an import error, a failed hook) is one failure.
      if (failedHere === 0 && m.state() === 'failed') failedHere = 1;
      failed += failedHere;
      const ms = d.prepareDuration + d.environmentSetupDuration + d.setupDuration + d.collectDuration + d.duration;
      return { ms, name: m.relativeModuleId, project: m.project.name };
    });
    const slowest = files.sort((a, b) => b.ms - a.ms).slice(0, SHOWN);
    const lines = [`\nThe slowest files (${slowest.length} of ${files.length}):`];
    for (const f of slowest) lines.push(`${(f.ms / 1000).toFixed(1).padStart(8)} s  ${f.project ? `[${f.project}] ` : ''}${f.name}`);
    lines.push(`${passed} passed, ${failed} failed`);
    process.stdout.write(`${lines.join('\n')}\n`);
  }
}
