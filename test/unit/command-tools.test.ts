/**
 * The tools a command runs on the iptables backend, counted with the recording executor: after
 * a full sync, each command runs exactly one `iptables-restore --noflush` for the one table it
 * changes (none for the other family or the other table, no listing); a DNAT or FIP
 * delete adds its conntrack flush, nothing else. Where the executor reads the kernel's own
 * files, a DNAT or FIP delete in a namespace that tracks nothing reads one small file (the entry
 * count) and runs no conntrack at all; no other command reads anything.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config/config.js';
import { Engine } from '../../src/engine/engine.js';
import * as Ops from '../../src/state/operations.js';
import { cmd, RecordingExecutor } from '../helpers/execCalls.js';
import type { Dnat } from '../../src/model/rules.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

const EIP = '172.20.0.10';
const dnat = (port: number): Dnat => ({ eip: EIP, port, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8080 });
const RESTORE = 'iptables-legacy-restore --noflush --wait';

/** /proc/net/stat/nf_conntrack of a namespace holding `entries` entries (two CPUs). */
const stat = (entries: number): string =>
  `entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n${`${entries.toString(16).padStart(8, '0')}  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000  00000000 00000000 00000000 00000000\n`.repeat(2)}`;

async function setUp(kernelFiles?: (path: string) => string | undefined) {
  const dir = mkdtempSync(path.join(tmpdir(), 'natgw-cmdtools-'));
  dirs.push(dir);
  const config = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'none.env'), NATGW_STATE_DIR: dir, GATEWAY_NETFILTER_MODE: 'iptables' });
  // An empty kernel: no nft table of natgw's, every iptables listing empty, every transaction taken.
  const recorder = new RecordingExecutor((r) =>
    r.file === 'nft' && r.args.includes('list') ? { exitCode: 1, stderr: 'Error: No such file or directory' } : undefined,
  );
  const reads: string[] = [];
  const exec = kernelFiles
    ? Object.assign(recorder, {
        readKernelFile: async (p: string) => {
          reads.push(p);
          return kernelFiles(p);
        },
      })
    : recorder;
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
  reads.length = 0;
  return { engine, exec, first, reads };
}

describe('iptables backend: the tools one command runs', () => {
  it('a DNAT add: one nat-table restore, nothing listed', async () => {
    const { engine, exec } = await setUp();
    await engine.transact(({ state }) => Ops.addDnat(state, dnat(40001)), { guarded: true, qos: false });
    expect(exec.calls.map(cmd)).toEqual([RESTORE]);
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
  });

  it('with the kernel files readable and nothing tracked: each command one restore; a DNAT or FIP delete reads the entry count only', async () => {
    const { engine, exec, reads } = await setUp((p) => (p === '/proc/net/stat/nf_conntrack' ? stat(0) : undefined));
    const snat = { eip: EIP, cidr: '10.250.1.0/24', randomFully: false };
    const fip = { eip: '172.20.0.11', internalIp: '10.0.9.9' };
    const steps: Array<[string, Parameters<Engine['transact']>[0]]> = [
      ['dnat-add', ({ state }) => Ops.addDnat(state, dnat(40001))],
      ['dnat-del', ({ state }) => Ops.delDnat(state, { eip: EIP, port: 40001, protocol: 'tcp' })],
      ['snat-add', ({ state }) => Ops.addSnat(state, snat)],
      ['snat-del', ({ state }) => Ops.delSnat(state, snat)],
      ['fip-add', ({ state }) => Ops.addFip(state, fip)],
      ['fip-del', ({ state }) => Ops.delFip(state, fip.eip)],
    ];
    const seen: Record<string, { tools: string[]; reads: string[] }> = {};
    for (const [name, op] of steps) {
      await engine.transact(op, { guarded: true, qos: false });
      seen[name] = { tools: exec.calls.splice(0).map(cmd), reads: reads.splice(0) };
    }
    const count = ['/proc/net/stat/nf_conntrack'];
    expect(seen).toEqual({
      'dnat-add': { tools: [RESTORE], reads: [] },
      'dnat-del': { tools: [RESTORE], reads: count },
      'snat-add': { tools: [RESTORE], reads: [] },
      'snat-del': { tools: [RESTORE], reads: [] },
      'fip-add': { tools: [RESTORE], reads: [] },
      'fip-del': { tools: [RESTORE], reads: count },
    });
  });

  it("an EIP add: the NAT restore and the accounting table's listing and nft -f, then the addresses read and changed", async () => {
    const { engine, exec } = await setUp();
    await engine.transact(({ state }) => Ops.addEip(state, { address: '172.20.0.12', prefixLength: 24 }, {}), { guarded: true, qos: false });
    const tools = exec.calls.map(cmd);
    expect(tools.slice(0, 3).sort()).toEqual([RESTORE, 'nft -j list table inet natgw_acct', 'nft -f -'].sort());
    expect(tools.slice(3, 5).sort()).toEqual(['ip -6 -j -batch -', 'ip -j -batch -']);
    expect(tools.slice(5)).toEqual(['ip -batch -']);
    expect(exec.calls.find((c) => cmd(c) === 'nft -f -')!.input).toMatch(/^add element inet natgw_acct eip_rx4 \{ 172\.20\.0\.12 \}$/m);
  });
});
