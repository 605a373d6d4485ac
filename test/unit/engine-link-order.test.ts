/**
 * The link part changes addresses and routes only after NAT applied: no EIP goes up before its
 * translation is in place, and a refused NAT transaction leaves neither an address nor a record
 * of one. Counted in tool runs with the recording executor.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config/config.js';
import { Engine } from '../../src/engine/engine.js';
import * as Ops from '../../src/state/operations.js';
import type { ExecRequest, ExecResult } from '../../src/system/exec.js';
import { cmd, RecordingExecutor } from '../helpers/execCalls.js';

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

async function setUp() {
  const dir = mkdtempSync(path.join(tmpdir(), 'natgw-link-order-'));
  dirs.push(dir);
  const config = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'none.env'), NATGW_STATE_DIR: dir, GATEWAY_NETFILTER_MODE: 'nftables' });
  // An empty kernel: natgw's tables do not exist yet.
  const exec = new TurnExecutor((r) => (r.file === 'nft' && r.args.includes('list') ? { exitCode: 1, stderr: 'Error: No such file or directory' } : undefined));
  const engine = new Engine({ config, exec, log: pino({ level: 'silent' }) });
  return { engine, exec };
}

const withEip = (engine: Engine) =>
  engine.transact(({ state }) => Ops.addEip({ ...state, initialized: true }, { address: '172.20.0.10', prefixLength: 24 }, {}), { mode: 'full' });

describe('engine: addresses and routes follow the NAT transaction', () => {
  it('reads and changes addresses and routes only after the nft transaction', async () => {
    const { engine, exec } = await setUp();
    await withEip(engine);
    const calls = exec.calls;
    const nat = calls.findIndex(isNatApply);
    expect(nat).toBeGreaterThanOrEqual(0);
    const reads = calls.map((c, i) => (isLinkRead(c) ? i : -1)).filter((i) => i >= 0);
    // Both families, once each.
    expect(reads).toHaveLength(2);
    expect(Math.min(...reads)).toBeGreaterThan(nat);
    const change = calls.findIndex(isLinkChange);
    expect(change).toBeGreaterThan(Math.max(...reads));
    expect(calls[change]!.input).toContain('172.20.0.10');
  });

  it('a refused NAT transaction leaves the ownership record without the change, and no address is added', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'natgw-link-order-'));
    dirs.push(dir);
    const config = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'none.env'), NATGW_STATE_DIR: dir, GATEWAY_NETFILTER_MODE: 'nftables' });
    const owned = path.join(dir, 'owned.json');
    const names = () => existsSync(owned) && readFileSync(owned, 'utf8').includes('172.20.0.10');
    class RefusingNat extends TurnExecutor {
      override async run(req: ExecRequest): Promise<ExecResult> {
        if (isNatApply(req)) return { command: cmd(req), exitCode: 1, stdout: '', stderr: 'Error: refused\n', timedOut: false, failedToStart: false };
        return super.run(req);
      }
    }
    const exec = new RefusingNat((r) =>
      r.file === 'nft' && r.args.includes('list') ? { exitCode: 1, stderr: 'Error: No such file or directory' } : undefined,
    );
    const engine = new Engine({ config, exec, log: pino({ level: 'silent' }) });
    await expect(withEip(engine)).rejects.toThrow(/refused/);
    expect(names()).toBe(false);
    expect(exec.calls.filter(isLinkChange)).toEqual([]);
  });
});
