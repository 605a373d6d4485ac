/**
 * A real Engine over fake tools that records every tool call: the in-memory nft client and
 * iptables fake of the unit tests behind a RecordingExecutor. Property tests use it to prove
 * that refused input never reaches a tool: the count of calls does not move.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { loadConfig } from '../../src/config/config.js';
import { Engine } from '../../src/engine/engine.js';
import type { ExecRequest } from '../../src/system/exec.js';
import { RecordingExecutor } from './execCalls.js';
import { FakeIptables } from './fakeIptables.js';
import { FakeNftClient } from './fakeNft.js';

export class RecordingKernel {
  readonly nft = new FakeNftClient();
  readonly ipt = new FakeIptables();
  /** Every tool call, in order: an executor request as its argv, an nft transaction as `nft <script>`. */
  readonly calls: string[] = [];
  readonly exec = new RecordingExecutor((r: ExecRequest) => {
    this.calls.push([r.file, ...r.args].join(' '));
    // The static-neighbour part's read-back: no entries yet, and the pod's two interfaces.
    if (r.file === 'ip' && r.args.join(' ') === '-j -batch -' && r.input?.startsWith('neigh show')) {
      return { stdout: '[]\n[{"ifname":"eth0"},{"ifname":"net1"}]\n' };
    }
    // QoS reads an empty kernel: the pod's two interfaces, no qdisc of natgw's.
    if (r.file === 'ip' && r.args.join(' ') === '-j link show') return { stdout: '[{"ifname":"eth0"},{"ifname":"net1"}]\n' };
    if (r.file === 'tc' && r.args.join(' ') === 'qdisc show') return { stdout: '' };
    return this.ipt.answer(r);
  });
  readonly dir = mkdtempSync(path.join(tmpdir(), 'natgw-prop-'));

  constructor() {
    const run = this.nft.run.bind(this.nft);
    this.nft.run = async (tx) => {
      this.calls.push(`nft ${typeof tx === 'string' ? tx : tx.text()}`);
      await run(tx);
    };
  }

  async engine(env: Record<string, string> = {}): Promise<Engine> {
    const config = await loadConfig({ NATGW_ENV_FILE: path.join(this.dir, 'none.env'), NATGW_STATE_DIR: this.dir, GATEWAY_NETFILTER_MODE: 'nftables', ...env });
    return new Engine({ config, exec: this.exec, log: pino({ level: 'silent' }), nft: this.nft });
  }

  /** An engine that has run init: later commands pass the guard. */
  async initialised(env: Record<string, string> = {}): Promise<Engine> {
    const engine = await this.engine(env);
    await engine.transact(({ state }) => ({ state: { ...state, initialized: true }, effects: [] }), { mode: 'full' });
    return engine;
  }

  cleanup(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }
}
