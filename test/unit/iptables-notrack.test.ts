/**
 * The iptables raw table's notrack chain (src/dataplane/netfilter/notrack.ts): the shim
 * listener's loopback connections kept out of conntrack. Its exact save form, the plan from an
 * empty table and the repair of a rule deleted by hand, its removal, and a kernel that refuses
 * the raw table (no table, no CT target): the NAT is applied all the same, a warning logged once.
 */
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { IptablesBackend } from '../../src/dataplane/netfilter/iptables/backend.js';
import { desiredTables, planTable, renderRestore, tablesOf } from '../../src/dataplane/netfilter/iptables/plan.js';
import { emptyTable, parseSave } from '../../src/dataplane/netfilter/iptables/save.js';
import { RecordingExecutor } from '../../src/system/exec.js';
import { FakeIptables } from '../helpers/fakeIptables.js';

const WANT: NatTables = {
  vpcIf: 'eth0',
  extIf: 'net1',
  eips: ['172.20.0.10'],
  snats: [{ eip: '172.20.0.10', cidr: '10.0.1.0/24', randomFully: true }],
  dnats: [{ eip: '172.20.0.10', port: 80, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8080 }],
  fips: [],
};
const RULES = ['-d 127.78.71.87/32 -j CT --notrack', '-s 127.78.71.87/32 -j CT --notrack'];
const TOOL = 'iptables-nft';

/** A log that keeps its warnings. */
function warnings(): { log: pino.Logger; lines: string[] } {
  const lines: string[] = [];
  const log = pino({ level: 'warn' }, { write: (s: string) => lines.push(s) });
  return { log, lines };
}

function backend(ipt: FakeIptables, log?: pino.Logger): { b: IptablesBackend; exec: RecordingExecutor } {
  const exec = new RecordingExecutor((r) => ipt.answer(r));
  return { b: new IptablesBackend(exec, 'nft', log), exec };
}

describe('the notrack chain in the raw table', () => {
  it('is one chain of two rules, jumped to from raw OUTPUT, for IPv4 only', () => {
    const raw = desiredTables(WANT).raw;
    expect([...raw.owned]).toEqual([['NATGW_NOTRACK', RULES]]);
    expect([...raw.jumps]).toEqual([['OUTPUT', '-j NATGW_NOTRACK']]);
    expect(tablesOf(4)).toEqual(['nat', 'mangle', 'raw']);
    expect(tablesOf(6)).toEqual(['nat', 'mangle']);
    expect(renderRestore('raw', planTable(emptyTable, raw))).toBe(
      '*raw\n:NATGW_NOTRACK - [0:0]\n-A NATGW_NOTRACK -d 127.78.71.87/32 -j CT --notrack\n-A NATGW_NOTRACK -s 127.78.71.87/32 -j CT --notrack\n-A OUTPUT -j NATGW_NOTRACK\nCOMMIT\n',
    );
  });

  it('plans nothing against real iptables-save output of itself, and puts back a rule deleted by hand', () => {
    // iptables-nft-save v1.8.9 -t raw, as the kernel listed the chain natgw wrote.
    const saved = parseSave(
      '*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:NATGW_NOTRACK - [0:0]\n-A OUTPUT -j NATGW_NOTRACK\n' +
        '-A NATGW_NOTRACK -d 127.78.71.87/32 -j CT --notrack\n-A NATGW_NOTRACK -s 127.78.71.87/32 -j CT --notrack\nCOMMIT\n',
    );
    const raw = desiredTables(WANT).raw;
    expect(planTable(saved, raw)).toEqual({ lines: [], changes: 0 });
    const deleted = { ...saved, rules: new Map([...saved.rules, ['NATGW_NOTRACK', [RULES[1] as string]]]) };
    expect(planTable(deleted, raw).lines).toEqual([`-I NATGW_NOTRACK 1 ${RULES[0]}`]);
    const noJump = { ...saved, rules: new Map([...saved.rules, ['OUTPUT', []]]) };
    expect(planTable(noJump, raw).lines).toEqual(['-A OUTPUT -j NATGW_NOTRACK']);
  });

  it('a full sync creates it, a partial sync leaves it, a full sync repairs it, removeAll takes it', async () => {
    const ipt = new FakeIptables();
    const { b, exec } = backend(ipt);
    const first = await b.sync(WANT);
    expect(first.script).toContain('*raw\n:NATGW_NOTRACK - [0:0]\n');
    expect(ipt.rules(TOOL, 'raw', 'NATGW_NOTRACK')).toEqual(RULES);
    expect(ipt.rules(TOOL, 'raw', 'OUTPUT')).toEqual(['-j NATGW_NOTRACK']);

    // A command: nothing read back, nothing written to raw.
    exec.calls.length = 0;
    await b.sync({ ...WANT, dnats: [] }, { mode: 'partial' });
    expect(exec.calls.map((c) => c.file)).toEqual(['iptables-nft-restore']);
    expect(exec.calls[0]?.input).not.toContain('*raw');

    // Deleted by hand: the next full sync puts it back, and only it.
    ipt.answer({ file: 'iptables-nft-restore', args: ['--noflush'], input: '*raw\n-D NATGW_NOTRACK 1\nCOMMIT\n' });
    expect(ipt.rules(TOOL, 'raw', 'NATGW_NOTRACK')).toEqual([RULES[1]]);
    const repair = await b.sync({ ...WANT, dnats: [] });
    expect(repair).toEqual({ changes: 1, script: `*raw\n-I NATGW_NOTRACK 1 ${RULES[0]}\nCOMMIT\n` });
    expect(ipt.rules(TOOL, 'raw', 'NATGW_NOTRACK')).toEqual(RULES);

    await b.removeAll();
    expect(ipt.rules(TOOL, 'raw', 'NATGW_NOTRACK')).toBeUndefined();
    expect(ipt.rules(TOOL, 'raw', 'OUTPUT')).toEqual([]);
  });

  it('a kernel that refuses the raw table keeps the NAT, warns once, and commands do not try again', async () => {
    const ipt = new FakeIptables();
    ipt.fault = (input) =>
      input.startsWith('*raw') && !input.includes('-X') ? "iptables-nft-restore v1.8.9 (nf_tables): Couldn't load target `CT'" : undefined;
    const { log, lines } = warnings();
    const { b, exec } = backend(ipt, log);
    const report = await b.sync(WANT);
    // The NAT is in; the raw part is neither counted nor reported as applied.
    expect(ipt.rules(TOOL, 'nat', 'SHARED_DNAT')).toEqual(['-d 172.20.0.10/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.1.6:8080']);
    expect(ipt.rules(TOOL, 'raw', 'NATGW_NOTRACK')).toBeUndefined();
    expect(report.script).not.toContain('*raw');
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0] as string)).toMatchObject({ level: 40, msg: expect.stringContaining("the shim's loopback connections stay tracked") });

    exec.calls.length = 0;
    await b.sync({ ...WANT, dnats: [] }, { mode: 'partial' });
    expect(exec.calls.map((c) => c.file)).toEqual(['iptables-nft-restore']);
    expect(exec.calls[0]?.input).not.toContain('*raw');

    // A full sync tries again (the kernel may have gained the module), and logs no second warning.
    await b.sync({ ...WANT, dnats: [] });
    expect(exec.calls.filter((c) => c.input?.startsWith('*raw'))).toHaveLength(1);
    expect(lines).toHaveLength(1);
  });

  it('goes in with nat and mangle in one run, raw first, and the dry run shows that order', async () => {
    const ipt = new FakeIptables();
    const { b, exec } = backend(ipt);
    const dry = await b.sync(WANT, { dryRun: true });
    exec.calls.length = 0;
    const first = await b.sync(WANT);
    const runs = exec.calls.filter((c) => c.file === 'iptables-nft-restore');
    expect(runs).toHaveLength(1);
    expect(runs[0]?.input).toBe(first.script);
    expect(first.script).toBe(dry.script);
    expect(first.script.indexOf('*raw')).toBe(0);
    expect(first.script.indexOf('*nat')).toBeGreaterThan(0);
    expect(ipt.rules(TOOL, 'raw', 'NATGW_NOTRACK')).toEqual(RULES);
    expect(ipt.rules(TOOL, 'nat', 'SHARED_DNAT')).toHaveLength(1);
  });

  it('a refusal of nat after raw committed is thrown, and the NAT is not run a second time', async () => {
    const ipt = new FakeIptables();
    ipt.commitFault = (table) => (table === 'nat' ? 'Invalid argument' : undefined);
    const { log, lines } = warnings();
    const { b, exec } = backend(ipt, log);
    await expect(b.sync(WANT)).rejects.toThrow(/refused the raw and nat and mangle table transactions: .*line \d+ failed: Invalid argument/);
    // raw committed before nat's COMMIT refused: in the kernel, and no warning about it.
    expect(ipt.rules(TOOL, 'raw', 'NATGW_NOTRACK')).toEqual(RULES);
    expect(ipt.rules(TOOL, 'nat', 'SHARED_DNAT')).toBeUndefined();
    expect(exec.calls.filter((c) => c.file === 'iptables-nft-restore')).toHaveLength(1);
    expect(lines).toHaveLength(0);
    // The engine's retry is a full sync: it reads back, and finds raw needs nothing.
    ipt.commitFault = undefined;
    exec.calls.length = 0;
    const retry = await b.sync(WANT);
    expect(retry.script).not.toContain('*raw');
    expect(ipt.rules(TOOL, 'nat', 'SHARED_DNAT')).toHaveLength(1);
  });

  it('a refusal of raw itself leaves nothing half-done: the NAT then goes in alone', async () => {
    const ipt = new FakeIptables();
    ipt.commitFault = (table) => (table === 'raw' ? 'No such file or directory' : undefined);
    const { log, lines } = warnings();
    const { b, exec } = backend(ipt, log);
    const report = await b.sync(WANT);
    const runs = exec.calls.filter((c) => c.file === 'iptables-nft-restore').map((c) => c.input ?? '');
    expect(runs).toHaveLength(2);
    expect(runs[0]?.startsWith('*raw')).toBe(true);
    expect(runs[1]?.startsWith('*nat')).toBe(true);
    expect(report.script).toBe(runs[1]);
    expect(ipt.rules(TOOL, 'raw', 'NATGW_NOTRACK')).toBeUndefined();
    expect(ipt.rules(TOOL, 'nat', 'SHARED_DNAT')).toHaveLength(1);
    expect(lines).toHaveLength(1);
    // The warning names what was refused: raw's transaction, not the NAT it ran with.
    expect(JSON.parse(lines[0] as string).err).toMatch(/^Error: iptables-nft-restore --noflush --wait refused the raw table transaction: .*No such file or directory/);
  });

  it('a raw table that cannot be read is left alone: the sync of nat and mangle goes on', async () => {
    const ipt = new FakeIptables();
    const exec = new RecordingExecutor((r) =>
      r.file === 'iptables-nft-save' && r.args.includes('raw') ? { exitCode: 1, stderr: "iptables-nft-save: table 'raw' does not exist\n" } : ipt.answer(r),
    );
    const { log, lines } = warnings();
    const b = new IptablesBackend(exec, 'nft', log);
    await b.sync(WANT);
    expect(ipt.rules(TOOL, 'nat', 'SNAT_FILTER')).toHaveLength(3);
    expect(exec.calls.some((c) => c.input?.includes('*raw'))).toBe(false);
    expect(lines).toHaveLength(1);
    await b.removeAll();
    expect(ipt.rules(TOOL, 'nat', 'SNAT_FILTER')).toBeUndefined();
  });
});
