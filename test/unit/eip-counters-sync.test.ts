/**
 * EipCounters: every change lists the accounting table and applies only what takes it to the
 * EIPs given. accountingTx is the piece an nft backend can fold into its own transaction.
 */
import { describe, expect, it } from 'vitest';
import { ACCT_TABLE, EipCounters, accountingTx, elementsTx, skeletonTx } from '../../src/dataplane/eipCounters.js';

const renderAccountingChange = (have: ReadonlySet<string> | undefined, want: readonly string[], opts: { absent?: boolean } = {}): string =>
  accountingTx(have, want, opts).text();
import type { ExecRequest, ExecResult } from '../../src/system/exec.js';
import { RecordingExecutor } from '../helpers/execCalls.js';

const LIST = `nft -j list table inet ${ACCT_TABLE}`;
const cmd = (c: ExecRequest): string => [c.file, ...c.args].join(' ');

/** `nft -j list table inet natgw_acct` of a whole table holding `eips` (counters included). */
function listing(eips: readonly string[]): string {
  const elems = (fam: 4 | 6) => eips.filter((e) => e.includes(':') === (fam === 6)).map((val) => ({ elem: { val, counter: { packets: 1, bytes: 60 } } }));
  const set = (name: string, fam: 4 | 6) => {
    const elem = elems(fam);
    return {
      set: {
        family: 'inet',
        name,
        table: ACCT_TABLE,
        type: fam === 4 ? 'ipv4_addr' : 'ipv6_addr',
        handle: 1,
        flags: ['counter'],
        ...(elem.length ? { elem } : {}),
      },
    };
  };
  const chain = (name: string) => ({ chain: { family: 'inet', table: ACCT_TABLE, name, handle: 2 } });
  const rule = (chain: string) => ({ rule: { family: 'inet', table: ACCT_TABLE, chain, handle: 3, expr: [] } });
  return JSON.stringify({
    nftables: [
      { metainfo: {} },
      { table: { family: 'inet', name: ACCT_TABLE, handle: 1 } },
      set('eip_rx4', 4),
      set('eip_tx4', 4),
      set('eip_rx6', 6),
      set('eip_tx6', 6),
      chain('rx'),
      chain('tx'),
      rule('rx'),
      rule('rx'),
      rule('tx'),
      rule('tx'),
    ],
  });
}

function fakeNft(table: () => string | null, refuse: () => boolean = () => false) {
  return new RecordingExecutor((req): Partial<ExecResult> | undefined => {
    if (cmd(req) === LIST) {
      const t = table();
      return t === null ? { exitCode: 1, stderr: 'Error: No such file or directory\n' } : { stdout: t };
    }
    if (cmd(req) === 'nft -f -' && refuse()) return { exitCode: 1, stderr: 'Error: boom\n' };
    return undefined;
  });
}

describe('EipCounters: sync', () => {
  it('lists the table, then runs only the element change', async () => {
    const x = fakeNft(() => listing(['1.2.3.4', 'fd00::1']));
    const want = ['1.2.3.4', '5.6.7.8'];
    expect(await new EipCounters(x).sync(want)).toBe(4);
    expect(x.calls.map(cmd)).toEqual([LIST, 'nft -f -']);
    expect(x.calls[1]!.input).toBe(elementsTx(new Set(['1.2.3.4', 'fd00::1']), want).text());
    const y = fakeNft(() => listing(want));
    expect(await new EipCounters(y).sync(want)).toBe(0);
  });

  it('a failed apply is logged, never thrown; the next sync lists and applies again', async () => {
    let refuse = true;
    const x = fakeNft(
      () => listing(['1.2.3.4']),
      () => refuse,
    );
    const c = new EipCounters(x);
    expect(await c.sync(['5.6.7.8'])).toBe(0);
    refuse = false;
    x.calls.length = 0;
    expect(await c.sync(['5.6.7.8'])).toBe(4);
    expect(x.calls.map(cmd)).toEqual([LIST, 'nft -f -']);
  });

  it('a table found absent is created, not deleted first (no RCU wait); the fold creates it too', async () => {
    const x = fakeNft(() => null);
    await new EipCounters(x).sync(['1.2.3.4']);
    expect(x.calls.map(cmd)).toEqual([LIST, 'nft -f -']);
    expect(x.calls[1]!.input).toBe(renderAccountingChange(undefined, ['1.2.3.4'], { absent: true }));
    expect(x.calls[1]!.input).toMatch(new RegExp(`^create table inet ${ACCT_TABLE}\n`));
    expect(x.calls[1]!.input).not.toMatch(/^delete table/m);
    expect((await new EipCounters(fakeNft(() => null)).change(['1.2.3.4']))?.text()).toBe(renderAccountingChange(undefined, ['1.2.3.4'], { absent: true }));
  });

  it('a damaged table is rebuilt whole', async () => {
    const damaged = JSON.stringify({ nftables: [{ table: { family: 'inet', name: ACCT_TABLE } }] });
    const x = fakeNft(() => damaged);
    await new EipCounters(x).sync(['1.2.3.4']);
    expect(x.calls[1]!.input).toBe(renderAccountingChange(undefined, ['1.2.3.4']));
  });
});

describe('renderAccountingChange (pure)', () => {
  it('with the sets known: only the element changes', () => {
    expect(renderAccountingChange(new Set(['1.2.3.4']), ['5.6.7.8'])).toBe(elementsTx(new Set(['1.2.3.4']), ['5.6.7.8']).text());
    expect(renderAccountingChange(new Set(['1.2.3.4']), ['1.2.3.4'])).toBe('');
  });

  it('unknown: the whole table from scratch, valid whether or not it exists', () => {
    expect(renderAccountingChange(undefined, ['1.2.3.4'])).toBe(
      `add table inet ${ACCT_TABLE}\ndelete table inet ${ACCT_TABLE}\n${skeletonTx().text()}${elementsTx(new Set(), ['1.2.3.4']).text()}`,
    );
  });
});
