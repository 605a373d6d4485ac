import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { QosManager } from '../../src/dataplane/qos/manager.js';
import { SystemError } from '../../src/model/errors.js';
import type { EipQos, GwQos } from '../../src/model/qos.js';
import { addEipQos, addGwQos } from '../../src/state/qosOperations.js';
import { emptyState, type DesiredState } from '../../src/state/state.js';
import type { ExecRequest, ExecResult } from '../../src/system/exec.js';
import { RecordingExecutor } from '../helpers/execCalls.js';
import { answerQosRead } from '../helpers/tcFixtures.js';

/** A fake kernel: answers natgw's reads, refuses fq_codel and matchall like the dev machines. */
function fakeKernel(opts: { links?: string[]; qdiscs?: string[]; fail?: (req: ExecRequest) => Partial<ExecResult> | undefined } = {}) {
  const listing = {
    'ip -j link show': JSON.stringify((opts.links ?? ['lo', 'net1', 'eth0']).map((ifname) => ({ ifname, flags: ['UP'] }))),
    'tc qdisc show': (opts.qdiscs ?? ['qdisc noqueue 0: dev net1 root refcnt 2 ']).map((l) => `${l}\n`).join(''),
  };
  return new RecordingExecutor((req) => {
    const cmd = [req.file, ...req.args].join(' ');
    const failed = opts.fail?.(req);
    if (failed) return failed;
    const read = answerQosRead(req, listing);
    if (read) return read;
    if (/ fq_codel$/.test(cmd) && cmd.includes('ngprobe')) return { exitCode: 2, stderr: 'Error: Specified qdisc kind is unknown.\n' };
    if (cmd.includes(' matchall ') && cmd.includes('ngprobe')) return { exitCode: 2, stderr: 'Error: TC classifier not found.\n' };
    return undefined;
  });
}

const eip = (ip: string, over: Partial<EipQos> = {}): EipQos => ({ direction: 'egress', ip, priority: 1, rate: '10', burst: '1', ...over });
const state = (eips: EipQos[], gws: GwQos[] = []): DesiredState => {
  let s = emptyState('eth0', 'net1');
  for (const q of eips) s = addEipQos(s, q).state;
  for (const q of gws) s = addGwQos(s, q).state;
  return s;
};
const isRead = (c: ExecRequest): boolean => c.args.includes('show') || c.args.join(' ') === '-d -raw -batch -';
const mutations = (x: RecordingExecutor) =>
  x.calls.filter((c) => !(isRead(c) || c.args.join(' ').includes('ngprobe'))).map((c) => [c.file, ...c.args].join(' '));

describe('QosManager', () => {
  it('reads, probes once, and applies the plan as one tc batch on stdin', async () => {
    const x = fakeKernel();
    const out: string[] = [];
    const m = new QosManager(x, undefined, (l) => out.push(l));
    const s = state([eip('1.2.3.4')]);
    const r = await m.sync(s);

    const batch = x.calls.find((c) => c.file === 'tc' && c.args.join(' ') === '-batch -');
    expect(batch?.input).toBe(
      [
        'qdisc replace dev net1 root handle 1: htb default 0x9999',
        'class add dev net1 parent 1: classid 1:0x9999 htb rate 10000mbit ceil 10000mbit',
        `class add dev net1 parent 1: classid 1:0x${s.eipQos[0]!.classId!.toString(16)} htb rate 10mbit ceil 10mbit burst 1048576 cburst 1048576`,
        `filter add dev net1 parent 1: protocol ip prio 1 handle ::0x1 u32 match ip src 1.2.3.4/32 flowid 1:0x${s.eipQos[0]!.classId!.toString(16)}`,
        '',
      ].join('\n'),
    );
    expect(r.changes).toBe(4);
    expect(r.commands[0]).toBe('tc qdisc replace dev net1 root handle 1: htb default 0x9999');
    expect(out).toEqual([
      'INFO: QoS kernel probe: no fq_codel (classes keep the kernel default leaf); no matchall (a u32 "match u32 0 0" filter stands in at the same priority)',
    ]);
    expect(r.notes).toEqual(out);
    // The probe device is created and removed again.
    const probe = x.calls.filter((c) => c.args.join(' ').includes('ngprobe'));
    expect(probe[0]!.args.slice(0, 2)).toEqual(['link', 'add']);
    expect(probe.at(-1)!.args.slice(0, 2)).toEqual(['link', 'del']);

    await m.sync(s);
    expect(x.calls.filter((c) => c.args.join(' ').includes('ngprobe')).length).toBe(probe.length);
    expect(out).toHaveLength(1);
  });

  it('does not probe or touch anything when there is nothing to shape', async () => {
    const x = fakeKernel();
    const r = await new QosManager(x).sync(state([]));
    expect(r).toEqual({ changes: 0, notes: [], commands: [] });
    expect(mutations(x)).toEqual([]);
    expect(x.calls.some((c) => c.args.join(' ').includes('ngprobe'))).toBe(false);
  });

  it('a dry run reads and renders but changes nothing (and does not probe)', async () => {
    const x = fakeKernel();
    const r = await new QosManager(x).sync(state([eip('1.2.3.4', { direction: 'ingress' })]), { dryRun: true });
    expect(r.commands).toContain('ip link add ifb-net1 type ifb');
    expect(r.commands.some((c) => c.includes('fq_codel'))).toBe(true);
    expect(r.notes[0]).toMatch(/not probed in a dry run/);
    expect(mutations(x)).toEqual([]);
    expect(x.calls.some((c) => c.args.join(' ').includes('ngprobe'))).toBe(false);
  });

  it('applies what it can and then reports a missing device as an error', async () => {
    const x = fakeKernel();
    const s = state(
      [eip('1.2.3.4')],
      [
        {
          direction: 'egress',
          dev: 'eth7',
          priority: 2,
          classifier: 'matchall',
          matchType: '',
          matchDirection: '',
          cidr: '',
          rate: '1',
          burst: '1',
        },
      ],
    );
    await expect(new QosManager(x).sync(s)).rejects.toThrow(new SystemError('Error: QoS device not found: eth7'));
    expect(x.calls.find((c) => c.args[0] === '-batch')?.input).toContain('dev net1');
  });

  it("a tc failure is a SystemError naming the kernel's complaint, without tc's Warning lines", async () => {
    const x = fakeKernel({
      fail: (req) =>
        req.args[0] === '-batch'
          ? { exitCode: 1, stderr: 'Warning: sch_htb: quantum of class 19999 is big.\nError: Exclusivity flag on, cannot modify.\nCommand failed -:1\n' }
          : undefined,
    });
    const err = await new QosManager(x).sync(state([eip('1.2.3.4')])).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SystemError);
    expect((err as SystemError).message).toBe('Error: tc -batch - refused the QoS change: Error: Exclusivity flag on, cannot modify.; Command failed -:1');
  });

  it('refuses to plan from a failed or unreadable read of the qdiscs (it would replace roots it owns)', async () => {
    const x = fakeKernel({ fail: (req) => (req.args.join(' ') === 'qdisc show' ? { exitCode: 1, stderr: 'boom' } : undefined) });
    await expect(new QosManager(x).sync(state([eip('1.2.3.4')]))).rejects.toBeInstanceOf(SystemError);
    expect(mutations(x)).toEqual([]);
    const y = fakeKernel({ fail: (req) => (req.args.join(' ') === 'qdisc show' ? { stdout: 'qdisc htb 1: somewhere\n' } : undefined) });
    await expect(new QosManager(y).sync(state([eip('1.2.3.4')]))).rejects.toThrow(/^Error: tc qdisc show printed what natgw cannot read/);
    expect(mutations(y)).toEqual([]);
  });

  it('refuses to plan from a device listing that failed where the device exists (it would replace its root)', async () => {
    const x = fakeKernel({
      fail: (req) => (req.args.join(' ') === '-d -raw -batch -' ? { exitCode: 2, stderr: 'RTNETLINK answers: Operation not permitted\n' } : undefined),
    });
    await expect(new QosManager(x).sync(state([eip('1.2.3.4')]), { mode: 'partial' })).rejects.toBeInstanceOf(SystemError);
    expect(x.calls.map((c) => [c.file, ...c.args].join(' '))).toContain('ip -j link show');
    expect(mutations(x)).toEqual([]);
  });

  it("readBack reads EXT, the given devices, their IFBs and devices carrying natgw's layout", async () => {
    const x = fakeKernel({
      links: ['net1', 'ifb-net1', 'eth3', 'eth4'],
      qdiscs: ['qdisc htb 1: dev eth4 root refcnt 2 r2q 10 default 0x9999 direct_packets_stat 0 direct_qlen 1000'],
    });
    await new QosManager(x).readBack('net1', ['eth3']);
    const shown = x.calls
      .flatMap((c) => (c.input ?? '').split('\n'))
      .filter((l) => l.startsWith('class show dev '))
      .map((l) => l.split(' ').at(-1))
      .sort();
    // ifb-eth3 and ifb-eth4 do not exist: they are not listed.
    expect(shown).toEqual(['eth3', 'eth4', 'ifb-net1', 'net1']);
  });
});

describe('QosManager: the intent record', () => {
  const tmp = () => mkdtempSync(path.join(tmpdir(), 'natgw-qos-intent-'));
  const read = (file: string) => (existsSync(file) ? (JSON.parse(readFileSync(file, 'utf8')) as { pieces: unknown[] }).pieces : []);

  it('lists the probe device before it exists and the shared pieces before tc runs; settles once the state is persisted', async () => {
    const dir = tmp();
    const file = path.join(dir, 'qos-intent.json');
    const seen: Record<string, unknown[]> = {};
    const x = fakeKernel({
      fail: (req) => {
        const cmd = [req.file, ...req.args].join(' ');
        if (cmd.startsWith('ip link add ngprobe')) seen.probe = read(file);
        if (cmd === 'ip link add ifb-net1 type ifb') seen.ifb = read(file);
        return undefined;
      },
    });
    const m = new QosManager(x, undefined, undefined, file);
    const s = state([eip('1.2.3.4', { direction: 'ingress' }), eip('1.2.3.5')]);
    await m.sync(s);
    expect(seen.probe).toEqual([{ kind: 'ifb', dev: expect.stringMatching(/^ngprobe[0-9a-f]{8}$/) }]);
    expect(seen.ifb).toEqual(
      expect.arrayContaining([
        { kind: 'ifb', dev: 'ifb-net1' },
        { kind: 'ingress', dev: 'net1' },
        { kind: 'redirect', dev: 'net1' },
        { kind: 'root', dev: 'net1' },
        { kind: 'root', dev: 'ifb-net1' },
      ]),
    );
    expect(await m.hasPending()).toBe(true);
    // Another state than the one synced is not what the pieces were made for: nothing settles.
    await m.settle(state([eip('1.2.3.4', { direction: 'ingress' })]));
    expect(read(file)).not.toEqual([]);
    await m.settle(s);
    expect(read(file)).toEqual([]);
    expect(await m.hasPending()).toBe(false);
    rmSync(dir, { recursive: true, force: true });
  });

  it('a new process finds the record of one killed mid-change and removes what the persisted state does not need', async () => {
    const dir = tmp();
    const file = path.join(dir, 'qos-intent.json');
    writeFileSync(
      file,
      JSON.stringify({
        pieces: [
          { kind: 'ifb', dev: 'ifb-net1' },
          { kind: 'ingress', dev: 'net1' },
          { kind: 'root', dev: 'net1' },
          { kind: 'ifb', dev: 'ngprobe0badcafe' },
          // Not a piece natgw writes: never acted on.
          { kind: 'ifb', dev: 'eth0; reboot' },
          { kind: 'qdisc', dev: 'eth0' },
        ],
      }),
    );
    const x = fakeKernel({
      links: ['lo', 'net1', 'eth0', 'ifb-net1', 'ngprobe0badcafe'],
      qdiscs: [
        'qdisc htb 1: dev net1 root refcnt 2 r2q 10 default 0x9999 direct_packets_stat 0 direct_qlen 1000',
        'qdisc ingress ffff: dev net1 parent ffff:fff1 ---------------- ',
      ],
    });
    const m = new QosManager(x, undefined, undefined, file);
    const s = state([]);
    // Even a partial sync of a change that touches no rule: the record's pieces may sit on any device.
    await m.sync(s, { mode: 'partial' });
    const changes = x.calls.filter((c) => !isRead(c)).map((c) => [c.file, ...c.args].join(' '));
    expect(changes).toEqual(['tc -batch -', 'ip link del ifb-net1', 'ip link del ngprobe0badcafe']);
    expect(x.calls.find((c) => c.file === 'tc' && c.args[0] === '-batch')?.input).toBe('qdisc del dev net1 ingress\nqdisc del dev net1 root\n');
    await m.settle(s);
    expect(read(file)).toEqual([]);
    rmSync(dir, { recursive: true, force: true });
  });
});
