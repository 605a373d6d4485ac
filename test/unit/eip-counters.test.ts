import { describe, expect, it } from 'vitest';
import { accountingOf, elementsTx, skeletonTx } from '../../src/dataplane/eipCounters.js';
import { parseTableListing } from '../../src/dataplane/netfilter/nft/readback.js';

describe('per-EIP accounting (pure)', () => {
  it('adds and removes only the elements that changed, per family', () => {
    expect(elementsTx(new Set(['1.2.3.4', 'fd00::1']), ['1.2.3.4', '5.6.7.8']).text()).toBe(
      'add element inet natgw_acct eip_rx4 { 5.6.7.8 }\nadd element inet natgw_acct eip_tx4 { 5.6.7.8 }\n' +
        'delete element inet natgw_acct eip_rx6 { fd00::1 }\ndelete element inet natgw_acct eip_tx6 { fd00::1 }\n',
    );
    expect(elementsTx(new Set(['1.2.3.4']), ['1.2.3.4']).text()).toBe('');
    expect(skeletonTx().text()).toContain('add set inet natgw_acct eip_rx4 { type ipv4_addr; counter; }');
  });

  it('reads per-element counters from the nft listing and notices a damaged table', () => {
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
        { chain: { family: 'inet', table: 'natgw_acct', name: 'rx', handle: 2 } },
        { chain: { family: 'inet', table: 'natgw_acct', name: 'tx', handle: 3 } },
        { rule: { family: 'inet', table: 'natgw_acct', chain: 'rx', handle: 4 } },
        { rule: { family: 'inet', table: 'natgw_acct', chain: 'rx', handle: 5 } },
        { rule: { family: 'inet', table: 'natgw_acct', chain: 'tx', handle: 6 } },
        { rule: { family: 'inet', table: 'natgw_acct', chain: 'tx', handle: 7 } },
      ],
    };
    const r = accountingOf(parseTableListing(JSON.stringify(whole), 'inet', 'natgw_acct'));
    expect(r.complete).toBe(true);
    expect(r.traffic.get('1.2.3.4')).toEqual({ eip: '1.2.3.4', rxPackets: 4, rxBytes: 336, txPackets: 2, txBytes: 100 });
    const damaged = { nftables: whole.nftables.filter((x) => !('rule' in x)) };
    expect(accountingOf(parseTableListing(JSON.stringify(damaged), 'inet', 'natgw_acct')).complete).toBe(false);
  });
});
