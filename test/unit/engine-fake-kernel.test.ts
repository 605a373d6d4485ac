/**
 * The engine against a fake kernel: nftables is the in-memory FakeNftClient (proven against the
 * kernel by test/netns/fake-nft-faithful.test.ts), iptables a small fake behind the recording
 * executor, `ip` and `tc` recorded and answered empty. What the engine leaves in the fake is
 * what it would leave in the kernel, so these tests assert on tables, not on scripts.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config/config.js';
import { Engine, type SyncEvent } from '../../src/engine/engine.js';
import { ACCT_TABLE } from '../../src/dataplane/eipCounters.js';
import { NftTransaction } from '../../src/dataplane/netfilter/nft/transaction.js';
import { shareDnatChainName } from '../../src/model/shareDnatName.js';
import { CHAINS } from '../../src/dataplane/netfilter/iptables/ruleText.js';
import type { Dnat, Fip, ShareDnat, Snat } from '../../src/model/rules.js';
import * as Ops from '../../src/state/operations.js';
import type { ExecRequest } from '../../src/system/exec.js';
import { RecordingExecutor } from '../helpers/execCalls.js';
import { FakeIptables } from '../helpers/fakeIptables.js';
import { FakeNftClient } from '../helpers/fakeNft.js';
import { tableView } from '../helpers/nftDump.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

const cmd = (r: ExecRequest): string => [r.file, ...r.args].join(' ');

const DNAT: Dnat = { eip: '172.20.0.10', port: 80, protocol: 'tcp', internalIp: '10.0.1.7', internalPort: 8080 };
const DNAT2: Dnat = { eip: '172.20.0.10', port: 53, protocol: 'udp', internalIp: '10.0.1.8', internalPort: 53 };
const FIP: Fip = { eip: '172.20.0.20', internalIp: '10.0.1.6' };
const SNAT: Snat = { eip: '172.20.0.10', cidr: '10.0.1.0/24', randomFully: true };
const SHARE: ShareDnat = {
  eip: '172.20.0.10',
  port: 8443,
  protocol: 'tcp',
  protocolText: 'tcp',
  backends: [
    { ip: '10.0.1.6', port: 443 },
    { ip: '10.0.1.7', port: 443 },
  ],
};

/** One fake kernel (nft, iptables, and the order in which the two were written) shared by every engine of a test. */
class FakeKernel {
  readonly nft = new FakeNftClient();
  readonly ipt = new FakeIptables();
  /** Writes to either fake, in order, refused ones too: `nft <script>` or `<restore tool> <input>`, `!` when refused. */
  readonly writes: string[] = [];
  readonly exec = new RecordingExecutor((r) => {
    const a = this.ipt.answer(r);
    if (r.file.endsWith('-restore')) this.writes.push(`${a?.exitCode ? '!' : ''}${r.file} ${r.input ?? ''}`);
    return a;
  });

  constructor() {
    const run = this.nft.run.bind(this.nft);
    this.nft.run = async (tx) => {
      const script = typeof tx === 'string' ? tx : tx.text();
      try {
        await run(tx);
      } catch (e) {
        this.writes.push(`!nft ${script}`);
        throw e;
      }
      this.writes.push(`nft ${script}`);
    };
  }

  async engine(dir: string, env: Record<string, string>): Promise<{ engine: Engine; events: SyncEvent[] }> {
    const config = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'none.env'), NATGW_STATE_DIR: dir, ...env });
    const engine = new Engine({ config, exec: this.exec, log: pino({ level: 'silent' }), nft: this.nft });
    const events: SyncEvent[] = [];
    engine.onSync((e) => events.push(e));
    return { engine, events };
  }
}

const NFT = { GATEWAY_NETFILTER_MODE: 'nftables' };
const IPT = { GATEWAY_NETFILTER_MODE: 'iptables', NATGW_IPTABLES_VARIANT: 'nft' };

function stateDir(): string {
  const dir = mkdtempSync(path.join(tmpdir(), 'natgw-fakekernel-'));
  dirs.push(dir);
  return dir;
}

/** init, then one command per kind of object, as the controller would send them. */
async function populate(engine: Engine): Promise<void> {
  await engine.transact(({ state }) => ({ state: { ...state, initialized: true }, effects: [] }), { mode: 'full' });
  const gw = { v4: '172.20.0.1' };
  await engine.transact(({ state }) => Ops.addEip(state, { address: '172.20.0.10', prefixLength: 24 }, gw), { guarded: true });
  await engine.transact(({ state }) => Ops.addEip(state, { address: '172.20.0.20', prefixLength: 24 }, gw), { guarded: true });
  await engine.transact(({ state }) => Ops.addDnat(state, DNAT), { guarded: true });
  await engine.transact(({ state }) => Ops.addFip(state, FIP), { guarded: true });
  await engine.transact(({ state }) => Ops.addSnat(state, SNAT), { guarded: true });
  await engine.transact(({ state }) => Ops.addShareDnat(state, SHARE), { guarded: true });
}

const rules = (view: ReturnType<typeof tableView>, chain: string) => view?.chains.find((c) => c.name === chain)?.rules.map((r) => r.rule);
const elements = (view: ReturnType<typeof tableView>, set: string) => view?.sets.find((s) => s.name === set)?.elements;

/** natgw's NAT objects in nftables: what the kernel holds after `populate`. */
function expectNatgwNft(nft: FakeNftClient): void {
  const t = tableView(nft.dump('ip', 'natgw'));
  expect(t?.chains.map((c) => [c.name, c.base])).toEqual([
    ['vpc_mark', 'filter prerouting -150 accept'],
    ['prerouting', 'nat prerouting -100 accept'],
    ['postrouting', 'nat postrouting 100 accept'],
    ['shared_snat', undefined],
  ]);
  expect(rules(t, 'vpc_mark')).toEqual([JSON.stringify({ kind: 'vpc-mark', vpcIf: 'eth0' })]);
  expect(rules(t, 'prerouting')).toEqual(['fip-dnat', 'port-dnat'].map((kind) => JSON.stringify({ kind })));
  expect(rules(t, 'postrouting')).toEqual([
    JSON.stringify({ kind: 'fip-snat' }),
    JSON.stringify({ kind: 'snat-jump', extIf: 'net1' }),
    JSON.stringify({ kind: 'hairpin', vpcIf: 'eth0' }),
  ]);
  // The one SNAT (one EIP, --random-fully) is an element of its length's fully-random data map: no chain of its own.
  expect(rules(t, 'shared_snat')).toEqual((['chain', 'eip', 'eip-fr'] as const).map((via) => JSON.stringify({ kind: 'snat-dispatch', len: 24, via })));
  expect(elements(t, 'snat_to_fr_len_24')).toEqual(['10.0.1.0 : 172.20.0.10']);
  expect(elements(t, 'snat_to_len_24')).toEqual([]);
  expect(elements(t, 'snat_len_24')).toEqual([]);
  expect(elements(t, 'fip_dnat')).toEqual(['172.20.0.20 : 10.0.1.6']);
  expect(elements(t, 'fip_snat')).toEqual(['10.0.1.6 : 172.20.0.20']);
  expect(elements(t, 'port_dnat')).toEqual(['172.20.0.10 . tcp . 80 : 10.0.1.7 . 8080']);
  expect(elements(t, 'hairpin_eips')).toEqual(['172.20.0.10', '172.20.0.20']);
  expect(nft.dump('ip6', 'natgw')).toBeNull();
}

describe('engine on a fake kernel (nftables)', () => {
  it("init and one command of each kind leave exactly natgw's objects; a full resync then finds nothing to change", async () => {
    const k = new FakeKernel();
    const { engine } = await k.engine(stateDir(), NFT);
    await populate(engine);

    expectNatgwNft(k.nft);
    const acct = tableView(k.nft.dump('inet', ACCT_TABLE));
    expect(acct?.sets.map((s) => [s.name, s.decl, s.elements])).toEqual([
      ['eip_rx4', 'set ipv4_addr counter', ['172.20.0.10', '172.20.0.20']],
      ['eip_tx4', 'set ipv4_addr counter', ['172.20.0.10', '172.20.0.20']],
      ['eip_rx6', 'set ipv6_addr counter', []],
      ['eip_tx6', 'set ipv6_addr counter', []],
    ]);
    expect(acct?.chains.map((c) => c.rules.map((r) => r.rule))).toEqual([
      ['ip daddr @eip_rx4', 'ip6 daddr @eip_rx6'],
      ['ip saddr @eip_tx4', 'ip6 saddr @eip_tx6'],
    ]);
    const share = tableView(k.nft.dump('ip', 'kube-ovn'));
    expect(share?.chains.map((c) => [c.name, c.rules.map((r) => r.rule)])).toEqual([
      ['prerouting', ['vmap']],
      [shareDnatChainName(SHARE), [JSON.stringify({ protocol: 'tcp', backends: SHARE.backends })]],
    ]);
    expect(elements(share, 'service-ips')).toEqual([`172.20.0.10 . tcp . 8443 : goto ${shareDnatChainName(SHARE)}`]);
    expect(k.nft.tableNames().sort()).toEqual(['inet natgw_acct', 'ip kube-ovn', 'ip natgw']);

    k.nft.calls.length = 0;
    const report = await engine.resync('test');
    expect([report.netfilterChanges, report.shareDnatChanges]).toEqual([0, 0]);
    expect(k.nft.calls.filter((c) => c.kind === 'run')).toEqual([]);
    // nft is reached only through the client: no `nft` process ran.
    expect(k.exec.calls.filter((c) => c.file === 'nft').map(cmd)).toEqual([]);
  });

  it('a command after a full sync runs one transaction and lists nothing', async () => {
    const k = new FakeKernel();
    const { engine, events } = await k.engine(stateDir(), NFT);
    await populate(engine);
    k.nft.calls.length = 0;
    k.exec.calls.length = 0;

    await engine.transact(({ state }) => Ops.addDnat(state, DNAT2), { guarded: true });
    expect(k.nft.calls).toEqual([{ kind: 'run', script: 'add element ip natgw port_dnat { 172.20.0.10 . udp . 53 : 10.0.1.8 . 53 }\n' }]);
    expect(k.exec.calls.map(cmd)).toEqual([]);
    expect(events.at(-1)?.kind).toBe('partial');

    // A new EIP: the accounting table is listed and its elements ride in the NAT transaction;
    // the address goes up through `ip` (and is announced with arping): no other tool.
    k.nft.calls.length = 0;
    await engine.transact(({ state }) => Ops.addEip(state, { address: '172.20.0.30', prefixLength: 24 }, {}), { guarded: true });
    expect(k.nft.calls.map((c) => c.kind)).toEqual(['list', 'run']);
    expect(elements(tableView(k.nft.dump('inet', ACCT_TABLE)), 'eip_tx4')).toEqual(['172.20.0.10', '172.20.0.20', '172.20.0.30']);
    expect(k.exec.calls.map((c) => c.file).filter((f) => f !== 'ip' && f !== 'arping')).toEqual([]);
  });

  it('a transaction the kernel refuses is retried once as a full sync, and the command succeeds', async () => {
    const k = new FakeKernel();
    const { engine, events } = await k.engine(stateDir(), NFT);
    await populate(engine);
    await engine.transact(({ state }) => Ops.addDnat(state, DNAT2), { guarded: true });
    // Someone deletes natgw's element by hand: the partial delete of it is refused (ENOENT).
    k.nft.mutate(new NftTransaction().deleteElements({ family: 'ip', name: 'natgw' }, 'port_dnat', ['172.20.0.10 . tcp . 80']));
    k.nft.calls.length = 0;

    await engine.transact(({ state }) => Ops.delDnat(state, DNAT), { guarded: true });
    expect(events.slice(-2).map((e) => [e.kind, e.ok])).toEqual([
      ['partial', false],
      ['full', true],
    ]);
    const [refused, ...rest] = k.nft.calls;
    expect(refused).toMatchObject({ kind: 'run', refused: expect.stringMatching(/No such file or directory/) });
    expect(rest.some((c) => c.kind === 'list')).toBe(true);
    expect(elements(tableView(k.nft.dump('ip', 'natgw')), 'port_dnat')).toEqual(['172.20.0.10 . udp . 53 : 10.0.1.8 . 53']);
    expect((await engine.loadState()).dnats).toEqual([DNAT2]);
    const report = await engine.resync('test');
    expect(report.netfilterChanges).toBe(0);
  });

  it("a foreign rule in natgw's chain is removed by the next full sync, and only it", async () => {
    const k = new FakeKernel();
    const { engine } = await k.engine(stateDir(), NFT);
    await populate(engine);
    k.nft.mutate('add rule ip natgw postrouting meta l4proto tcp counter\n');
    expect(rules(tableView(k.nft.dump('ip', 'natgw')), 'postrouting')).toContain('foreign');
    const report = await engine.resync('test');
    expect(report.netfilterChanges).toBe(1);
    // `ip` answers nothing here, so the link part re-adds the addresses: only the nft lines are natgw's tables.
    expect(report.script).toMatch(/^delete rule ip natgw postrouting handle \d+\naddr /);
    expectNatgwNft(k.nft);
  });
});

describe('engine on a fake kernel: switching the netfilter backend', () => {
  const natgwChains = (k: FakeKernel): string[] =>
    Object.values(CHAINS).filter((c) => k.ipt.rules('iptables-nft', c === CHAINS.vpcMark ? 'mangle' : 'nat', c) !== undefined);

  it('iptables → nftables fills nftables first; a cleanup that fails stays pending and is retried', async () => {
    const k = new FakeKernel();
    const dir = stateDir();
    const ipt = await k.engine(dir, IPT);
    await populate(ipt.engine);
    expect(natgwChains(k).length).toBeGreaterThan(5);
    expect(k.nft.dump('ip', 'natgw')).toBeNull();
    // Another owner jumps to natgw's chain: iptables refuses to delete a chain still referenced.
    k.ipt.append('iptables-nft', 'nat', 'FOREIGN', `-j ${CHAINS.sharedSnat}`);

    const nft = await k.engine(dir, NFT);
    k.writes.length = 0;
    await nft.engine.resync('mode changed');
    expectNatgwNft(k.nft);
    const created = k.writes.findIndex((w) => w.startsWith('nft add table ip natgw'));
    const cleanup = k.writes.findIndex((w) => w.includes(`-X ${CHAINS.dnatFilter}`));
    expect(created).toBeGreaterThanOrEqual(0);
    expect(cleanup).toBeGreaterThan(created);
    // Refused (the chain is still referenced): the old chains stay, the switch is recorded as pending.
    expect(k.writes[cleanup]).toMatch(/^!iptables-nft-restore/);
    expect(natgwChains(k)).toContain(CHAINS.sharedSnat);
    expect(await nft.engine.currentBackend()).toEqual({ kind: 'nftables', pendingCleanup: { kind: 'iptables', variant: 'nft' } });

    // Still refused: still pending, and nftables keeps working meanwhile.
    await nft.engine.resync('timer');
    expect(await nft.engine.currentBackend()).toMatchObject({ pendingCleanup: { kind: 'iptables', variant: 'nft' } });
    await nft.engine.transact(({ state }) => Ops.addDnat(state, DNAT2), { guarded: true });
    expect(elements(tableView(k.nft.dump('ip', 'natgw')), 'port_dnat')).toHaveLength(2);

    // The other owner goes: the next full sync finishes the cleanup.
    k.ipt.answer({ file: 'iptables-nft-restore', args: ['--noflush'], input: '*nat\n-F FOREIGN\n-X FOREIGN\nCOMMIT\n' });
    k.writes.length = 0;
    await nft.engine.resync('timer');
    // nat and mangle, in one run: nothing of natgw's is left in either.
    expect(k.writes.filter((w) => w.startsWith('iptables-nft-restore')).length).toBe(1);
    expect(natgwChains(k)).toEqual([]);
    expect(await nft.engine.currentBackend()).toEqual({ kind: 'nftables' });
  });

  it("nftables → iptables fills iptables first, then removes natgw's nft tables (and a refused removal is retried)", async () => {
    const k = new FakeKernel();
    const dir = stateDir();
    const nft = await k.engine(dir, NFT);
    await populate(nft.engine);
    k.nft.fault = (script) => (script.includes('delete table ip natgw') ? 'EBUSY' : undefined);

    const ipt = await k.engine(dir, IPT);
    k.writes.length = 0;
    await ipt.engine.resync('mode changed');
    const filled = k.writes.findIndex((w) => w.startsWith('iptables-nft-restore') && w.includes(`:${CHAINS.sharedSnat} `));
    const removal = k.writes.findIndex((w) => w.startsWith('!nft delete table ip natgw'));
    expect(filled).toBeGreaterThanOrEqual(0);
    expect(removal).toBeGreaterThan(filled);
    expect(k.ipt.rules('iptables-nft', 'nat', CHAINS.sharedDnat)).toHaveLength(1);
    expect(k.nft.dump('ip', 'natgw')).not.toBeNull();
    expect(await ipt.engine.currentBackend()).toEqual({ kind: 'iptables', variant: 'nft', pendingCleanup: { kind: 'nftables' } });

    k.nft.fault = undefined;
    await ipt.engine.resync('timer');
    expect(k.nft.dump('ip', 'natgw')).toBeNull();
    // Share DNAT and accounting live in nftables whatever the backend: they stay.
    expect(k.nft.tableNames().sort()).toEqual(['inet natgw_acct', 'ip kube-ovn']);
    expect(await ipt.engine.currentBackend()).toEqual({ kind: 'iptables', variant: 'nft' });
    const report = await ipt.engine.resync('timer');
    expect(report.netfilterChanges + report.shareDnatChanges).toBe(0);
  });
});
