/**
 * The start's replay asks, on iptables-legacy, whether natgw's chains are already in the kernel
 * (replayBoot.ts `warmChain`): it reads the table with `iptables-legacy-save`. At 10,000 DNATs
 * that output is ~2.5 MiB, and the check used to read at most 1 MiB of it and answer
 * "failed" (so a restart logged a chain named "(iptables-legacy-save failed)" and a table it
 * could have read was never looked at). Here, in a real namespace, a nat table whose save is
 * ~2 MiB: natgw's chain is found in it, and without natgw's chains the answer is "cold".
 */
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REPO_ROOT, createTopology, type Topology } from '../helpers/netns.js';

const RULES = 20_000;

/** `warmChain` run in gw's namespace (a node process there: the check runs the tools where it runs). */
async function warmChainIn(topo: Topology, chains: readonly string[]): Promise<string> {
  const mod = JSON.stringify(join(REPO_ROOT, 'dist', 'src', 'daemon', 'replayBoot.js'));
  const checks = JSON.stringify([{ family: 4, table: 'nat', chains }]);
  const script = `const m = await import(${mod}); process.stdout.write(String(m.warmChain(${checks}, 'legacy')));`;
  return (await topo.exec('gw', [process.execPath, '--input-type=module', '-e', script], { timeoutMs: 60_000 })).stdout;
}

describe('the replay cold check reads a large iptables-legacy nat table whole', () => {
  let topo: Topology;

  beforeAll(async () => {
    topo = await createTopology();
    const lines = ['*nat', ':DNAT_FILTER - [0:0]', ':FOREIGN - [0:0]'];
    for (let i = 0; i < RULES; i++)
      lines.push(`-A FOREIGN -d 10.${(i >> 8) & 255}.${i & 255}.1/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 192.168.0.1:80`);
    lines.push('COMMIT', '');
    await topo.exec('gw', ['iptables-legacy-restore', '--noflush'], { input: lines.join('\n'), timeoutMs: 60_000 });
    const save = await topo.exec('gw', ['iptables-legacy-save', '-t', 'nat'], { timeoutMs: 60_000 });
    // The point of the test: more than spawnSync's default 1 MiB.
    expect(save.stdout.length).toBeGreaterThan(1.5 * 1024 * 1024);
  }, 120_000);
  afterAll(async () => {
    await topo?.cleanup();
  });

  it("finds natgw's chain in it", async () => {
    expect(await warmChainIn(topo, ['SHARED_DNAT', 'DNAT_FILTER'])).toBe('DNAT_FILTER');
  });

  it('answers cold when none of the chains it names is there', async () => {
    expect(await warmChainIn(topo, ['SHARED_DNAT', 'EXCLUSIVE_SNAT'])).toBe('undefined');
  });
});
