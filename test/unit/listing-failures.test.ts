/**
 * A listing that fails is an error, never an empty table (issue 12): reading a failed
 * `ip6tables-save` as "nothing here" would adopt nothing and plan to re-create what exists.
 * Only an ip6tables that cannot work here at all (no binary, no IPv6 tables) holds nothing.
 * A conntrack flush that fails is retried with the next one; one that matched nothing is fine.
 */
import { describe, expect, it } from 'vitest';
import type { ExecRequest, ExecResult } from '../../src/system/exec.js';
import { RecordingExecutor } from '../helpers/execCalls.js';
import { IptablesBackend } from '../../src/dataplane/netfilter/iptables/backend.js';
import { Conntrack } from '../../src/dataplane/conntrack.js';
import { ExecError } from '../../src/system/exec.js';

const SAVE4 = `*nat
:SNAT_FILTER - [0:0]
:SHARED_SNAT - [0:0]
-A SNAT_FILTER -j SHARED_SNAT
-A SHARED_SNAT -s 10.0.1.0/24 -o net1 -j SNAT --to-source 172.20.0.10
-A SHARED_SNAT -o net1 -j SNAT --to-source 172.20.0.11
COMMIT
`;

function backendAnswering(ip6: Partial<ExecResult>): IptablesBackend {
  const exec = new RecordingExecutor((req: ExecRequest) =>
    req.file.startsWith('ip6tables') ? ip6 : req.file.endsWith('-save') ? { stdout: SAVE4 } : undefined,
  );
  return new IptablesBackend(exec, 'legacy');
}

describe('iptables listings', () => {
  it('a failing ip6tables-save is an error', async () => {
    const b = backendAnswering({ exitCode: 4, stderr: 'Another app is currently holding the xtables lock.' });
    await expect(b.readBack()).rejects.toBeInstanceOf(ExecError);
  });

  it('a hung ip6tables-save is an error', async () => {
    const b = backendAnswering({ exitCode: 124, timedOut: true, stderr: 'ip6tables-legacy-save: timed out' });
    await expect(b.readBack()).rejects.toThrow(/timed out/);
  });

  it('an ip6tables that cannot work here holds nothing', async () => {
    for (const ip6 of [
      { exitCode: 127, failedToStart: true },
      { exitCode: 1, stderr: "ip6tables-save v1.8.9 (legacy): can't initialize ip6tables table `nat': Table does not exist" },
    ]) {
      const nat = await backendAnswering(ip6).readBack();
      // iptables-save prints a SNAT of every source without `-s`: it is 0.0.0.0/0.
      expect(nat?.snats).toEqual([
        { eip: '172.20.0.10', cidr: '10.0.1.0/24', randomFully: false },
        { eip: '172.20.0.11', cidr: '0.0.0.0/0', randomFully: false },
      ]);
    }
  });
});

describe('conntrack flush failures', () => {
  it('are retried with the next flush, and one that matched nothing is success', async () => {
    let fail = true;
    const exec = new RecordingExecutor((req) =>
      req.args.includes('8090') && fail
        ? { exitCode: 1, stderr: 'conntrack: netlink error: Resource busy' }
        : { exitCode: 1, stderr: 'conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.\n' },
    );
    const ct = new Conntrack(exec);
    await ct.flushOwed([{ dst: '172.20.0.10', protocol: 'tcp', port: 8090 }]);
    expect(ct.pendingFlushes).toBe(1);
    fail = false;
    await ct.flushOwed([{ dst: '172.20.0.10', protocol: 'tcp', port: 8091 }]);
    expect(ct.pendingFlushes).toBe(0);
    const ports = exec.calls.map((c) => c.args[c.args.length - 1]);
    expect(ports).toEqual(['8090', '8091', '8090']);
  });
});

describe('SNAT of every source', () => {
  it('renders as iptables-save prints it (no -s), so a resync finds it equal', async () => {
    const { snatSpec } = await import('../../src/dataplane/netfilter/iptables/ruleText.js');
    expect(snatSpec({ eip: '172.20.0.11', cidr: '0.0.0.0/0', randomFully: false }, 'net1')).toBe('-o net1 -j SNAT --to-source 172.20.0.11');
    expect(snatSpec({ eip: 'fd00:20::10', cidr: '::/0', randomFully: true }, 'net1')).toBe('-o net1 -j SNAT --to-source fd00:20::10 --random-fully');
    expect(snatSpec({ eip: '172.20.0.11', cidr: '10.0.0.0/8', randomFully: false }, 'net1')).toBe('-s 10.0.0.0/8 -o net1 -j SNAT --to-source 172.20.0.11');
  });
});

describe('backend choice', () => {
  const nftFailing = (present: boolean, timedOut = false) => ({
    present: async () => present,
    list: async () => {
      throw new ExecError(
        {
          command: 'nft -j list table ip natgw',
          exitCode: timedOut ? 124 : 1,
          stdout: '',
          stderr: 'netlink: Error: Could not process rule: Device or resource busy',
          timedOut,
          failedToStart: false,
        },
        'the listing',
      );
    },
    run: async () => undefined,
  });

  it('a listing that fails while nft works is no evidence either way: the choice fails and is retried', async () => {
    const { BackendProbe } = await import('../../src/engine/backendSelect.js');
    await expect(new BackendProbe(new RecordingExecutor(), nftFailing(true)).ownsNft()).rejects.toBeInstanceOf(ExecError);
    await expect(new BackendProbe(new RecordingExecutor(), nftFailing(false, true)).ownsNft()).rejects.toThrow(/listing/);
  });

  it('where nft cannot work at all, natgw owns nothing in it', async () => {
    const { BackendProbe } = await import('../../src/engine/backendSelect.js');
    expect(await new BackendProbe(new RecordingExecutor(), nftFailing(false)).ownsNft()).toBe(false);
  });
});
