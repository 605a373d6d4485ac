/**
 * What runs beside a transaction in the daemon's process (a link event, a GET, a metrics
 * scrape, the reconciler's interface check) must not change what the transaction, or the
 * next one, relies on. The sync kind is read from the tools the engine ran: a full sync lists
 * natgw's table, a partial one runs only its own `nft -f -`.
 */
import { mkdtempSync, promises as fsp, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { loadConfig } from '../../src/config/config.js';
import { Engine } from '../../src/engine/engine.js';
import * as Ops from '../../src/state/operations.js';
import type { ExecRequest } from '../../src/system/exec.js';
import { cmd, isApply, isListing, RecordingExecutor } from '../helpers/execCalls.js';
import type { Dnat } from '../../src/model/rules.js';
import { LinkManager } from '../../src/dataplane/link.js';
import { emptyState, type DesiredState } from '../../src/state/state.js';
import { CHAINS, dnatSpec } from '../../src/dataplane/netfilter/iptables/ruleText.js';
import { FakeIptables } from '../helpers/fakeIptables.js';
import { FakeNftClient } from '../helpers/fakeNft.js';
import { waitFor } from '../helpers/poll.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

const dnat = (i: number): Dnat => ({ eip: `172.20.0.${i}`, port: 80, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8080 });

/**
 * An engine on an empty fake kernel, initialized and trusted (the last sync partial-ready).
 * `during(r)` runs inside every tool call: a test puts its concurrent event there.
 */
async function trustedEngine(opts: { refuse?: (r: ExecRequest) => boolean } = {}) {
  const dir = mkdtempSync(path.join(tmpdir(), 'natgw-concur-'));
  dirs.push(dir);
  const config = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'none.env'), NATGW_STATE_DIR: dir, GATEWAY_NETFILTER_MODE: 'nftables' });
  const hook: { during?: (r: ExecRequest) => void } = {};
  const exec = new RecordingExecutor((r) => {
    hook.during?.(r);
    if (opts.refuse?.(r)) return { exitCode: 1, stderr: 'Error: Could not process rule: No such file or directory' };
    if (r.file === 'nft' && r.args.includes('list')) return { exitCode: 1, stderr: 'Error: No such file or directory' };
    return undefined;
  });
  const engine = new Engine({ config, exec, log: pino({ level: 'silent' }) });
  await engine.transact(({ state }) => ({ state: { ...state, initialized: true }, effects: [] }), { mode: 'full' });
  await engine.transact(({ state }) => Ops.addDnat(state, dnat(1)));
  exec.calls.length = 0;
  // Proof that the engine trusts what it applied: the next command lists nothing.
  await engine.transact(({ state }) => Ops.addDnat(state, dnat(2)), { guarded: true });
  expect(exec.calls.map(cmd)).toEqual(['nft -f -']);
  exec.calls.length = 0;
  return { engine, exec, hook };
}

describe('engine: a distrust that comes while a transaction runs', () => {
  it('a link event during a partial apply makes the next command a full sync', async () => {
    const { engine, exec, hook } = await trustedEngine();
    // The event lands while the command's nft transaction (planned against the old views) runs.
    hook.during = (r) => {
      if (isApply(r)) {
        hook.during = undefined;
        engine.distrust();
      }
    };
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(3)), { guarded: true });
    expect(exec.calls.map(cmd)).toEqual(['nft -f -']);
    exec.calls.length = 0;
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(4)));
    expect(exec.calls.some(isListing)).toBe(true);
  });

  it('a link event during a full sync makes the next command a full sync too', async () => {
    const { engine, exec, hook } = await trustedEngine();
    hook.during = (r) => {
      if (isListing(r)) {
        hook.during = undefined;
        engine.distrust();
      }
    };
    await engine.transact(({ state }) => ({ state, effects: [] }), { mode: 'full' });
    exec.calls.length = 0;
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(5)));
    expect(exec.calls.some(isListing)).toBe(true);
  });

  it('without an event, the engine trusts again after its own failure-and-retry', async () => {
    let refusals = 1;
    const { engine, exec } = await trustedEngine({ refuse: (r) => isApply(r) && (r.input ?? '').includes('172.20.0.6 ') && refusals-- > 0 });
    // A refused partial apply is retried as a full sync (the engine's own distrust) and succeeds.
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(6)), { guarded: true });
    expect(exec.calls.some(isListing)).toBe(true);
    exec.calls.length = 0;
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(7)), { guarded: true });
    expect(exec.calls.map(cmd)).toEqual(['nft -f -']);
  });

  it('an event before the transaction takes the lock is seen by that transaction itself', async () => {
    const { engine, exec } = await trustedEngine();
    engine.distrust();
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(8)));
    expect(exec.calls.some(isListing)).toBe(true);
    exec.calls.length = 0;
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(9)), { guarded: true });
    expect(exec.calls.map(cmd)).toEqual(['nft -f -']);
  });
});

describe('link ownership record: a reader outside the lock', () => {
  const A = '172.20.0.10';
  const B = '172.20.0.11';
  const addrJson = (ips: string[]) =>
    `[{"ifname":"net1","addr_info":[${ips.map((ip) => `{"family":"inet","local":"${ip}","prefixlen":24,"scope":"global"}`).join(',')}]}]\n[]\n[]\n`;
  const withEips = (ips: string[]): DesiredState => ({
    ...emptyState('eth0', 'net1'),
    initialized: true,
    eips: ips.map((address) => ({ address, prefixLength: 24 })),
  });

  it('a reader that finishes after the lock holder rewrote the record leaves the next intent recorded', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'natgw-concur-'));
    dirs.push(dir);
    const file = path.join(dir, 'owned.json');
    writeFileSync(file, `${JSON.stringify({ ext: 'net1', vpc: 'eth0', addresses: [A, B], routes: [] })}\n`);
    let kernel = [A, B];
    let refuse = false;
    const exec = new RecordingExecutor((r) => {
      if (r.file !== 'ip') return undefined;
      if (r.args.join(' ') === '-j -batch -') return { stdout: addrJson(kernel) };
      if (r.args.join(' ') === '-6 -j -batch -') return { stdout: '[]\n[]\n' };
      if (r.args.join(' ') === '-batch -') {
        // The kernel change is made; the holder writes the shrunk record next, while the reader runs.
        if (!refuse && reader === undefined) {
          // Its read of the file starts now (RecordFile.read opens it at once).
          readerStarts = true;
          reader = link.ownedRecord();
        }
        return refuse ? { exitCode: 2, stderr: 'RTNETLINK answers: File exists' } : undefined;
      }
      return undefined;
    });
    const link = new LinkManager(exec, pino({ level: 'silent' }), file);

    // The reader (engine.loadState's adoption, for GET /v1/state or the reconciler) starts
    // reading the record just before the holder writes a new one, and finishes after it.
    let release: () => void = () => undefined;
    const gate = new Promise<void>((r) => (release = r));
    let reader: Promise<unknown> | undefined;
    let readerStarts = false;
    const realRead = fsp.readFile.bind(fsp) as (f: unknown, o?: unknown) => Promise<string>;
    const read = vi.spyOn(fsp, 'readFile').mockImplementation((async (f: unknown, o?: unknown) => {
      // Only the reader's read is held back: it finishes after the holder wrote the new record.
      const held = f === file && readerStarts;
      readerStarts = false;
      const text = await realRead(f, o);
      if (held) await gate;
      return text;
    }) as typeof fsp.readFile);
    try {
      // eip-del B, under the lock: the record shrinks to A after the kernel change.
      await link.sync(withEips([A]), withEips([A, B]), { mode: 'full' });
      kernel = [A];
      expect(reader).toBeDefined();
      release();
      await reader;
    } finally {
      read.mockRestore();
    }
    expect(JSON.parse(readFileSync(file, 'utf8')).addresses).toEqual([A]);

    // eip-add B again; `ip -batch` stops half-way (B may be in the kernel): the record must
    // list B before the kernel is touched, or a restart never removes it.
    refuse = true;
    await expect(link.sync(withEips([A, B]), withEips([A]), { mode: 'full' })).rejects.toThrow();
    expect(JSON.parse(readFileSync(file, 'utf8')).addresses).toContain(B);
  });
  it("is re-read when another process rewrote it (an in-process shim run's intent), so a full sync removes what that run may have added", async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'natgw-concur-'));
    dirs.push(dir);
    const file = path.join(dir, 'owned.json');
    writeFileSync(file, `${JSON.stringify({ ext: 'net1', vpc: 'eth0', addresses: [A], routes: [] })}\n`);
    let kernel = [A];
    let refuse = false;
    const exec = new RecordingExecutor((r) => {
      if (r.file !== 'ip') return undefined;
      if (r.args.join(' ') === '-j -batch -') return { stdout: addrJson(kernel) };
      if (r.args.join(' ') === '-6 -j -batch -') return { stdout: '[]\n[]\n' };
      if (r.args.join(' ') === '-batch -' && refuse) return { exitCode: 2, stderr: 'RTNETLINK answers: Cannot assign requested address' };
      return undefined;
    });
    const daemon = new LinkManager(exec, pino({ level: 'silent' }), file);
    const shim = new LinkManager(exec, pino({ level: 'silent' }), file);
    await daemon.sync(withEips([A]), withEips([A]), { mode: 'full' });
    // The shim's eip-add B: intent recorded, the kernel changed half-way, nothing committed.
    refuse = true;
    await expect(shim.sync(withEips([A, B]), withEips([A]), { mode: 'full' })).rejects.toThrow();
    kernel = [A, B];
    refuse = false;
    exec.calls.length = 0;
    // The daemon's resync: the state (and the daemon's previous state) list only A.
    await daemon.sync(withEips([A]), withEips([A]), { mode: 'full' });
    expect(exec.calls.filter((r) => r.args.join(' ') === '-batch -').map((r) => r.input)).toEqual([`addr del ${B}/24 dev net1\n`]);
    expect(JSON.parse(readFileSync(file, 'utf8')).addresses).toEqual([A]);
  });
});

describe("iptables: the init guard's listing, kept for its own transaction's sync", () => {
  it('is not consumed by the next transaction after the one that read it failed (it planned against a stale table)', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'natgw-concur-'));
    dirs.push(dir);
    const ipt = new FakeIptables();
    const nft = new FakeNftClient();
    const exec = new RecordingExecutor((r) => ipt.answer(r));
    const config = await loadConfig({
      NATGW_ENV_FILE: path.join(dir, 'none.env'),
      NATGW_STATE_DIR: dir,
      GATEWAY_NETFILTER_MODE: 'iptables',
      NATGW_IPTABLES_VARIANT: 'nft',
    });
    const log = pino({ level: 'silent' });
    // The daemon, and an in-process shim run (another process: its own engine) on the same files and kernel.
    const daemon = new Engine({ config, exec, log, nft });
    const shim = new Engine({ config, exec, log, nft });
    const [d1, d2, d3] = [80, 81, 82].map((port) => ({ ...dnat(10), port }));
    await daemon.transact(({ state }) => ({ state: { ...state, initialized: true }, effects: [] }), { mode: 'full' });
    await daemon.transact(({ state }) => Ops.addDnats(state, [d1!, d2!, d3!]));
    const dnatRules = () => ipt.rules('iptables-nft', 'nat', CHAINS.sharedDnat)?.length ?? 0;
    expect(dnatRules()).toBe(3);

    // A link event; then a guarded command refused after the guard listed the nat table.
    daemon.distrust();
    await expect(
      daemon.transact(
        () => {
          throw new Error('conflict');
        },
        { guarded: true },
      ),
    ).rejects.toThrow('conflict');
    // The shim deletes the first DNAT rule; the daemon's next full sync must see that.
    await shim.transact(({ state }) => Ops.delDnats(state, [d1!]));
    expect(dnatRules()).toBe(2);
    await daemon.resync('periodic');
    // A plan against the stale listing deletes rule 1 by number: the acknowledged d2.
    expect(ipt.rules('iptables-nft', 'nat', CHAINS.sharedDnat)).toEqual([dnatSpec(d2!), dnatSpec(d3!)]);
    expect((await daemon.loadState()).dnats).toHaveLength(2);
  });
});

describe('engine.loadState outside the lock (GET /v1/state, the reconciler, HA digests)', () => {
  it('never answers with a state older than what was acknowledged before it started (a commit folded the journal meanwhile)', async () => {
    const { engine } = await trustedEngine();
    // A link event: loads go to the files until the next transaction.
    engine.distrust();
    const acknowledged = await engine.loadState();
    expect(acknowledged.dnats.map((d) => d.eip)).toEqual(['172.20.0.1', '172.20.0.2']);
    const journal = engine.store.journalFile;
    let release: () => void = () => undefined;
    const gate = new Promise<void>((r) => (release = r));
    let gated = 0;
    const realRead = fsp.readFile.bind(fsp) as (f: unknown, o?: unknown) => Promise<string>;
    const read = vi.spyOn(fsp, 'readFile').mockImplementation((async (f: unknown, o?: unknown) => {
      // The reader has read the snapshot; its journal read waits for two commits.
      if (f === journal && gated++ === 0) await gate;
      return realRead(f, o);
    }) as typeof fsp.readFile);
    let got: DesiredState;
    try {
      const reader = engine.loadState();
      await waitFor(async () => gated > 0, { what: 'the reader at the journal', intervalMs: 5 });
      // A large change (a new snapshot; the old journal goes), then a small one (a new journal on it).
      await engine.transact(({ state }) =>
        Ops.addDnats(
          state,
          Array.from({ length: 100 }, (_, i) => ({ ...dnat(i + 10), port: 2000 + i })),
        ),
      );
      await engine.transact(({ state }) => Ops.addDnat(state, dnat(200)));
      release();
      got = await reader;
    } finally {
      read.mockRestore();
    }
    for (const d of acknowledged.dnats) expect(got.dnats).toContainEqual(d);
  });
});
