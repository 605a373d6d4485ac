/**
 * Partial sync of both netfilter backends on a real kernel: a random walk of changes applied
 * with `mode: 'partial'` (planned against what the backend applied last, nothing read back)
 * must leave the kernel exactly where a full sync would: a NEW backend instance reading the
 * kernel back finds nothing to change. A partial transaction the kernel refuses (an object
 * removed by hand) fails, and the backend's next sync reads back and repairs.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NatTables, NetfilterBackend } from '../../src/dataplane/netfilter/backend.js';
import { NftBackend } from '../../src/dataplane/netfilter/nft/backend.js';
import { IptablesBackend } from '../../src/dataplane/netfilter/iptables/backend.js';
import type { Dnat, Fip, Snat } from '../../src/model/rules.js';
import type { ExecRequest, Executor } from '../../src/system/exec.js';
import { RecordedExecutor, RecordingExecutor } from '../helpers/execCalls.js';
import { createTopology, type Topology } from '../helpers/netns.js';
import { NetnsExecutor } from '../helpers/netnsExecutor.js';
import { prng } from '../helpers/prng.js';

const HOOK_TIMEOUT = 60_000;

/** A listing: `nft list …`, `iptables-…-save` (under `ip netns exec`, the tool is an argument). */
const isRead = (r: ExecRequest): boolean => [r.file, ...r.args].some((a) => a === 'list' || a.endsWith('-save'));

const dnat = (i: number, to: number): Dnat => ({
  eip: `172.20.0.${10 + (i % 5)}`,
  port: 1000 + i,
  protocol: i % 3 === 0 ? 'udp' : 'tcp',
  internalIp: `10.0.1.${to}`,
  internalPort: 80 + (i % 7),
});
const fip = (i: number, to: number): Fip => ({ eip: `172.20.1.${i}`, internalIp: `10.0.2.${to}` });
const snat = (i: number): Snat => {
  const len = [24, 16, 32][i % 3]!;
  const cidr = len === 24 ? `10.${i % 4}.${i}.0/24` : len === 16 ? `10.${i}.0.0/16` : `10.9.${i}.1/32`;
  return { eip: `172.20.0.${10 + (i % 3)}`, cidr, randomFully: i % 2 === 0 };
};
/** One random step: add, change or remove a DNAT, FIP, SNAT or EIP (references kept, as the engine's operations do). */
function step(t: NatTables, rnd: () => number): NatTables {
  const i = Math.floor(rnd() * 30);
  const to = 2 + Math.floor(rnd() * 5);
  const pick = Math.floor(rnd() * 8);
  const dkey = (d: Dnat) => `${d.eip}/${d.port}/${d.protocol}`;
  switch (pick) {
    case 0:
    case 1: {
      const d = dnat(i, to);
      return { ...t, dnats: [...t.dnats.filter((x) => dkey(x) !== dkey(d)), d] };
    }
    case 2:
      return { ...t, dnats: t.dnats.filter((x) => dkey(x) !== dkey(dnat(i, 0))) };
    case 3: {
      // Several FIPs may bind one internal IP: the lowest EIP SNATs it.
      const f = fip(i, to);
      return { ...t, fips: [...t.fips.filter((x) => x.eip !== f.eip), f] };
    }
    case 4:
      return { ...t, fips: t.fips.filter((x) => x.eip !== fip(i, 0).eip) };
    case 5: {
      const s = snat(i);
      if (t.snats.some((x) => x.eip === s.eip && x.cidr === s.cidr)) return t;
      const len = Number(s.cidr.split('/')[1]);
      const at = t.snats.findIndex((x) => Number(x.cidr.split('/')[1]) < len);
      const snats = [...t.snats];
      snats.splice(at === -1 ? snats.length : at, 0, s);
      return { ...t, snats };
    }
    case 6:
      return { ...t, snats: t.snats.filter((x) => !(x.cidr === snat(i).cidr && x.eip === snat(i).eip)) };
    default: {
      const e = `172.20.0.${10 + (i % 8)}`;
      return { ...t, eips: t.eips.includes(e) ? t.eips.filter((x) => x !== e) : [...t.eips, e] };
    }
  }
}

const START: NatTables = { vpcIf: 'eth0', extIf: 'net1', eips: ['172.20.0.10'], snats: [], dnats: [], fips: [] };

const CASES: ReadonlyArray<{ name: string; make: (e: Executor) => NetfilterBackend }> = [
  { name: 'nftables', make: (e) => new NftBackend(e) },
  { name: 'iptables-legacy', make: (e) => new IptablesBackend(e, 'legacy') },
  { name: 'iptables-nft', make: (e) => new IptablesBackend(e, 'nft') },
];

describe.each(CASES)('partial netfilter sync ($name)', ({ name, make }) => {
  let topo: Topology;

  beforeAll(async () => {
    topo = await createTopology();
  }, HOOK_TIMEOUT);

  afterAll(async () => {
    await topo?.cleanup();
  }, HOOK_TIMEOUT);

  it('a random walk of partial syncs leaves the kernel as a full sync would, reading nothing back', async () => {
    // The real executor, remembering what ran (to prove a partial sync reads nothing back).
    const exec = new RecordedExecutor(new NetnsExecutor(topo.ns.gw));
    const backend = make(exec);
    await backend.sync(START, { mode: 'full' });
    const rnd = prng(name.length * 7919);
    let t = START;
    for (let k = 0; k < 120; k++) {
      t = step(t, rnd);
      exec.calls.length = 0;
      await backend.sync(t, { mode: 'partial' });
      expect(
        exec.calls.filter(isRead).map((c) => [c.file, ...c.args].join(' ')),
        `step ${k}`,
      ).toEqual([]);
      if (k % 20 === 19) {
        const fresh = make(new NetnsExecutor(topo.ns.gw));
        const check = await fresh.sync(t, { mode: 'full', dryRun: true });
        expect(check.script, `step ${k}: a full read-back still finds work`).toBe('');
      }
    }
    expect(t.dnats.length + t.fips.length + t.snats.length).toBeGreaterThan(10);
  }, 120_000);

  it('a refused partial transaction fails, and the next sync reads back and repairs', async () => {
    const backend = make(new NetnsExecutor(topo.ns.gw));
    const a: NatTables = { ...START, dnats: [dnat(1, 5), dnat(2, 5)] };
    await backend.sync(a, { mode: 'full' });
    // Someone removes natgw's DNAT by hand; the partial delete of it then fails in the kernel.
    if (name === 'nftables')
      await topo.exec('gw', ['nft', 'delete', 'element', 'ip', 'natgw', 'port_dnat', `{ ${a.dnats[0]!.eip} . ${a.dnats[0]!.protocol} . ${a.dnats[0]!.port} }`]);
    else await topo.exec('gw', [`iptables-${name.split('-')[1]}`, '-t', 'nat', '-F', 'SHARED_DNAT']);
    const b: NatTables = { ...a, dnats: [a.dnats[1]!] };
    await expect(backend.sync(b, { mode: 'partial' })).rejects.toThrow();
    // Forgotten after the refusal: this "partial" sync reads back and repairs.
    await backend.sync(b, { mode: 'partial' });
    const fresh = make(new NetnsExecutor(topo.ns.gw));
    expect((await fresh.sync(b, { mode: 'full', dryRun: true })).script).toBe('');
  }, 60_000);
});

describe('partial netfilter sync without a kernel', () => {
  it('runs exactly one transaction per change (nftables), whatever the number of objects', async () => {
    const exec = new RecordingExecutor((r) => (r.args.includes('list') ? { exitCode: 1, stderr: 'Error: No such file or directory' } : undefined));
    const nft = new NftBackend(exec);
    const many: NatTables = { ...START, dnats: Array.from({ length: 5000 }, (_, i) => ({ ...dnat(i, 5), port: 1000 + i })) };
    await nft.sync(many, { mode: 'full' });
    exec.calls.length = 0;
    const d = dnat(9999, 6);
    const one = { ...many, dnats: [...many.dnats, d] };
    const r = await nft.sync(one, { mode: 'partial' });
    expect(exec.calls.map((c) => [c.file, ...c.args].join(' '))).toEqual(['nft -f -']);
    expect(exec.calls[0]!.input).toBe(`add element ip natgw port_dnat { ${d.eip} . ${d.protocol} . ${d.port} : ${d.internalIp} . ${d.internalPort} }\n`);
    expect(r.changes).toBe(1);
  });
});
