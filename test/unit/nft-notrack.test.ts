/**
 * The nftables backend and the shim_notrack chain (src/dataplane/netfilter/notrack.ts): a full
 * sync adds it to a table without it; a kernel that refuses it (no `notrack` in nft) keeps the
 * NAT, a warning logged once, and no later sync tries it again.
 */
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import type { NatTables } from '../../src/dataplane/netfilter/backend.js';
import { NftBackend } from '../../src/dataplane/netfilter/nft/backend.js';
import type { NftTransaction } from '../../src/dataplane/netfilter/nft/transaction.js';
import { ExecError } from '../../src/system/exec.js';
import { RecordingExecutor } from '../../src/system/exec.js';
import { FakeNftClient } from '../helpers/fakeNft.js';

const WANT: NatTables = {
  vpcIf: 'eth0',
  extIf: 'net1',
  eips: ['172.20.0.10'],
  snats: [],
  dnats: [{ eip: '172.20.0.10', port: 80, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 8080 }],
  fips: [],
};

const chains = (nft: FakeNftClient) => [...(nft.dump('ip', 'natgw')?.chains.keys() ?? [])];

/** A fake kernel that refuses the notrack statement as a kernel without it does (nft names the command). */
function withoutNotrack(): FakeNftClient {
  const nft = new FakeNftClient();
  const run = nft.run.bind(nft);
  nft.run = async (tx: NftTransaction | string) => {
    const script = typeof tx === 'string' ? tx : tx.text();
    const line = script.split('\n').find((l) => l.endsWith(' notrack'));
    if (line)
      throw new ExecError(
        {
          command: 'nft -f -',
          exitCode: 1,
          stdout: '',
          stderr: `Error: Could not process rule: No such file or directory\n${line}\n`,
          timedOut: false,
          failedToStart: false,
        },
        'the transaction',
        script,
      );
    await run(tx);
  };
  return nft;
}

describe('the shim_notrack chain on nftables', () => {
  it('is created with the table, and a full sync repairs a flushed chain', async () => {
    const nft = new FakeNftClient();
    const b = new NftBackend(new RecordingExecutor(), undefined, nft);
    await b.sync(WANT);
    expect(chains(nft)).toContain('shim_notrack');
    await nft.run('flush chain ip natgw shim_notrack\n');
    const repair = await b.sync(WANT);
    expect(repair.script).toBe('add rule ip natgw shim_notrack ip daddr 127.78.71.87 notrack\nadd rule ip natgw shim_notrack ip saddr 127.78.71.87 notrack\n');
    expect((await b.sync(WANT)).changes).toBe(0);
  });

  it('a kernel that refuses it keeps the NAT, warns once, and no later sync tries again', async () => {
    const nft = withoutNotrack();
    const lines: string[] = [];
    const log = pino({ level: 'warn' }, { write: (s: string) => lines.push(s) });
    const b = new NftBackend(new RecordingExecutor(), log, nft);
    await b.sync(WANT);
    expect(chains(nft)).toContain('prerouting');
    expect(chains(nft)).not.toContain('shim_notrack');
    expect(nft.dump('ip', 'natgw')?.sets.get('port_dnat')?.elements).toHaveLength(1);
    const warned = () => lines.filter((l) => l.includes('refused the shim_notrack chain'));
    expect(warned()).toHaveLength(1);

    // Full syncs and commands: no refusal any more, no second warning.
    const runs = nft.calls.filter((c) => c.kind === 'run').length;
    await b.sync({ ...WANT, dnats: [] }, { mode: 'partial' });
    await b.sync(WANT);
    await b.sync(WANT);
    const later = nft.calls.filter((c) => c.kind === 'run').slice(runs);
    expect(later.every((c) => c.kind === 'run' && !c.script.includes('notrack'))).toBe(true);
    expect(warned()).toHaveLength(1);
  });
});
