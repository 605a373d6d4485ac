/**
 * Partial syncs against a real kernel (SyncOptions): after one full sync, each part applies a
 * series of changes (adds, changes, deletes) planned against the view it kept, running only
 * its apply tools (QoS plans against a read of the devices a change touches, then applies one
 * `tc -batch`); after every step a NEW manager reads the kernel back and finds nothing to
 * change. That proves each kept view matched the kernel.
 *
 * One namespace of our own (unique name, deleted in afterAll):
 *   eth0 10.0.1.1/24 ── v0        net1 ── e0      (both veth pairs inside it)
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execa } from 'execa';
import { EipCounters } from '../../src/dataplane/eipCounters.js';
import { LinkManager } from '../../src/dataplane/link.js';
import { ShareDnatTable } from '../../src/dataplane/netfilter/shareDnat.js';
import { QosManager } from '../../src/dataplane/qos/manager.js';
import type { EipQos, GwQos } from '../../src/model/qos.js';
import type { ShareDnat } from '../../src/model/rules.js';
import { addEipQos, addGwQos, delEipQos, delGwQos } from '../../src/state/qosOperations.js';
import { emptyState, type DesiredState } from '../../src/state/state.js';
import type { ExecRequest, ExecResult, Executor } from '../../src/system/exec.js';
import { NetnsExecutor } from '../helpers/netnsExecutor.js';

const NS = `ngpp${randomBytes(3).toString('hex')}`;

/** Runs in the namespace and remembers what ran. */
class Recorder implements Executor {
  readonly calls: string[] = [];
  private readonly inner = new NetnsExecutor(NS);

  run(req: ExecRequest): Promise<ExecResult> {
    this.calls.push([req.file, ...req.args].join(' '));
    return this.inner.run(req);
  }

  take(): string[] {
    return this.calls.splice(0);
  }
}

/** promote_secondaries is set in the namespace (the manager's own write goes to this process's /proc). */
class NsLinks extends LinkManager {
  constructor(private readonly x: Executor) {
    super(x);
  }

  override async promoteSecondaries(ifname: string): Promise<void> {
    await this.x.run({ file: 'sysctl', args: ['-q', '-w', `net.ipv4.conf.${ifname}.promote_secondaries=1`] });
  }
}

async function inNs(argv: string[]): Promise<void> {
  await execa('ip', ['netns', 'exec', NS, ...argv], { timeout: 30_000 });
}

beforeAll(async () => {
  await execa('ip', ['netns', 'add', NS]);
  await inNs(['ip', 'link', 'add', 'net1', 'type', 'veth', 'peer', 'name', 'e0']);
  await inNs(['ip', 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'v0']);
  for (const dev of ['lo', 'net1', 'e0', 'eth0', 'v0']) await inNs(['ip', 'link', 'set', dev, 'up']);
  await inNs(['ip', 'addr', 'add', '10.0.1.1/24', 'dev', 'eth0']);
  await inNs(['sysctl', '-q', '-w', 'net.ipv6.conf.net1.disable_ipv6=0']);
});

afterAll(async () => {
  await execa('ip', ['netns', 'del', NS], { reject: false });
});

const base = (): DesiredState => ({ ...emptyState('eth0', 'net1'), initialized: true });

describe('partial syncs in a network namespace', () => {
  it('link: addresses, routes and default routes', async () => {
    const link = (eips: string[], routes: [string, string][], v4?: string, v6?: string): DesiredState => ({
      ...base(),
      eips: eips.map((e) => ({ address: e.split('/')[0]!, prefixLength: Number(e.split('/')[1]) })),
      routes: routes.map(([cidr, nexthop]) => ({ cidr, nexthop })),
      defaultRoutes: { ...(v4 ? { v4 } : {}), ...(v6 ? { v6 } : {}) },
    });
    const steps: DesiredState[] = [
      link(['172.20.0.10/24', '172.20.0.11/24'], [['10.1.0.0/16', '10.0.1.254']], '172.20.0.1'),
      // A secondary, a primary of another subnet, IPv6; the first primary goes (its secondary is promoted).
      link(
        ['172.20.0.11/24', '172.20.0.12/24', '10.9.0.5/16', '2001:db8::10/64'],
        [
          ['10.1.0.0/16', '10.0.1.253'],
          ['10.2.3.4/32', '10.0.1.254'],
        ],
        '172.20.0.254',
      ),
      // The promoted primary goes in turn; IPv6 swapped and re-prefixed; a host route goes; an IPv6 default.
      link(['172.20.0.12/24', '10.9.0.5/16', '172.20.0.13/24', '2001:db8::11/64'], [['10.1.0.0/16', '10.0.1.253']], '172.20.0.254', '2001:db8::1'),
      // A deleted host route comes back; 10.9.0.5 and the IPv6 EIP change prefix.
      link(
        ['172.20.0.12/24', '10.9.0.5/24', '2001:db8::11/80'],
        [
          ['10.1.0.0/16', '10.0.1.253'],
          ['10.2.3.4/32', '10.0.1.254'],
        ],
        '172.20.0.254',
        '2001:db8::1',
      ),
      link(['172.20.0.13/24'], [], '172.20.0.254', '2001:db8::1'),
    ];
    const x = new Recorder();
    const m = new NsLinks(x);
    let previous: DesiredState | undefined;
    for (const [i, want] of steps.entries()) {
      const r = await m.sync(want, previous, { mode: i === 0 ? 'full' : 'partial' });
      expect(r.changes).toBeGreaterThan(0);
      // The sysctl is this test's stand-in for the manager's /proc write.
      const ran = x.take().filter((c) => !c.startsWith('sysctl '));
      // Every sync reads both families, then applies in one batch.
      expect(ran.sort()).toEqual(['ip -6 -j -batch -', 'ip -batch -', 'ip -j -batch -']);
      const fresh = await new NsLinks(new NetnsExecutor(NS)).sync(want, previous, { dryRun: true });
      expect(fresh, `after step ${i}`).toEqual({ changes: 0, script: '' });
      previous = want;
    }
  });

  it('QoS: tc htb classes and u32 filters, an IFB, new priorities and node deletes', async () => {
    const eip = (direction: 'egress' | 'ingress', ip: string, priority: number, rate: string): EipQos => ({ direction, ip, priority, rate, burst: '1' });
    const gw = (priority: number, over: Partial<GwQos> = {}): GwQos => ({
      direction: 'egress',
      dev: 'net1',
      priority,
      classifier: 'u32',
      matchType: 'ip',
      matchDirection: 'src',
      cidr: '10.0.0.0/16',
      rate: '100',
      burst: '2',
      ...over,
    });
    const catchAll = gw(3, { classifier: 'matchall', matchType: '', matchDirection: '', cidr: '', rate: '50', burst: '1' });
    const add = (s: DesiredState, qs: EipQos[]): DesiredState => qs.reduce((acc, q) => addEipQos(acc, q).state, s);
    const s1 = addGwQos(addGwQos(add(base(), [eip('egress', '10.98.0.2', 1, '10'), eip('ingress', '10.98.0.3', 1, '5')]), gw(2)).state, catchAll).state;
    const s2 = delGwQos(add(s1, [eip('egress', '10.98.0.4', 1, '10'), eip('egress', '10.98.0.2', 1, '20'), eip('egress', '10.98.0.5', 4, '7')]), gw(2)).state;
    const s3 = addGwQos(
      delEipQos(delEipQos(s2, 'egress', '10.98.0.4').state, 'ingress', '10.98.0.3').state,
      gw(2, { matchDirection: 'dst', cidr: '10.1.0.0/16' }),
    ).state;
    const s4 = add(s3, [eip('egress', '10.98.0.6', 6, '1'), eip('egress', '10.98.0.7', 6, '1'), eip('ingress', '10.98.0.8', 2, '3')]);
    // A node of a table made during the partial syncs (whose id the kernel chose): read back, then named.
    const s5 = delEipQos(delEipQos(s4, 'egress', '10.98.0.7').state, 'egress', '10.98.0.5').state;
    const s6 = delEipQos(s5, 'egress', '10.98.0.6').state;

    const x = new Recorder();
    const m = new QosManager(x);
    for (const [i, want] of [s1, s2, s3, s4, s5, s6].entries()) {
      const r = await m.sync(want, { mode: i === 0 ? 'full' : 'partial' });
      expect(r.changes).toBeGreaterThan(0);
      // QoS plans against what tc reads back, then applies one batch.
      const ran = x.take().filter((c) => !c.includes('ngprobe') && !/ show( |$)/.test(c) && c !== 'tc -d -raw -batch -');
      if (i > 0) expect(ran, `step ${i}: ${r.commands.join('; ')}`).toEqual(['tc -batch -']);
      const fresh = await new QosManager(new NetnsExecutor(NS)).sync(want);
      expect(fresh.commands, `after step ${i}`).toEqual([]);
    }
  });

  it('share DNAT: chains, map elements and stale chains', async () => {
    const A: ShareDnat = {
      eip: '172.20.0.10',
      port: 8080,
      protocol: 'tcp',
      protocolText: 'TCP',
      backends: [
        { ip: '10.0.1.6', port: 80 },
        { ip: '10.0.1.7', port: 80 },
      ],
    };
    const B: ShareDnat = { eip: '172.20.0.10', port: 5353, protocol: 'udp', protocolText: 'udp', backends: [{ ip: '10.0.1.6', port: 53 }] };
    const C: ShareDnat = { eip: '172.20.0.11', port: 443, protocol: 'tcp', protocolText: 'tcp', backends: [{ ip: '10.0.1.8', port: 8443 }] };
    const steps: ShareDnat[][] = [
      [A, B],
      [{ ...A, backends: [{ ip: '10.0.1.9', port: 80 }] }, C],
      [{ ...A, backends: [{ ip: '10.0.1.9', port: 80 }] }, B, { ...C, protocolText: 'TCP' }],
      [B],
      [],
      [A],
    ];
    const x = new Recorder();
    const t = new ShareDnatTable(x);
    for (const [i, items] of steps.entries()) {
      const r = await t.sync(items, { mode: i === 0 ? 'full' : 'partial' });
      expect(r.changes).toBeGreaterThan(0);
      const ran = x.take();
      if (i > 0) expect(new Set(ran)).toEqual(new Set(['nft -f -']));
      const fresh = await new ShareDnatTable(new NetnsExecutor(NS)).sync(items, { dryRun: true });
      expect(fresh, `after step ${i}`).toEqual({ changes: 0, script: '' });
    }
  });

  it('per-EIP accounting sets', async () => {
    const steps = [['172.20.0.10', 'fd00::10'], ['172.20.0.10', '172.20.0.11'], [], ['fd00::11']];
    const x = new Recorder();
    const c = new EipCounters(x);
    for (const [i, eips] of steps.entries()) {
      expect(await c.sync(eips)).toBeGreaterThan(0);
      expect(x.take()).toEqual(['nft -j list table inet natgw_acct', 'nft -f -']);
      const y = new Recorder();
      expect(await new EipCounters(y).sync(eips), `after step ${i}`).toBe(0);
      expect(y.calls).toEqual(['nft -j list table inet natgw_acct']);
    }
  });
});
