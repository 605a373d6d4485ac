import { describe, expect, it } from 'vitest';
import { parseAccounting, renderElements, renderSkeleton } from '../../src/dataplane/eipCounters.js';

describe('per-EIP accounting (pure)', () => {
  it('adds and removes only the elements that changed, per family', () => {
    expect(renderElements(new Set(['1.2.3.4', 'fd00::1']), ['1.2.3.4', '5.6.7.8'])).toBe(
      'add element inet natgw_acct eip_rx4 { 5.6.7.8 }\nadd element inet natgw_acct eip_tx4 { 5.6.7.8 }\n' +
        'delete element inet natgw_acct eip_rx6 { fd00::1 }\ndelete element inet natgw_acct eip_tx6 { fd00::1 }\n',
    );
    expect(renderElements(new Set(['1.2.3.4']), ['1.2.3.4'])).toBe('');
    expect(renderSkeleton()).toContain('add set inet natgw_acct eip_rx4 { type ipv4_addr; counter; }');
  });

  it('reads per-element counters from nft JSON and notices a damaged table', () => {
    const set = (name: string, elem?: unknown[]) => ({
      set: { family: 'inet', name, table: 'natgw_acct', type: 'ipv4_addr', handle: 1, ...(elem ? { elem } : {}) },
    });
    const whole = {
      nftables: [
        { metainfo: {} },
        { table: { family: 'inet', name: 'natgw_acct' } },
        set('eip_rx4', [{ elem: { val: '1.2.3.4', counter: { packets: 4, bytes: 336 } } }]),
        set('eip_tx4', [{ elem: { val: '1.2.3.4', counter: { packets: 2, bytes: 100 } } }]),
        set('eip_rx6'),
        set('eip_tx6'),
        { chain: { name: 'rx' } },
        { chain: { name: 'tx' } },
        { rule: {} },
        { rule: {} },
        { rule: {} },
        { rule: {} },
      ],
    };
    const r = parseAccounting(JSON.stringify(whole));
    expect(r.complete).toBe(true);
    expect(r.traffic.get('1.2.3.4')).toEqual({ eip: '1.2.3.4', rxPackets: 4, rxBytes: 336, txPackets: 2, txBytes: 100 });
    const damaged = { nftables: whole.nftables.filter((x) => !('rule' in x)) };
    expect(parseAccounting(JSON.stringify(damaged)).complete).toBe(false);
  });
});
