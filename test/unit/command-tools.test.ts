/**
 * The tools a command runs on the iptables backend, counted with the recording executor: after
 * a full sync, each command runs exactly one `iptables-restore --noflush` for the one table it
 * changes (none for the other family or the other table, no listing), handed to the executor
 * as prestartable (the daemon's executor may give it a process started ahead); a DNAT or FIP
 * delete adds its conntrack flush, nothing else.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config/config.js';
import { Engine } from '../../src/engine/engine.js';
import * as Ops from '../../src/state/operations.js';
import { RecordingExecutor } from '../../src/system/exec.js';
import { cmd } from '../helpers/execCalls.js';
import type { Dnat } from '../../src/model/rules.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

const EIP = '172.20.0.10';
const dnat = (port: number): Dnat => ({ eip: EIP, port, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8080 });
const RESTORE = 'iptables-legacy-restore --noflush --wait';

async function setUp() {
  const dir = mkdtempSync(path.join(tmpdir(), 'natgw-cmdtools-'));
  dirs.push(dir);
  const config = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'none.env'), NATGW_STATE_DIR: dir, GATEWAY_NETFILTER_MODE: 'iptables' });
  // An empty kernel: no nft table of natgw's, every iptables listing empty, every transaction taken.
  const exec = new RecordingExecutor((r) =>
    r.file === 'nft' && r.args.includes('list') ? { exitCode: 1, stderr: 'Error: No such file or directory' } : undefined,
  );
  const engine = new Engine({ config, exec, log: pino({ level: 'silent' }) });
  await engine.transact(
    ({ state }) => {
      let s = { ...state, initialized: true };
      s = Ops.addEip(s, { address: EIP, prefixLength: 24 }, {}).state;
      s = Ops.addDnats(
        s,
        Array.from({ length: 50 }, (_, i) => dnat(1000 + i)),
      ).state;
      return { state: s, effects: [] };
    },
    { mode: 'full' },
  );
  // The first change has no snapshot behind it: a bulk change (the engine prepares its snapshot beside the tool).
  const first = [...exec.calls];
  exec.calls.length = 0;
  return { engine, exec, first };
}

describe('iptables backend: the tools one command runs', () => {
  it('a DNAT add: one nat-table restore, prestartable, nothing listed', async () => {
    const { engine, exec } = await setUp();
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(40001)), { guarded: true, qos: false });
    expect(exec.calls.map(cmd)).toEqual([RESTORE]);
    expect(exec.calls[0]!.prestartable).toBe(true);
    expect(exec.calls[0]!.input).toMatch(/^\*nat\n-A SHARED_DNAT .*172\.20\.0\.10.*--dport 40001 .*\nCOMMIT\n$/);
  });

  it('a DNAT delete: the restore, then the conntrack flush of the old translation', async () => {
    const { engine, exec } = await setUp();
    await engine.transact(({ state }) => Ops.delDnat(state, { eip: EIP, port: 1007, protocol: 'tcp' }), { guarded: true, qos: false });
    expect(exec.calls.map(cmd)).toEqual([RESTORE, 'conntrack -D --orig-dst 172.20.0.10 -p tcp --orig-port-dst 1007']);
    expect(exec.calls[0]!.input).toMatch(/^\*nat\n-D SHARED_DNAT .*--dport 1007 .*\nCOMMIT\n$/);
  });

  it('a SNAT add and delete, a FIP add: one restore each', async () => {
    const { engine, exec } = await setUp();
    const snat = { eip: EIP, cidr: '10.250.1.0/24', randomFully: false };
    await engine.transact(({ state }) => Ops.addSnat(state, snat), { guarded: true, qos: false });
    await engine.transact(({ state }) => Ops.delSnat(state, snat), { guarded: true, qos: false });
    await engine.transact(({ state }) => Ops.addFip(state, { eip: '172.20.0.11', internalIp: '10.0.9.9' }), { guarded: true, qos: false });
    expect(exec.calls.map(cmd)).toEqual([RESTORE, RESTORE, RESTORE]);
    expect(exec.calls.every((r) => r.prestartable === true)).toBe(true);
  });

  it("a bulk change: the accounting table's nft -f starts after the NAT restore, not before its render", async () => {
    const { first } = await setUp();
    const restore = first.findIndex((c) => cmd(c) === RESTORE && /\*nat/.test(c.input ?? ''));
    const acct = first.findIndex((c) => cmd(c) === 'nft -f -' && /natgw_acct/.test(c.input ?? ''));
    expect(restore).toBeGreaterThanOrEqual(0);
    expect(acct).toBeGreaterThan(restore);
  });
});
