/**
 * The bulk path (PUT /v1/state) as the engine runs it, counted in tool runs with the recording
 * executor: into a gateway whose last full sync found natgw's tables absent, the whole state
 * goes in with ONE nft transaction that carries the per-EIP accounting too, reading nothing
 * back; a full sync folds the accounting into its own transaction (listed beside the
 * read-back); a refused transaction falls back to a full sync.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config/config.js';
import { Engine, type SyncEvent } from '../../src/engine/engine.js';
import type { DesiredState } from '../../src/state/state.js';
import { StateStore } from '../../src/state/store.js';
import type { ExecRequest } from '../../src/system/exec.js';
import { cmd, isApply, isListing, RecordingExecutor } from '../helpers/execCalls.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** An empty kernel (natgw's tables absent) unless `refuse` says otherwise. */
async function setUp(refuse?: (r: ExecRequest) => boolean) {
  const dir = mkdtempSync(path.join(tmpdir(), 'natgw-bulk-'));
  dirs.push(dir);
  const config = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'none.env'), NATGW_STATE_DIR: dir, GATEWAY_NETFILTER_MODE: 'nftables' });
  const exec = new RecordingExecutor((r) => {
    if (refuse?.(r)) return { exitCode: 1, stderr: 'Error: Could not process rule: File exists' };
    if (r.file === 'nft' && r.args.includes('list')) return { exitCode: 1, stderr: 'Error: No such file or directory' };
    return undefined;
  });
  const engine = new Engine({ config, exec, log: pino({ level: 'silent' }) });
  const events: SyncEvent[] = [];
  engine.onSync((e) => events.push(e));
  // The daemon's start: a full sync of a gateway not yet initialised.
  await engine.transact(({ state }) => ({ state, effects: [] }), { mode: 'full' });
  exec.calls.length = 0;
  return { engine, exec, events, dir };
}

/** n EIPs, 10 DNATs and 10 FIPs per EIP (a bulk document's shape). */
function bulk(s: DesiredState, n: number): DesiredState {
  const eips = Array.from({ length: n }, (_, i) => ({ address: `172.20.${i >> 8}.${i & 255}`, prefixLength: 16 }));
  const dnats = eips.flatMap((e, i) =>
    Array.from({ length: 10 }, (_, p) => ({
      eip: e.address,
      port: 1000 + p,
      protocol: 'tcp' as const,
      internalIp: `10.0.${i >> 8}.${i & 255}`,
      internalPort: 80,
    })),
  );
  const fips = Array.from({ length: n * 10 }, (_, i) => ({ eip: `172.21.${i >> 8}.${i & 255}`, internalIp: `10.2.${i >> 8}.${i & 255}` }));
  return { ...s, initialized: true, eips, dnats, fips };
}

const applies = (exec: RecordingExecutor) => exec.calls.filter(isApply);

describe('engine: bulk change into an empty gateway', () => {
  it('lists no NAT table and runs one nft transaction, accounting included', async () => {
    const { engine, exec, events } = await setUp();
    await engine.transact(({ state }) => ({ state: bulk(state, 50), effects: [] }));
    // The small tables are read: the accounting table and the addresses and routes.
    expect(exec.calls.filter(isListing).map(cmd).sort()).toEqual(['ip -6 -j -batch -', 'ip -j -batch -', 'nft -j list table inet natgw_acct']);
    expect(applies(exec)).toHaveLength(1);
    const script = applies(exec)[0]!.input ?? '';
    expect(script).toMatch(/^add table ip natgw$/m);
    expect(script).toMatch(/^add element ip natgw port_dnat \{ 172\.20\.0\.0 \. tcp \. 1000 : 10\.0\.0\.0 \. 80/m);
    expect(script).toMatch(/^add table inet natgw_acct$/m);
    expect(script).toMatch(/^add element inet natgw_acct eip_rx4 \{ 172\.20\.0\.49 \}$/m);
    expect(events.at(-1)).toMatchObject({ ok: true, kind: 'partial' });
    // The next change is planned against what that one applied: its own elements only.
    exec.calls.length = 0;
    await engine.transact(({ state }) => ({ state: { ...state, fips: state.fips.slice(1) }, effects: [] }));
    expect(exec.calls.map(cmd)).toEqual(['nft -f -']);
    expect(exec.calls[0]!.input).toBe('delete element ip natgw fip_dnat { 172.21.0.0 }\ndelete element ip natgw fip_snat { 10.2.0.0 }\n');
  });

  it('after a distrust (a link event) the same change reads back first: no trust in what was not applied here', async () => {
    const { engine, exec, events } = await setUp();
    engine.distrust();
    await engine.transact(({ state }) => ({ state: bulk(state, 5), effects: [] }));
    expect(exec.calls.filter(isListing).map(cmd)).toEqual(expect.arrayContaining(['nft -j list table ip natgw', 'nft -j list table inet natgw_acct']));
    // Accounting still travels in the NAT transaction.
    expect(applies(exec)).toHaveLength(1);
    expect(applies(exec)[0]!.input).toMatch(/^add table inet natgw_acct$/m);
    expect(events.at(-1)).toMatchObject({ ok: true, kind: 'full' });
  });

  it('a refused transaction (a table someone created meanwhile) is retried as a full sync', async () => {
    let refusals = 1;
    const { engine, exec, events } = await setUp((r) => isApply(r) && refusals-- > 0);
    await engine.transact(({ state }) => ({ state: bulk(state, 5), effects: [] }));
    expect(events.slice(-2).map((e) => [e.kind, e.ok])).toEqual([
      ['partial', false],
      ['full', true],
    ]);
    expect(exec.calls.some(isListing)).toBe(true);
    expect((await engine.loadState()).dnats).toHaveLength(50);
  });

  it('a bulk change the kernel refuses (partial, then full) is not in the state file either', async () => {
    const { engine, exec, dir } = await setUp((r) => isApply(r));
    const before = await new StateStore(dir).load();
    await expect(engine.transact(({ state }) => ({ state: bulk(state, 5), effects: [] }))).rejects.toThrow(/nft -f/);
    expect(applies(exec).length).toBeGreaterThanOrEqual(2);
    // A store of its own: what another process (or the next start) would read.
    const after = await new StateStore(dir).load();
    expect(after).toEqual(before);
    expect(after?.dnats).toEqual([]);
  });

  it('a full sync of an initialised gateway folds the accounting into its one transaction', async () => {
    const { engine, exec } = await setUp();
    await engine.transact(({ state }) => ({ state: bulk(state, 5), effects: [] }));
    exec.calls.length = 0;
    await engine.resync('test');
    // This fake kernel lists nothing, so the full sync writes everything again: in one transaction.
    expect(applies(exec)).toHaveLength(1);
    expect(applies(exec)[0]!.input).toMatch(/^add element ip natgw fip_dnat /m);
    expect(applies(exec)[0]!.input).toMatch(/^add element inet natgw_acct eip_tx4 \{ 172\.20\.0\.4 \}$/m);
  });
});
