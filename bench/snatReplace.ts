/**
 * `node dist/bench/snatReplace.js [count] [backend...]`: one PUT /v1/state holding `count` SNAT
 * CIDRs, then one replacing every one of them with others (the "replacing 10,000 SNAT
 * CIDRs in one PUT completes in about a second"). A sync with superlinear work (a diff of two
 * long chains by longest common subsequence, a positional delete per rule) shows here.
 */
import { Gateway } from './gateway.js';

interface Figures {
  readonly backend: string;
  readonly count: number;
  readonly fillMs: number;
  readonly replaceMs: number;
  readonly againMs: number;
}

function doc(count: number, second: number): unknown {
  const snats = Array.from({ length: count }, (_, i) => ({
    eip: '172.20.0.10',
    cidr: `${second}.${(i >> 8) & 255}.${i & 255}.0/24`,
    randomFully: i % 2 === 0,
  }));
  return { initialized: true, interfaces: { vpc: 'eth0', ext: 'net1' }, eips: [{ address: '172.20.0.10', prefixLength: 16 }], snats, dnats: [], fips: [] };
}

export async function snatReplaceFigures(backend: 'nftables' | 'iptables', count: number): Promise<Figures> {
  const gw = await Gateway.withDaemon({ backend, resync: '1h' });
  try {
    const fill = await gw.putState(doc(count, 10));
    const replace = await gw.putState(doc(count, 11));
    // The same document again: nothing to do, and nothing should be done.
    const again = await gw.putState(doc(count, 11));
    return { backend, count, fillMs: Math.round(fill.ms), replaceMs: Math.round(replace.ms), againMs: Math.round(again.ms) };
  } finally {
    await gw.cleanup();
  }
}

async function main(): Promise<void> {
  const count = Number(process.argv[2] ?? 10000);
  const backends = (process.argv.slice(3).length ? process.argv.slice(3) : ['nftables', 'iptables']) as Array<'nftables' | 'iptables'>;
  for (const b of backends) {
    const f = await snatReplaceFigures(b, count);
    console.log(`${f.backend}: ${f.count} SNAT — fill ${f.fillMs} ms, replace all ${f.replaceMs} ms, same document again ${f.againMs} ms`);
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((e: unknown) => {
    console.error(e);
    process.exit(1);
  });
}
