/**
 * The injection corpus (test/corpus/injection.json) against the legacy runner on a real Engine
 * over recording fakes: every case is refused with status 1 and one reason line, and no tool is
 * called. test/netns/injection.test.ts runs the same corpus through the shim against a real
 * daemon and kernel.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runLegacy } from '../../src/engine/legacy.js';
import type { Engine } from '../../src/engine/engine.js';
import { RecordingKernel } from '../helpers/recordingKernel.js';
import { REPO_ROOT } from '../helpers/netns.js';

export interface InjectionCase {
  readonly command: string;
  readonly rules: readonly string[];
  readonly why: string;
}
const CORPUS = (JSON.parse(readFileSync(path.join(REPO_ROOT, 'test', 'corpus', 'injection.json'), 'utf8')) as { cases: InjectionCase[] }).cases;

describe('the injection corpus against the legacy runner', () => {
  let kernel: RecordingKernel;
  let engine: Engine;
  beforeAll(async () => {
    kernel = new RecordingKernel();
    engine = await kernel.initialised({ NATGW_INTERFACE_WAIT_TIMEOUT: '0s' });
  });
  afterAll(() => kernel.cleanup());

  it('holds at least 200 cases, each with its reason', () => {
    expect(CORPUS.length).toBeGreaterThanOrEqual(200);
    for (const c of CORPUS) expect(c.why.length).toBeGreaterThan(5);
  });

  it('refuses every case with status 1 and one reason line, calling no tool', async () => {
    const wrong: string[] = [];
    for (const c of CORPUS) {
      const before = kernel.calls.length;
      const out = await runLegacy(engine, c.command, c.rules);
      const reason = c.command === 'init' ? out.stderr : out.stdout.slice(`${c.command} ${c.rules.join(' ')}\n`.length);
      const problems = [
        out.status !== 1 && `status ${out.status}`,
        c.command !== 'init' && out.stderr !== '' && `stderr ${JSON.stringify(out.stderr)}`,
        c.command !== 'init' && !out.stdout.startsWith(`${c.command} ${c.rules.join(' ')}\n`) && 'no header line',
        !/^Error: [^\n]*\n$/.test(reason) && `reason ${JSON.stringify(reason.slice(0, 200))}`,
        kernel.calls.length !== before && `tool calls ${JSON.stringify(kernel.calls.slice(before))}`,
      ].filter(Boolean);
      if (problems.length) wrong.push(`${c.why}: ${problems.join('; ')}`);
    }
    expect(wrong).toEqual([]);
  });
});
