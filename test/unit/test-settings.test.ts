/** The suite's own switches: a typo in one must fail loudly, never quietly test less. */
import { describe, expect, it } from 'vitest';
import { backendsFrom } from '../helpers/backends.js';
import { DEFAULT_PROP_SEED, propSeedFrom } from '../setup/propSeed.js';

describe('NATGW_TEST_BACKENDS', () => {
  it('unset or empty: every backend', () => {
    expect(backendsFrom(undefined).map((b) => b.name)).toEqual(['iptables-legacy', 'iptables-nft', 'nftables']);
    expect(backendsFrom('').map((b) => b.name)).toEqual(['iptables-legacy', 'iptables-nft', 'nftables']);
  });
  it('narrows to the backends named', () => {
    expect(backendsFrom('nftables, iptables-legacy').map((b) => b.name)).toEqual(['iptables-legacy', 'nftables']);
  });
  it('refuses a name that is not a backend, naming it and the valid ones', () => {
    expect(() => backendsFrom('nftables,iptables')).toThrow(/unknown backend "iptables"; the backends are iptables-legacy, iptables-nft, nftables/);
    expect(() => backendsFrom('nft')).toThrow(/unknown backend "nft"/);
  });
});

describe('NATGW_PROP_SEED', () => {
  it('unset: the fixed seed; an integer: that seed', () => {
    expect(propSeedFrom(undefined)).toBe(DEFAULT_PROP_SEED);
    expect(propSeedFrom('42')).toBe(42);
  });
  it('"random" draws a seed (never NaN, never the fixed one by accident of parsing)', () => {
    expect(propSeedFrom('random', () => 123456)).toBe(123456);
    const drawn = propSeedFrom('random');
    expect(Number.isSafeInteger(drawn)).toBe(true);
  });
  it('refuses anything else', () => {
    for (const bad of ['rand', '1.5', '0x10', 'NaN', '1e3']) expect(() => propSeedFrom(bad), bad).toThrow(/integer or "random"/);
  });
});
