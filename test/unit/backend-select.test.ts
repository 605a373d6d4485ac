/**
 * decideBackend (SPEC §4.3): an explicit mode wins; `auto` weighs a recorded choice, then the
 * rules natgw already owns, and with no evidence chooses iptables (the script's layout). The iptables variant: forced by
 * config, else recorded, else the one already holding natgw's chains, else the script's probe.
 * The evidence is a fake: every answer is set per case, every question asked is recorded.
 */
import { describe, expect, it } from 'vitest';
import type { Config } from '../../src/config/config.js';
import type { BackendRecord } from '../../src/state/store.js';
import type { IptablesVariant } from '../../src/dataplane/netfilter/iptables/tools.js';
import { decideBackend, instantiate, ownedElsewhere, sameChoice, type BackendEvidence } from '../../src/engine/backendSelect.js';
import type { Executor } from '../../src/system/exec.js';

interface Evidence {
  /** What the script's probe (`iptables-legacy -t nat -S INPUT 1`) says. */
  readonly probeVariant?: IptablesVariant;
  /** Variants whose tables hold natgw's chains. */
  readonly ownsIptables?: readonly IptablesVariant[];
  readonly ownsNft?: boolean;
}

class FakeProbe implements BackendEvidence {
  readonly asked: string[] = [];
  constructor(private readonly e: Evidence = {}) {}
  async iptablesVariant(): Promise<IptablesVariant> {
    this.asked.push('iptablesVariant');
    return this.e.probeVariant ?? 'nft';
  }
  async ownsIptables(v: IptablesVariant): Promise<boolean> {
    this.asked.push(`ownsIptables:${v}`);
    return (this.e.ownsIptables ?? []).includes(v);
  }
  async ownsNft(): Promise<boolean> {
    this.asked.push('ownsNft');
    return this.e.ownsNft ?? false;
  }
}

type Mode = Config['mode'];
type Variant = Config['iptablesVariant'];
const cfg = (mode: Mode, iptablesVariant: Variant = 'auto'): Pick<Config, 'mode' | 'iptablesVariant'> => ({ mode, iptablesVariant });

const NFT: BackendRecord = { kind: 'nftables' };
const LEGACY: BackendRecord = { kind: 'iptables', variant: 'legacy' };
const IPT_NFT: BackendRecord = { kind: 'iptables', variant: 'nft' };

/** Evidence that points every way at once: only the precedence decides. */
const EVERYTHING: Evidence = { probeVariant: 'legacy', ownsIptables: ['legacy', 'nft'], ownsNft: true };

describe('decideBackend: an explicit mode wins', () => {
  it('nftables, whatever is recorded or owned, without probing', async () => {
    for (const record of [undefined, NFT, LEGACY, IPT_NFT]) {
      const probe = new FakeProbe(EVERYTHING);
      expect(await decideBackend(cfg('nftables'), record, probe)).toEqual({ kind: 'nftables' });
      expect(await decideBackend(cfg('nftables', 'legacy'), record, probe)).toEqual({ kind: 'nftables' });
      expect(probe.asked).toEqual([]);
    }
  });

  it('iptables with a forced variant, without probing, even against the record and owned rules', async () => {
    for (const record of [undefined, NFT, LEGACY, IPT_NFT]) {
      for (const v of ['legacy', 'nft'] as const) {
        const probe = new FakeProbe(EVERYTHING);
        expect(await decideBackend(cfg('iptables', v), record, probe)).toEqual({ kind: 'iptables', variant: v });
        expect(probe.asked).toEqual([]);
      }
    }
  });

  it('iptables, variant auto: the recorded variant first', async () => {
    const probe = new FakeProbe({ probeVariant: 'nft', ownsIptables: ['nft'] });
    expect(await decideBackend(cfg('iptables'), LEGACY, probe)).toEqual({ kind: 'iptables', variant: 'legacy' });
    expect(probe.asked).toEqual([]);
    expect(await decideBackend(cfg('iptables'), IPT_NFT, new FakeProbe({ probeVariant: 'legacy', ownsIptables: ['legacy'] }))).toEqual({
      kind: 'iptables',
      variant: 'nft',
    });
  });

  it('iptables, variant auto, nothing recorded: the variant that holds natgw chains, else the script probe', async () => {
    // Two variants are never mixed: natgw's chains in the nft variant win over a probe saying legacy.
    expect(await decideBackend(cfg('iptables'), undefined, new FakeProbe({ probeVariant: 'legacy', ownsIptables: ['nft'] }))).toEqual({
      kind: 'iptables',
      variant: 'nft',
    });
    expect(await decideBackend(cfg('iptables'), undefined, new FakeProbe({ probeVariant: 'nft', ownsIptables: ['legacy'] }))).toEqual({
      kind: 'iptables',
      variant: 'legacy',
    });
    for (const v of ['legacy', 'nft'] as const) {
      const probe = new FakeProbe({ probeVariant: v });
      expect(await decideBackend(cfg('iptables'), undefined, probe)).toEqual({ kind: 'iptables', variant: v });
      expect(probe.asked).toContain('iptablesVariant');
    }
    // A recorded nftables choice says nothing about the iptables variant.
    expect(await decideBackend(cfg('iptables'), NFT, new FakeProbe({ probeVariant: 'legacy' }))).toEqual({ kind: 'iptables', variant: 'legacy' });
  });
});

describe('decideBackend: auto', () => {
  it('a recorded choice wins over everything else in the namespace', async () => {
    const probe = new FakeProbe(EVERYTHING);
    expect(await decideBackend(cfg('auto'), NFT, probe)).toEqual({ kind: 'nftables' });
    expect(probe.asked).toEqual([]);
    expect(await decideBackend(cfg('auto'), LEGACY, new FakeProbe({ ownsNft: true, ownsIptables: ['nft'], probeVariant: 'nft' }))).toEqual(LEGACY);
    expect(await decideBackend(cfg('auto'), IPT_NFT, new FakeProbe({ ownsNft: true, ownsIptables: ['legacy'], probeVariant: 'legacy' }))).toEqual(IPT_NFT);
  });

  it('a pending cleanup in the record does not change the choice', async () => {
    const record: BackendRecord = { kind: 'nftables', pendingCleanup: { kind: 'iptables', variant: 'legacy' } };
    expect(await decideBackend(cfg('auto'), record, new FakeProbe({ ownsIptables: ['legacy'] }))).toEqual({ kind: 'nftables' });
  });

  it('a forced variant applies to a recorded iptables choice (a variant switch)', async () => {
    expect(await decideBackend(cfg('auto', 'nft'), LEGACY, new FakeProbe())).toEqual(IPT_NFT);
    expect(await decideBackend(cfg('auto', 'legacy'), IPT_NFT, new FakeProbe())).toEqual(LEGACY);
    // ...but never turns a recorded nftables choice into iptables.
    expect(await decideBackend(cfg('auto', 'legacy'), NFT, new FakeProbe())).toEqual(NFT);
  });

  it('nothing recorded: natgw nftables table first, then natgw iptables chains', async () => {
    expect(await decideBackend(cfg('auto'), undefined, new FakeProbe({ ownsNft: true, ownsIptables: ['legacy'] }))).toEqual(NFT);
    // Owned iptables chains keep their variant over the probe (an upgrade from the script keeps its rules' home).
    expect(await decideBackend(cfg('auto'), undefined, new FakeProbe({ ownsIptables: ['legacy'], probeVariant: 'nft' }))).toEqual(LEGACY);
    expect(await decideBackend(cfg('auto'), undefined, new FakeProbe({ ownsIptables: ['nft'], probeVariant: 'legacy' }))).toEqual(IPT_NFT);
  });

  it("nothing recorded or owned: iptables (the script's layout) with the probed or forced variant", async () => {
    for (const v of ['legacy', 'nft'] as const) {
      const probe = new FakeProbe({ probeVariant: v });
      expect(await decideBackend(cfg('auto'), undefined, probe)).toEqual({ kind: 'iptables', variant: v });
      // natgw's own nft table is the evidence that would have kept nftables: it was looked for.
      expect(probe.asked).toContain('ownsNft');
    }
    const forced = new FakeProbe({ probeVariant: 'legacy' });
    expect(await decideBackend(cfg('auto', 'nft'), undefined, forced)).toEqual(IPT_NFT);
    expect(forced.asked).not.toContain('iptablesVariant');
  });
});

describe('ownedElsewhere: where to switch from without a record, what is left after a cleanup', () => {
  it('finds natgw objects in any backend but the chosen one', async () => {
    expect(await ownedElsewhere(new FakeProbe({ ownsNft: true }), LEGACY)).toEqual(NFT);
    expect(await ownedElsewhere(new FakeProbe({ ownsIptables: ['legacy'] }), NFT)).toEqual(LEGACY);
    expect(await ownedElsewhere(new FakeProbe({ ownsIptables: ['nft'] }), LEGACY)).toEqual(IPT_NFT);
    expect(await ownedElsewhere(new FakeProbe({ ownsIptables: ['legacy', 'nft'] }), LEGACY)).toEqual(IPT_NFT);
  });

  it('ignores the chosen backend itself, and answers undefined when nothing else is owned', async () => {
    expect(await ownedElsewhere(new FakeProbe({ ownsNft: true }), NFT)).toBeUndefined();
    expect(await ownedElsewhere(new FakeProbe({ ownsIptables: ['legacy'] }), LEGACY)).toBeUndefined();
    const probe = new FakeProbe({});
    expect(await ownedElsewhere(probe, NFT)).toBeUndefined();
    expect(probe.asked).toEqual(['ownsIptables:legacy', 'ownsIptables:nft']);
  });
});

describe('sameChoice and instantiate', () => {
  it('nftables ignores the variant; iptables compares it', () => {
    expect(sameChoice(NFT, { kind: 'nftables', variant: 'legacy' })).toBe(true);
    expect(sameChoice(LEGACY, LEGACY)).toBe(true);
    expect(sameChoice(LEGACY, IPT_NFT)).toBe(false);
    expect(sameChoice(LEGACY, NFT)).toBe(false);
  });

  it('builds the backend of the choice', () => {
    const exec: Executor = {
      run: () => Promise.reject(new Error('not used')),
    };
    expect(instantiate(NFT, exec).kind).toBe('nftables');
    const legacy = instantiate(LEGACY, exec);
    expect(legacy.kind).toBe('iptables');
    expect((legacy as unknown as { variant: string }).variant).toBe('legacy');
    expect((instantiate(IPT_NFT, exec) as unknown as { variant: string }).variant).toBe('nft');
  });
});
