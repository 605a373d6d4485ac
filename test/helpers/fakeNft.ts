/**
 * An in-memory nftables behind NftClient (knftables' fake.go, made transactional): tables of
 * chains (rules with handles) and sets/maps (elements), changed only by whole transactions,
 * listed in the dump shape the read-back parses from `nft -j`.
 *
 * Faithful to nft 1.0.6 on Linux 6.x where natgw can tell (test/netns/fake-nft-faithful.test.ts
 * compares it with the kernel step by step):
 * - a transaction applies all or nothing; a refusal is an ExecError with the kernel's words
 *   (ENOENT for a missing element, rule handle, chain or table; EEXIST for a map key already
 *   bound to another value or a set declared otherwise; EBUSY for a chain that still has rules
 *   or is jumped to, or a set a rule still uses; EOPNOTSUPP for re-hooking a base chain);
 * - handles come from one counter per table (chains, named and anonymous sets, rules), restart
 *   with a new table, and stay consumed by a refused transaction that reached the kernel, as the
 *   kernel does not roll the counter back; nft itself refuses a script naming a set that does
 *   not exist, or a rule position that does not, before sending anything: then nothing is consumed.
 *
 * Rules carry the JSON their owner says the kernel lists (NftRule.expr); a rule without it (text
 * handed to run(), a foreign rule) is kept opaque: listed as `[{ "opaque": text }]`, which no
 * read-back recognises, exactly as natgw treats a rule it did not write.
 *
 * Not modelled: counters that count (always 0), element timeouts and intervals, key types
 * (elements are compared as canonical text), the policy of packets, other tables' families'
 * checks, and which of several errors nft would report first (the first met is reported).
 */
import { ExecError } from '../../src/system/exec.js';
import type { NftClient } from '../../src/dataplane/netfilter/nft/client.js';
import type { NftChainDump, NftSetDump, NftTableDump } from '../../src/dataplane/netfilter/nft/types.js';
import { opText, type NftTableFamily, type NftTransaction } from '../../src/dataplane/netfilter/nft/transaction.js';
import { Batch, Refusal, tableKey, type Errno, type FakeTable } from './fakeNftKernel.js';
import { parseNftScript } from './fakeNftScript.js';

export { canonicalElement, type Errno } from './fakeNftKernel.js';

export type FakeNftCall =
  | { readonly kind: 'list'; readonly family: NftTableFamily; readonly table: string }
  | { readonly kind: 'run'; readonly script: string; readonly refused?: string };

export class FakeNftClient implements NftClient {
  private tables = new Map<string, FakeTable>();
  /** Every list and run, in order (a run's script as `nft -f -` would read it). */
  readonly calls: FakeNftCall[] = [];
  /**
   * A fault to inject: called with each script before it is applied; an errno refuses it
   * (by the kernel: handles stay consumed) as if the kernel had said so.
   */
  fault: ((script: string) => Errno | undefined) | undefined;

  /** nftables answers; set false to play a node without it. */
  works = true;

  async present(): Promise<boolean> {
    return this.works;
  }

  async list(family: NftTableFamily, table: string): Promise<NftTableDump | null> {
    this.calls.push({ kind: 'list', family, table });
    return this.dump(family, table);
  }

  async run(tx: NftTransaction | string): Promise<void> {
    const parsed = typeof tx === 'string' ? parseNftScript(tx) : tx;
    const script = parsed.text();
    if (parsed.isEmpty) return;
    const refused = this.apply(parsed, script);
    this.calls.push({ kind: 'run', script, ...(refused ? { refused: refused.stderr } : {}) });
    if (refused) throw refused;
  }

  /** Apply without recording (a change behind natgw's back). */
  mutate(tx: NftTransaction | string): void {
    const parsed = typeof tx === 'string' ? parseNftScript(tx) : tx;
    const refused = this.apply(parsed, parsed.text());
    if (refused) throw refused;
  }

  private apply(tx: NftTransaction, script: string): ExecError | undefined {
    const batch = new Batch(this.tables);
    const injected = this.fault?.(script);
    for (const op of tx.ops) batch.apply(op);
    if (!batch.first && !injected) {
      this.tables = batch.tables;
      return undefined;
    }
    if (!batch.refusedByNft) for (const [copy, live] of batch.origin) live.counter = copy.counter;
    const refusal = batch.first?.refusal ?? new Refusal(injected as Errno, 'kernel');
    const line = batch.first ? opText(batch.first.op) : '';
    const stderr = `Error: ${refusal.by === 'kernel' ? 'Could not process rule: ' : ''}${refusal.message}\n${line}\n`;
    return new ExecError({ command: 'nft -f -', exitCode: 1, stdout: '', stderr: stderr, timedOut: false, failedToStart: false }, 'the transaction', script);
  }

  /** A table as the read-back would parse it from `nft -j list table`; null when absent. */
  dump(family: NftTableFamily, table: string): NftTableDump | null {
    const t = this.tables.get(tableKey(family, table));
    if (!t) return null;
    const chains = new Map<string, NftChainDump>(
      [...t.chains.values()].map((c) => [
        c.name,
        {
          name: c.name,
          handle: c.handle,
          ...(c.base ? { base: { ...c.base } } : {}),
          rules: c.rules.map((r) => ({ handle: r.handle, expr: structuredClone([...r.expr]) })),
        },
      ]),
    );
    const sets = new Map<string, NftSetDump>(
      [...t.sets.values()].map((s) => [
        s.name,
        {
          name: s.name,
          handle: s.handle,
          kind: s.kind,
          type: s.type,
          ...(s.map !== undefined ? { map: s.map } : {}),
          flags: [],
          ...(s.counter ? { counter: true } : {}),
          elements: [...s.elements].map(([k, v]) => ({
            key: k,
            ...(v !== undefined ? { value: v } : {}),
            ...(s.counter ? { counter: { packets: 0, bytes: 0 } } : {}),
          })),
        },
      ]),
    );
    return { family, name: table, chains, sets };
  }

  /** `family name` of every table, in creation order. */
  tableNames(): string[] {
    return [...this.tables.keys()];
  }
}
