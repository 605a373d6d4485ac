/**
 * A drift check (`natgw status --check`: a full sync as a dry run) reads the kernel back and
 * renders the repair, but applies nothing, reports no sync, and leaves the engine's trust in
 * what it applied last: the next command is still one partial transaction.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config/config.js';
import { Engine, type SyncEvent } from '../../src/engine/engine.js';
import * as Ops from '../../src/state/operations.js';
import type { ExecRequest } from '../../src/system/exec.js';
import { RecordingExecutor } from '../helpers/execCalls.js';
import type { Dnat } from '../../src/model/rules.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

const cmd = (r: ExecRequest): string => [r.file, ...r.args].join(' ');
const dnat = (i: number): Dnat => ({ eip: '172.20.0.10', port: 1000 + i, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 });

describe('engine: a dry-run full sync (drift check)', () => {
  it('reads back, applies nothing, and the next command stays partial', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'natgw-drift-'));
    dirs.push(dir);
    const config = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'none.env'), NATGW_STATE_DIR: dir, GATEWAY_NETFILTER_MODE: 'nftables' });
    // An empty kernel: whatever natgw applied is gone (drift), so the check has a repair to render.
    const exec = new RecordingExecutor((r) =>
      r.file === 'nft' && r.args.includes('list') ? { exitCode: 1, stderr: 'Error: No such file or directory' } : undefined,
    );
    const engine = new Engine({ config, exec, log: pino({ level: 'silent' }) });
    const events: SyncEvent[] = [];
    engine.onSync((e) => events.push(e));
    await engine.transact(({ state }) => ({ state: { ...state, initialized: true }, effects: [] }), { mode: 'full' });
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(1)));
    const generation = engine.generation;
    exec.calls.length = 0;
    events.length = 0;

    const { report } = await engine.transact(({ state }) => ({ state, effects: [] }), { mode: 'full', dryRun: true, qos: true });
    expect(report.netfilterChanges).toBeGreaterThan(0);
    expect(report.script).toContain('172.20.0.10');
    expect(exec.calls.some((r) => r.file === 'nft' && r.args.includes('list'))).toBe(true);
    expect(exec.calls.filter((r) => cmd(r) === 'nft -f -')).toEqual([]);
    expect(events).toEqual([]);
    expect(engine.generation).toBe(generation);

    exec.calls.length = 0;
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(2)), { guarded: true });
    expect(exec.calls.map(cmd)).toEqual(['nft -f -']);
    expect(events.map((e) => e.kind)).toEqual(['partial']);
  });
});
