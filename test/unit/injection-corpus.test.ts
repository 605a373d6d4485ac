/**
 * The injection corpus (test/corpus/injection.json) against the legacy runner on a real Engine
 * over recording fakes: every case is refused with status 1 and one reason line naming the field
 * it made hostile, and no tool is called. The control: each command's unmutated base rule is
 * accepted and reaches the tools, so "refused, no tool called" is a property of the mutations.
 * test/netns/injection.test.ts runs the same corpus through the shim against a real daemon and
 * kernel.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runLegacy } from '../../src/engine/legacy.js';
import type { Engine } from '../../src/engine/engine.js';
import { BASES, CORPUS, hostileField } from '../helpers/injectionCorpus.js';
import { RecordingKernel } from '../helpers/recordingKernel.js';

const QOS = new Set(['eip-egress-qos-add', 'qos-add']);

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

  it("accepts each command's unmutated base rule, which reaches the tools (the control)", async () => {
    const fresh = new RecordingKernel();
    const e = await fresh.initialised({ NATGW_INTERFACE_WAIT_TIMEOUT: '0s' });
    try {
      expect(Object.keys(BASES).sort()).toEqual([...new Set(CORPUS.map((c) => c.command))].sort());
      const wrong: string[] = [];
      for (const [command, base] of Object.entries(BASES)) {
        const before = fresh.calls.length;
        const out = await runLegacy(e, command, [base.rule]);
        // The fakes have no QoS devices: a valid QoS rule reaches them and is refused there, as
        // a kernel without the device would (on a real one, test/netns/injection.test.ts, it applies).
        const byTheFakes = QOS.has(command) && out.status === 1 && /^Error: QoS device not found/m.test(out.stdout + out.stderr);
        if (!byTheFakes && (out.status !== 0 || out.stderr !== '')) wrong.push(`${command} ${base.rule}: status ${out.status} ${out.stdout}${out.stderr}`);
        if (fresh.calls.length === before) wrong.push(`${command} ${base.rule}: no tool called`);
      }
      expect(wrong).toEqual([]);
    } finally {
      fresh.cleanup();
    }
  });

  it('refuses every case with status 1 and one reason line naming the hostile field, calling no tool', async () => {
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
        !hostileField(c).test(reason) && `reason ${JSON.stringify(reason.slice(0, 200))} does not name the field (${hostileField(c)})`,
        kernel.calls.length !== before && `tool calls ${JSON.stringify(kernel.calls.slice(before))}`,
      ].filter(Boolean);
      if (problems.length) wrong.push(`${c.why}: ${problems.join('; ')}`);
    }
    expect(wrong).toEqual([]);
  });
});
