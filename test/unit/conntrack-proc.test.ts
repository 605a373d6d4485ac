/**
 * The kernel's conntrack count as a witness (src/dataplane/conntrack.ts): a namespace whose
 * entry count (/proc/net/stat/nf_conntrack) is zero runs no conntrack at all; any other count,
 * or none, runs the flushes as ever (a port range from one listing).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Conntrack, type ConntrackFilter, matches, PROC_CONNTRACK_STAT, parseConntrackEntries } from '../../src/dataplane/conntrack.js';
import pino from 'pino';
import { type ConntrackEntry, parseConntrackLines } from '../../src/model/conntrackLine.js';
import { loadConfig } from '../../src/config/config.js';
import { Engine, type FlushCount } from '../../src/engine/engine.js';
import { Metrics } from '../../src/engine/metrics.js';
import type { Dnat } from '../../src/model/rules.js';
import * as Ops from '../../src/state/operations.js';
import { emptyState } from '../../src/state/state.js';
import { SystemExecutor } from '../../src/system/exec.js';
import { RecordingExecutor } from '../helpers/execCalls.js';
import { FakeIptables } from '../helpers/fakeIptables.js';
import { FakeNftClient } from '../helpers/fakeNft.js';

// As 6.18 prints them (the IPv6 and udp lines captured from a namespace here; icmp per print_tuple).
const TCP4 =
  'ipv4     2 tcp      6 431999 ESTABLISHED src=172.20.0.100 dst=172.20.0.10 sport=40000 dport=8080 src=10.0.1.6 dst=172.20.0.100 sport=80 dport=40000 [ASSURED] mark=0 zone=0 use=2';
const UDP4_UNREPLIED =
  'ipv4     2 udp      17 29 src=172.20.0.100 dst=172.20.0.10 sport=5353 dport=53 [UNREPLIED] src=10.0.1.7 dst=172.20.0.100 sport=53 dport=5353 mark=0 zone=0 use=2';
const TCP6 =
  'ipv6     10 tcp      6 299 ESTABLISHED src=2001:0db8:0000:0000:0000:0000:0000:0100 dst=2001:0db8:0001:0000:0000:0000:0000:0010 sport=40000 dport=8080 [UNREPLIED] src=2001:0db8:0002:0000:0000:0000:0000:0006 dst=2001:0db8:0000:0000:0000:0000:0000:0100 sport=80 dport=40000 [ASSURED] mark=0 zone=0 use=2';
const ICMP4 =
  'ipv4     2 icmp     1 29 src=172.20.0.100 dst=172.20.0.11 type=8 code=0 id=77 src=10.0.1.7 dst=172.20.0.100 type=0 code=0 id=77 mark=0 zone=0 use=2';

const table = (...lines: string[]): string => lines.map((l) => `${l}\n`).join('');

/** What a flush filter looks at: the protocol and the original destination. */
const brief = (entries: readonly ConntrackEntry[] | undefined) =>
  entries?.map((e) => ({ protocol: e.protocol, dst: e.original.dst, ...(e.original.dport !== undefined ? { dport: e.original.dport } : {}) }));

/** /proc/net/stat/nf_conntrack as 6.18 prints it, two CPUs, `entries` first on every line. */
const stat = (entries: number): string =>
  'entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n' +
  `${entries.toString(16).padStart(8, '0')}  00000000 00000000 00000000 00000000 00000000 00000003 00000000 00000000 00000000 00000000 00000000 00000000  00000000 00000000 00000000 00000000\n`.repeat(
    2,
  );

describe('parseConntrackEntries', () => {
  it("the namespace's entry count, in hex, from the first CPU's line", () => {
    expect(parseConntrackEntries(stat(0))).toBe(0);
    expect(parseConntrackEntries(stat(26))).toBe(26);
  });

  it('anything else proves nothing', () => {
    expect(parseConntrackEntries('')).toBeUndefined();
    expect(parseConntrackEntries(stat(0).split('\n')[0] as string)).toBeUndefined();
    expect(parseConntrackEntries(stat(0).replace('entries', 'searched'))).toBeUndefined();
    expect(parseConntrackEntries(stat(0).replace('00000000  ', 'zz  '))).toBeUndefined();
  });
});

describe('matches: a flush filter against a listed entry', () => {
  it('IPv6 in full 8-group form is canonicalised, so a filter written short matches it', () => {
    const flows = parseConntrackLines(table(TCP6));
    expect(brief(flows)).toEqual([{ protocol: 'tcp', dst: '2001:db8:1::10', dport: 8080 }]);
    expect(matches({ dst: '2001:db8:1::10', protocol: 'tcp', port: 8080 }, flows[0]!)).toBe(true);
  });

  it('icmp has no ports: a floating IP (destination only) matches it, a DNAT does not', () => {
    const flows = parseConntrackLines(table(ICMP4));
    expect(brief(flows)).toEqual([{ protocol: 'icmp', dst: '172.20.0.11' }]);
    expect(matches({ dst: '172.20.0.11' }, flows[0]!)).toBe(true);
    expect(matches({ dst: '172.20.0.11', protocol: 'tcp', port: 80 }, flows[0]!)).toBe(false);
  });
});

describe('SystemExecutor.readKernelFile', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'natgw-proc-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('the text, undefined for a missing file', async () => {
    const exec = new SystemExecutor();
    const file = path.join(dir, 'small');
    writeFileSync(file, 'x'.repeat(100));
    expect(await exec.readKernelFile(file)).toHaveLength(100);
    expect(await exec.readKernelFile(path.join(dir, 'absent'))).toBeUndefined();
  });
});

describe('Conntrack: the entry count decides whether flushes run', () => {
  const deletedOne = { stderr: 'conntrack v1.4.7 (conntrack-tools): 1 flow entries have been deleted.\n' };
  /** A recorder whose statistics are `statText` (none: a kernel without them) and whose listing is `listing`. */
  function kernel(statText: string | undefined, listing = '') {
    const reads: string[] = [];
    const exec = Object.assign(new RecordingExecutor((r) => (r.args[0] === '-L' ? { stdout: listing } : deletedOne)), {
      readKernelFile: async (p: string) => {
        reads.push(p);
        return p === PROC_CONNTRACK_STAT ? statText : undefined;
      },
    });
    return { exec, reads, runs: () => exec.calls.map((c) => c.args.join(' ')) };
  }
  const dnat8080: ConntrackFilter = { dst: '172.20.0.10', protocol: 'tcp', port: 8080 };
  const dnat8081: ConntrackFilter = { dst: '172.20.0.10', protocol: 'tcp', port: 8081 };
  const fip: ConntrackFilter = { dst: '172.20.0.11' };

  it('an entry count of zero: every filter skipped, no conntrack', async () => {
    const k = kernel(stat(0));
    const r = await new Conntrack(k.exec).flushOwed([dnat8080, fip]);
    expect(r).toEqual({ deleted: 0, skipped: [dnat8080, fip] });
    expect(k.runs()).toEqual([]);
    expect(k.reads).toEqual([PROC_CONNTRACK_STAT]);
  });

  it('any other count, statistics not understood or none: each delete runs as ever', async () => {
    for (const statText of [stat(1), 'entries\n', 'no such thing', undefined]) {
      const k = kernel(statText);
      const r = await new Conntrack(k.exec).flushOwed([dnat8080, fip]);
      expect(k.runs()).toEqual(['-D --orig-dst 172.20.0.10 -p tcp --orig-port-dst 8080', '-D --orig-dst 172.20.0.11']);
      expect(r).toEqual({ deleted: 2, skipped: [] });
    }
    const plain = new RecordingExecutor(() => deletedOne);
    await new Conntrack(plain).flushOwed([dnat8081]);
    expect(plain.calls.map((c) => c.args[0])).toEqual(['-D']);
  });

  it('a port range takes its ports from one listing, or is skipped when none is tracked', async () => {
    const range: ConntrackFilter = { dst: '172.20.0.10', protocol: 'tcp', port: 8000, portEnd: 8100 };
    const k = kernel(stat(3), table(TCP4, TCP4.replace('dport=8080', 'dport=8050'), UDP4_UNREPLIED));
    await new Conntrack(k.exec).flushOwed([range]);
    expect(k.runs()[0]).toBe('-L -f ipv4 -o extended');
    expect(k.runs().slice(1).sort()).toEqual([
      '-D --orig-dst 172.20.0.10 -p tcp --orig-port-dst 8050',
      '-D --orig-dst 172.20.0.10 -p tcp --orig-port-dst 8080',
    ]);
    const none = kernel(stat(1), table(UDP4_UNREPLIED));
    expect((await new Conntrack(none.exec).flushOwed([range])).skipped).toEqual([range]);
    expect(none.runs()).toEqual(['-L -f ipv4 -o extended']);
  });

  it('a flush owed after a failure is paid once the count shows nothing tracked', async () => {
    let statText: string | undefined;
    const exec = Object.assign(new RecordingExecutor(() => ({ exitCode: 1, stderr: 'conntrack: Operation not permitted\n' })), {
      readKernelFile: async () => statText,
    });
    const ct = new Conntrack(exec);
    await ct.flushOwed([dnat8080]);
    expect(ct.pendingFlushes).toBe(1);
    statText = stat(0);
    exec.calls.length = 0;
    await ct.retryFailed();
    expect(exec.calls).toEqual([]);
    expect(ct.pendingFlushes).toBe(0);
  });
});

describe("restart hygiene's listing (deleteUntranslated)", () => {
  const NO_TARGETS = { dsts: new Set<string>(), srcCidrs: [], srcs: new Set<string>() };
  const listingOf = (statText: string | undefined) => {
    const exec = Object.assign(new RecordingExecutor(() => ({ stdout: TCP4.slice(9) })), { readKernelFile: async () => statText });
    return { exec, cleaned: () => new Conntrack(exec).deleteUntranslated(NO_TARGETS) };
  };

  it('a namespace that holds no entry: no conntrack runs', async () => {
    const k = listingOf(stat(0));
    expect(await k.cleaned()).toEqual([]);
    expect(k.exec.calls).toEqual([]);
  });

  it('any entry, statistics not understood or unreadable: both families are listed', async () => {
    for (const statText of [stat(1), 'no such thing', undefined]) {
      const k = listingOf(statText);
      await k.cleaned();
      expect(k.exec.calls.map((c) => c.args.join(' '))).toEqual(['-L -f ipv4 -o extended', '-L -f ipv6 -o extended']);
    }
  });
});

describe('natgw_conntrack_flushes_total', () => {
  it('counts the flushes that ran beside those the kernel table skipped', async () => {
    const m = new Metrics();
    m.observeSync({ ok: true, kind: 'partial', ms: 1, report: {} as never, state: emptyState('eth0', 'net1'), flushes: { ran: 1, noEntries: 3 } });
    const body = (await m.render()).body;
    expect(body).toContain('natgw_conntrack_flushes_total{outcome="ran"} 1');
    expect(body).toContain('natgw_conntrack_flushes_total{outcome="skipped_no_entries"} 3');
  });
});

describe('the engine with an HA peer: the entry count decides, on both backends', () => {
  const dirs: string[] = [];
  afterAll(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });
  const DNAT: Dnat = { eip: '172.20.0.10', port: 80, protocol: 'tcp', internalIp: '10.0.1.7', internalPort: 8080 };

  for (const [name, env] of [
    ['iptables', { GATEWAY_NETFILTER_MODE: 'iptables', NATGW_IPTABLES_VARIANT: 'nft' }],
    ['nftables', { GATEWAY_NETFILTER_MODE: 'nftables' }],
  ] as const) {
    it(`${name}: a DNAT delete runs conntrack -D only while the namespace tracks connections`, async () => {
      const dir = mkdtempSync(path.join(tmpdir(), 'natgw-proc-engine-'));
      dirs.push(dir);
      const ipt = new FakeIptables();
      let text = stat(0);
      const exec = Object.assign(new RecordingExecutor((r) => ipt.answer(r)), {
        readKernelFile: async (p: string) => (p === PROC_CONNTRACK_STAT ? text : undefined),
      });
      const config = await loadConfig({ NATGW_ENV_FILE: path.join(dir, 'none.env'), NATGW_STATE_DIR: dir, NATGW_HA_PEERS: '10.9.0.2', ...env });
      expect(config.ha?.peers).toEqual(['10.9.0.2']);
      const engine = new Engine({ config, exec, log: pino({ level: 'silent' }), nft: new FakeNftClient() });
      const flushes: (FlushCount | undefined)[] = [];
      engine.onSync((e) => {
        if (e.ok) flushes.push(e.flushes);
      });
      await engine.transact(({ state }) => ({ state: { ...state, initialized: true }, effects: [] }), { mode: 'full' });
      await engine.transact(({ state }) => Ops.addEip(state, { address: '172.20.0.10', prefixLength: 24 }, { v4: '172.20.0.1' }), { guarded: true });
      const conntrackRuns = () => exec.calls.filter((c) => c.file === 'conntrack').map((c) => c.args.join(' '));

      await engine.transact(({ state }) => Ops.addDnat(state, DNAT), { guarded: true });
      await engine.transact(({ state }) => Ops.delDnat(state, DNAT), { guarded: true });
      expect(conntrackRuns()).toEqual([]);
      expect(flushes.at(-1)).toEqual({ ran: 0, noEntries: 1 });

      text = stat(1);
      await engine.transact(({ state }) => Ops.addDnat(state, DNAT), { guarded: true });
      await engine.transact(({ state }) => Ops.delDnat(state, DNAT), { guarded: true });
      expect(conntrackRuns()).toEqual(['-D --orig-dst 172.20.0.10 -p tcp --orig-port-dst 80']);
      expect(flushes.at(-1)).toEqual({ ran: 1, noEntries: 0 });
    });
  }
});
