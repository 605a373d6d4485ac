/**
 * The engine's choice between a full and a partial sync, counted in tool runs with the
 * recording executor: after a full sync, a command runs only its own transaction (nothing
 * is listed), whatever the number of objects; anything that breaks the trust (another writer
 * of the state files, a refused transaction, a link event) makes the next one full.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config/config.js';
import { Engine, type SyncEvent } from '../../src/engine/engine.js';
import * as Ops from '../../src/state/operations.js';
import type { ExecRequest } from '../../src/system/exec.js';
import { cmd, isListing, RecordingExecutor } from '../helpers/execCalls.js';
import type { Dnat } from '../../src/model/rules.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

const dnat = (i: number): Dnat => ({ eip: `172.20.${i >> 8}.${i & 255}`, port: 80, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8080 });

async function setUp(refuse?: (r: ExecRequest) => boolean) {
  const dir = mkdtempSync(path.join(tmpdir(), 'natgw-engine-'));
  dirs.push(dir);
  const config = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'none.env'), NATGW_STATE_DIR: dir, GATEWAY_NETFILTER_MODE: 'nftables' });
  const exec = new RecordingExecutor((r) => {
    if (refuse?.(r)) return { exitCode: 1, stderr: 'Error: Could not process rule: No such file or directory' };
    // An empty kernel: natgw's tables do not exist yet.
    if (r.file === 'nft' && r.args.includes('list')) return { exitCode: 1, stderr: 'Error: No such file or directory' };
    return undefined;
  });
  const engine = new Engine({ config, exec, log: pino({ level: 'silent' }) });
  const events: SyncEvent[] = [];
  engine.onSync((e) => events.push(e));
  await engine.transact(({ state }) => ({ state: { ...state, initialized: true }, effects: [] }), { mode: 'full' });
  await engine.transact(({ state }) =>
    Ops.addDnats(
      state,
      Array.from({ length: 3000 }, (_, i) => dnat(i)),
    ),
  );
  exec.calls.length = 0;
  return { engine, exec, events, dir };
}

describe('engine: full and partial syncs', () => {
  it('a command after a full sync runs one nft transaction and lists nothing', async () => {
    const { engine, exec, events } = await setUp();
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(5000)), { guarded: true });
    expect(exec.calls.map(cmd)).toEqual(['nft -f -']);
    expect(exec.calls[0]!.input).toMatch(/^add element ip natgw port_dnat \{ 172\.20\.19\.136 \. tcp \. 80 : 10\.0\.1\.6 \. 8080 \}\n$/);
    expect(events.map((e) => e.kind)).toEqual(['full', 'partial', 'partial']);
  });

  it('a command that changes nothing runs no tool at all', async () => {
    const { engine, exec } = await setUp();
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(7)), { guarded: true });
    expect(exec.calls.map(cmd)).toEqual([]);
  });

  it('another writer of the state file makes the next command a full sync', async () => {
    const { engine, exec, events, dir } = await setUp();
    const doc = await engine.loadState();
    writeFileSync(path.join(dir, 'state.json'), JSON.stringify(doc));
    // Not guarded: this fake kernel never lists natgw's table, so a full sync's guard would refuse.
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(5001)));
    expect(exec.calls.some(isListing)).toBe(true);
    expect(events.at(-1)?.kind).toBe('full');
  });

  it('distrust (a link event) makes the next command a full sync, and the one after it partial again', async () => {
    const { engine, exec, events } = await setUp();
    engine.distrust();
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(5002)));
    expect(exec.calls.some(isListing)).toBe(true);
    exec.calls.length = 0;
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(5003)), { guarded: true });
    expect(exec.calls.map(cmd)).toEqual(['nft -f -']);
    expect(events.slice(-2).map((e) => e.kind)).toEqual(['full', 'partial']);
  });

  it('a refused partial transaction is retried once as a full sync, and the command succeeds', async () => {
    let refusals = 1;
    const { engine, exec, events } = await setUp(
      (r) => r.file === 'nft' && r.args.includes('-f') && (r.input ?? '').includes('172.20.19.140') && refusals-- > 0,
    );
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(5004)), { guarded: true });
    expect(events.slice(-2).map((e) => [e.kind, e.ok])).toEqual([
      ['partial', false],
      ['full', true],
    ]);
    expect(exec.calls.some(isListing)).toBe(true);
    expect((await engine.loadState()).dnats).toContainEqual(dnat(5004));
  });

  it('the guard answers from the trusted state: before init every guarded command is refused', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'natgw-engine-'));
    dirs.push(dir);
    const config = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'none.env'), NATGW_STATE_DIR: dir, GATEWAY_NETFILTER_MODE: 'nftables' });
    const exec = new RecordingExecutor((r) =>
      r.file === 'nft' && r.args.includes('list') ? { exitCode: 1, stderr: 'Error: No such file or directory' } : undefined,
    );
    const engine = new Engine({ config, exec, log: pino({ level: 'silent' }) });
    await engine.transact(({ state }) => ({ state, effects: [] }), { mode: 'full' });
    await expect(engine.transact(({ state }) => Ops.addDnat(state, dnat(1)), { guarded: true })).rejects.toThrow(/not initialized/);
  });
});

describe('engine: sync listeners', () => {
  it('every listener hears every apply in subscription order; unsubscribed ones no more; a throwing one breaks nothing', async () => {
    const { engine, events } = await setUp();
    const heard: string[] = [];
    const offA = engine.onSync((e) => heard.push(`a:${e.kind}`));
    engine.onSync(() => {
      throw new Error('a broken observer');
    });
    engine.onSync((e) => heard.push(`b:${e.kind}`));
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(5001)));
    expect(heard).toEqual(['a:partial', 'b:partial']);
    offA();
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(5002)));
    expect(heard).toEqual(['a:partial', 'b:partial', 'b:partial']);
    // The listener of setUp is still subscribed beside them.
    expect(events.map((e) => e.kind)).toEqual(['full', 'partial', 'partial', 'partial']);
  });
});

describe('engine: a dry run changes nothing', () => {
  it('no backend switch, no record written, no transaction run', async () => {
    const { readFileSync } = await import('node:fs');
    const dir = mkdtempSync(path.join(tmpdir(), 'natgw-engine-'));
    dirs.push(dir);
    const record = '{"kind":"iptables","variant":"legacy"}\n';
    writeFileSync(path.join(dir, 'backend.json'), record);
    const config = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'none.env'), NATGW_STATE_DIR: dir, GATEWAY_NETFILTER_MODE: 'nftables' });
    const exec = new RecordingExecutor((r) =>
      r.file === 'nft' && r.args.includes('list') ? { exitCode: 1, stderr: 'Error: No such file or directory' } : undefined,
    );
    const engine = new Engine({ config, exec, log: pino({ level: 'silent' }) });
    const { report } = await engine.transact(({ state }) => Ops.addDnat({ ...state, initialized: true }, dnat(1)), { dryRun: true });
    expect(report.script).toContain('add element ip natgw port_dnat');
    expect(readFileSync(path.join(dir, 'backend.json'), 'utf8')).toBe(record);
    const writes = exec.calls.filter(
      (r) =>
        (r.file === 'nft' && r.args.includes('-f')) || r.file.includes('restore') || (r.file === 'ip' && r.args.includes('-batch') && !r.args.includes('-j')),
    );
    expect(writes.map(cmd)).toEqual([]);
  });
});

describe("engine: a daemon's start", () => {
  it('reads the state once: the interface wait reads it under the lock and hands it to the first sync, unless the files changed', async () => {
    const { engine, dir } = await setUp();
    const { StateStore } = await import('../../src/state/store.js');
    const restarted = new Engine({ config: engine.config, exec: engine.deps.exec, log: engine.log });
    const loads = () => {
      let n = 0;
      const load = restarted.store.load.bind(restarted.store);
      restarted.store.load = () => {
        n++;
        return load();
      };
      return () => n;
    };
    const count = loads();
    expect((await restarted.stateForResync()).dnats).toHaveLength(3000);
    await restarted.resync('start');
    expect(count()).toBe(1);
    // Another writer between the wait and the sync: the sync reads the files again.
    await restarted.stateForResync();
    restarted.distrust();
    await restarted.stateForResync();
    const other = new StateStore(dir);
    const saved = await other.withLock(() => other.load());
    await other.withLock(() => other.save({ ...saved!, dnats: [dnat(9000)] }));
    await restarted.resync('start');
    expect(restarted.lastApplied?.dnats).toEqual([dnat(9000)]);
    expect(count()).toBe(3);
  });
});
