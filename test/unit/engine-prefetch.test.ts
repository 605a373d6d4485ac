/**
 * A full sync reads the addresses and routes while NAT applies (the link part's read-back does
 * not wait for the nft transaction), but changes them only after it: no EIP goes up before its
 * translation is in place. Counted in tool runs with the recording executor.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config/config.js';
import { Engine } from '../../src/engine/engine.js';
import * as Ops from '../../src/state/operations.js';
import { RecordingExecutor, type ExecRequest, type ExecResult } from '../../src/system/exec.js';
import { cmd } from '../helpers/execCalls.js';
import { waitFor } from '../helpers/poll.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

const isLinkRead = (r: ExecRequest): boolean => r.file === 'ip' && r.args.includes('-j') && r.args.includes('-batch');
const isLinkChange = (r: ExecRequest): boolean => cmd(r) === 'ip -batch -';
const isNatApply = (r: ExecRequest): boolean => cmd(r) === 'nft -f -' && /table ip natgw/.test(r.input ?? '');

/** Every tool answers a turn of the event loop later, as a real process does. */
class TurnExecutor extends RecordingExecutor {
  override async run(req: ExecRequest): Promise<ExecResult> {
    const answer = super.run(req);
    answer.catch(() => undefined);
    await new Promise<void>((r) => setImmediate(r));
    return answer;
  }
}

async function setUp(failLinkReads = 0, Exec: typeof TurnExecutor = TurnExecutor) {
  const dir = mkdtempSync(path.join(tmpdir(), 'natgw-prefetch-'));
  dirs.push(dir);
  const config = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'none.env'), NATGW_STATE_DIR: dir, GATEWAY_NETFILTER_MODE: 'nftables' });
  let failing = failLinkReads;
  const exec = new Exec((r) => {
    if (isLinkRead(r) && failing > 0) {
      failing--;
      // The tool could not be run at all (a view is otherwise built from whatever it printed).
      throw new Error('spawn ip EAGAIN');
    }
    // An empty kernel: natgw's tables do not exist yet.
    if (r.file === 'nft' && r.args.includes('list')) return { exitCode: 1, stderr: 'Error: No such file or directory' };
    return undefined;
  });
  const engine = new Engine({ config, exec, log: pino({ level: 'silent' }) });
  return { engine, exec };
}

const withEip = (engine: Engine) =>
  engine.transact(({ state }) => Ops.addEip({ ...state, initialized: true }, { address: '172.20.0.10', prefixLength: 24 }, {}), { mode: 'full' });

describe('engine: a full sync reads the link view beside the NAT transaction', () => {
  it('lists addresses and routes before the nft transaction ends, and changes them only after it', async () => {
    const { engine, exec } = await setUp();
    await withEip(engine);
    const calls = exec.calls;
    const nat = calls.findIndex(isNatApply);
    expect(nat).toBeGreaterThanOrEqual(0);
    const reads = calls.map((c, i) => (isLinkRead(c) ? i : -1)).filter((i) => i >= 0);
    // Both families, once each, started before the NAT transaction.
    expect(reads).toHaveLength(2);
    expect(Math.max(...reads)).toBeLessThan(nat);
    const change = calls.findIndex(isLinkChange);
    expect(change).toBeGreaterThan(nat);
    expect(calls[change]!.input).toContain('172.20.0.10');
  });

  it('a partial sync reads nothing ahead', async () => {
    const { engine, exec } = await setUp();
    await withEip(engine);
    exec.calls.length = 0;
    await engine.transact(({ state }) => Ops.addEip(state, { address: '172.20.0.11', prefixLength: 24 }, {}));
    expect(exec.calls.filter(isLinkRead)).toEqual([]);
  });

  it('an early read that failed is made again by the link part itself', async () => {
    const { engine, exec } = await setUp(1);
    await withEip(engine);
    const nat = exec.calls.findIndex(isNatApply);
    const reads = exec.calls.map((c, i) => (isLinkRead(c) ? i : -1)).filter((i) => i >= 0);
    expect(reads.filter((i) => i < nat)).toHaveLength(2);
    expect(reads.filter((i) => i > nat)).toHaveLength(2);
    expect(exec.calls.findIndex(isLinkChange)).toBeGreaterThan(nat);
  });

  it("a bulk change's ownership record (intent) is durable while NAT applies, not after it", async () => {
    /** The NAT transaction answers only once the record names the new EIP (or gives up after a deadline). */
    let seenDuringNat: boolean | undefined;
    class NatWaitsForIntent extends TurnExecutor {
      static ownedFile = '';
      override async run(req: ExecRequest): Promise<ExecResult> {
        if (isNatApply(req) && seenDuringNat === undefined) {
          const names = () => existsSync(NatWaitsForIntent.ownedFile) && readFileSync(NatWaitsForIntent.ownedFile, 'utf8').includes('172.20.0.10');
          seenDuringNat = await waitFor(async () => names(), { what: 'the intent record', timeoutMs: 3000, intervalMs: 5 }).then(
            () => true,
            () => false,
          );
        }
        return super.run(req);
      }
    }
    const { engine, exec } = await setUp(0, NatWaitsForIntent);
    NatWaitsForIntent.ownedFile = path.join(engine.config.stateDir, 'owned.json');
    await withEip(engine);
    expect(seenDuringNat).toBe(true);
    // The addresses still change after NAT, once.
    const changes = exec.calls.map((c, i) => (isLinkChange(c) ? i : -1)).filter((i) => i >= 0);
    expect(changes).toHaveLength(1);
    expect(changes[0]).toBeGreaterThan(exec.calls.findIndex(isNatApply));
  });

  it("a single command's ownership record (intent) is durable while NAT applies too", async () => {
    /** The second NAT transaction answers only once the record names the second EIP. */
    let natRuns = 0;
    let seenDuringNat: boolean | undefined;
    class NatWaitsForIntent extends TurnExecutor {
      static ownedFile = '';
      override async run(req: ExecRequest): Promise<ExecResult> {
        // The partial change's nft transaction names no table line: any `nft -f` after the first.
        if (cmd(req) === 'nft -f -' && ++natRuns === 2) {
          const names = () => existsSync(NatWaitsForIntent.ownedFile) && readFileSync(NatWaitsForIntent.ownedFile, 'utf8').includes('172.20.0.11');
          seenDuringNat = await waitFor(async () => names(), { what: 'the intent record', timeoutMs: 3000, intervalMs: 5 }).then(
            () => true,
            () => false,
          );
        }
        return super.run(req);
      }
    }
    const { engine, exec } = await setUp(0, NatWaitsForIntent);
    NatWaitsForIntent.ownedFile = path.join(engine.config.stateDir, 'owned.json');
    await withEip(engine);
    exec.calls.length = 0;
    const r = await engine.transact(({ state }) => Ops.addEip(state, { address: '172.20.0.11', prefixLength: 24 }, {}));
    expect(r.report.linkChanges).toBe(1);
    expect(seenDuringNat).toBe(true);
    expect(exec.calls.findIndex(isLinkChange)).toBeGreaterThan(exec.calls.findIndex((c) => cmd(c) === 'nft -f -'));
    expect(readFileSync(NatWaitsForIntent.ownedFile, 'utf8')).toContain('172.20.0.11');
  });

  it('a refused NAT transaction puts the record back as it was: the addresses were never added', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'natgw-prefetch-'));
    dirs.push(dir);
    const config = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'none.env'), NATGW_STATE_DIR: dir, GATEWAY_NETFILTER_MODE: 'nftables' });
    const owned = path.join(dir, 'owned.json');
    const names = () => existsSync(owned) && readFileSync(owned, 'utf8').includes('172.20.0.10');
    let namedDuringNat = false;
    class RefusingNat extends TurnExecutor {
      override async run(req: ExecRequest): Promise<ExecResult> {
        if (isNatApply(req)) {
          namedDuringNat = await waitFor(async () => names(), { what: 'the intent record', timeoutMs: 3000, intervalMs: 5 }).then(
            () => true,
            () => false,
          );
          return { command: cmd(req), exitCode: 1, stdout: '', stderr: 'Error: refused\n', timedOut: false, failedToStart: false };
        }
        return super.run(req);
      }
    }
    const exec = new RefusingNat((r) =>
      r.file === 'nft' && r.args.includes('list') ? { exitCode: 1, stderr: 'Error: No such file or directory' } : undefined,
    );
    const engine = new Engine({ config, exec, log: pino({ level: 'silent' }) });
    await expect(withEip(engine)).rejects.toThrow(/refused/);
    expect(namedDuringNat).toBe(true);
    await waitFor(async () => !names(), { what: 'the record without the refused change', timeoutMs: 3000, intervalMs: 5 });
    expect(exec.calls.filter(isLinkChange)).toEqual([]);
  });
});
