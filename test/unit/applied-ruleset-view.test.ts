/**
 * What the first full sync assumes after a trusted replay (NetfilterBackend.assumeApplied) is
 * the view a real full sync of the same state leaves: the next change renders the very same
 * partial script either way. nftables on the in-memory kernel (the replay's script run there);
 * iptables through a recording executor answering its listings from what it was given.
 */
import { describe, expect, it } from 'vitest';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { NftBackend } from '../../src/dataplane/netfilter/nft/backend.js';
import { IptablesBackend } from '../../src/dataplane/netfilter/iptables/backend.js';
import { replayScripts } from '../../src/dataplane/netfilter/replayRender.js';
import { RecordingExecutor } from '../../src/system/exec.js';
import type { Dnat } from '../../src/model/rules.js';
import { FakeNftClient } from '../helpers/fakeNft.js';

const dnat = (port: number): Dnat => ({ eip: '172.20.0.10', port, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 }) as Dnat;
const WANT = {
  vpcIf: 'eth0',
  extIf: 'net1',
  eips: ['172.20.0.10', '172.20.0.11'],
  snats: [{ eip: '172.20.0.10', cidr: '10.0.1.0/24' }],
  dnats: [dnat(8080), dnat(8081)],
  fips: [{ eip: '172.20.0.11', internalIp: '10.0.1.7' }],
} as unknown as NatTables;
const NEXT: NatTables = { ...WANT, dnats: [...WANT.dnats, dnat(8082)], fips: [] };

describe('the view a trusted replay leaves', () => {
  it('nftables: the next change is the same partial transaction as after a full sync', async () => {
    const replayed = new FakeNftClient();
    await replayed.run(replayScripts(WANT, { kind: 'nftables' }).scripts[0]?.text ?? '');
    const a = new NftBackend(new RecordingExecutor(), undefined, replayed);
    a.assumeApplied(WANT);
    const before = replayed.calls.length;
    const ra = await a.sync(NEXT, { mode: 'partial' });
    // Planned against the assumed view: nothing listed.
    expect(replayed.calls.slice(before).filter((c) => c.kind === 'list')).toEqual([]);

    const synced = new FakeNftClient();
    const b = new NftBackend(new RecordingExecutor(), undefined, synced);
    await b.sync(WANT, { mode: 'full' });
    const rb = await b.sync(NEXT, { mode: 'partial' });
    expect(ra.script).toBe(rb.script);
    expect(ra.script).toContain('8082');
  });

  it('iptables: the next change is the same restore input as after a full sync, and nothing is listed', async () => {
    const plan = async (prime: (b: IptablesBackend) => Promise<void>) => {
      // Every listing answers empty: a fresh namespace, as the replay requires.
      const exec = new RecordingExecutor();
      const b = new IptablesBackend(exec, 'legacy');
      await prime(b);
      const from = exec.calls.length;
      const r = await b.sync(NEXT, { mode: 'partial' });
      return { script: r.script, listed: exec.calls.slice(from).filter((c) => c.file.endsWith('-save')).length };
    };
    const assumed = await plan(async (b) => b.assumeApplied(WANT));
    const synced = await plan(async (b) => {
      await b.sync(WANT, { mode: 'full' });
    });
    expect(assumed.listed).toBe(0);
    expect(assumed.script).toBe(synced.script);
    expect(assumed.script).toMatch(/--dport 8082/);
    expect(assumed.script).toMatch(/-D EXCLUSIVE_DNAT|-D EXCLUSIVE_SNAT/);
  });
});
