/**
 * The nft session (`nft -i` kept running for partial syncs, README: The nft session) on a real kernel:
 * a transaction is applied when the call returns, a refusal is reported and applies nothing
 * of its transaction (all or nothing, as `nft -f`), the session answers correctly after a
 * refusal, and a session whose process dies is replaced.
 */
import { statSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SystemNftClient } from '../../src/dataplane/netfilter/nft/client.js';
import { NftTransaction } from '../../src/dataplane/netfilter/nft/transaction.js';
import { ToolError } from '../../src/model/errors.js';
import { createTopology, type Topology } from '../helpers/netns.js';
import { NetnsExecutor } from '../helpers/netnsExecutor.js';

const T = { family: 'ip', name: 'natgw_session_t' } as const;

describe('nft session', () => {
  let topo: Topology;
  let exec: NetnsExecutor;
  let nft: SystemNftClient;

  beforeAll(async () => {
    topo = await createTopology();
    exec = new NetnsExecutor(topo.ns.gw);
    nft = new SystemNftClient(exec);
    // Declarations go through `nft -f -`.
    await nft.run(
      new NftTransaction()
        .addTable(T)
        .addMap(T, { name: 'm', type: 'ipv4_addr . inet_proto . inet_service', map: 'ipv4_addr . inet_service' })
        .addSet(T, { name: 's', type: 'ipv4_addr' })
        .addChain(T, { name: 'c' }),
    );
  }, 60_000);

  afterAll(async () => {
    exec?.session('nft', ['-i']).recycle();
    await topo?.cleanup();
  }, 60_000);

  const elements = async (set: 's' | 'm'): Promise<string> => (await topo.exec('gw', ['nft', 'list', set === 'm' ? 'map' : 'set', 'ip', T.name, set])).stdout;
  /** As the nft backend's partial sync runs its transactions. */
  const run = (tx: NftTransaction) => nft.run(tx, { partial: true });
  const add = (ip: string) => new NftTransaction().addElements(T, 's', [{ key: ip }]);

  it('applies a transaction before the call returns, and one with several operations as one', async () => {
    await run(
      new NftTransaction()
        .addElements(T, 'm', [{ key: '172.20.0.10 . tcp . 80', value: '10.0.1.6 . 8080' }])
        .addElements(T, 's', [{ key: '10.9.0.1' }, { key: '10.9.0.2' }])
        .addRule(T, 'c', { text: 'ip saddr 10.9.0.1 counter' }),
    );
    expect(await elements('m')).toContain('172.20.0.10 . tcp . 80 : 10.0.1.6 . 8080');
    expect(await elements('s')).toMatch(/10\.9\.0\.1, 10\.9\.0\.2/);
    await run(new NftTransaction().deleteElements(T, 's', ['10.9.0.2']).flushChain(T, 'c'));
    expect(await elements('s')).not.toContain('10.9.0.2');
    expect((await topo.exec('gw', ['nft', 'list', 'chain', 'ip', T.name, 'c'])).stdout).not.toContain('counter');
  }, 30_000);

  it('reports a refused transaction, applies none of it, and answers the next one right', async () => {
    // The add comes first in the line: the kernel's refusal of the delete must take it back.
    const refused = new NftTransaction().addElements(T, 's', [{ key: '10.9.9.9' }]).deleteElements(T, 's', ['10.8.8.8']);
    const err = await run(refused).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(ToolError);
    expect((err as ToolError).message).toMatch(/nft -i refused the transaction: Error: .*No such file or directory/);
    expect(await elements('s')).not.toContain('10.9.9.9');
    // The refusal's output is not mistaken for the next transaction's.
    await run(add('10.9.9.8'));
    expect(await elements('s')).toContain('10.9.9.8');
    await run(new NftTransaction().deleteElements(T, 's', ['10.9.9.8']));
    expect(await elements('s')).not.toContain('10.9.9.8');
  }, 30_000);

  it('runs transactions handed in at once one after the other', async () => {
    const ips = Array.from({ length: 20 }, (_, i) => `10.7.0.${i + 1}`);
    await Promise.all(ips.map((ip) => run(add(ip))));
    const listed = await elements('s');
    for (const ip of ips) expect(listed).toContain(ip);
  }, 30_000);

  it('replaces a session whose process died', async () => {
    await run(add('10.6.0.1'));
    // The session's nft: `nft -i` in this test's own namespace (same inode), killed by hand.
    const ours = statSync(`/run/netns/${topo.ns.gw}`).ino;
    const inNs = (pid: string): boolean => {
      try {
        return statSync(`/proc/${pid}/ns/net`).ino === ours;
      } catch {
        return false;
      }
    };
    const pids = (await topo.exec('gw', ['pgrep', '-x', '-f', 'nft -i'], { reject: false })).stdout
      .trim()
      .split('\n')
      .filter((p) => p !== '' && inNs(p));
    expect(pids.length).toBeGreaterThan(0);
    for (const pid of pids) process.kill(Number(pid), 'SIGKILL');
    // The death is noticed either now (the call is refused: unknown whether it went in) or
    // when the next call finds the process gone; either way a later call goes through.
    const first = await run(add('10.6.0.2')).then(
      () => 'ok',
      (e: unknown) => (e instanceof ToolError ? 'refused' : String(e)),
    );
    expect(['ok', 'refused']).toContain(first);
    await run(add('10.6.0.3'));
    expect(await elements('s')).toContain('10.6.0.3');
  }, 30_000);
});
