/**
 * `node dist/bench/abCommands.js [size] [nftables|iptables] [rounds] <other-build>/dist/bench/gateway.js`:
 * two gateways filled to `size`, one with this build's daemon and one with another build's (a
 * checkout of an older commit, built), and the per-command API requests sent to them alternately,
 * one by one, in alternating order: both see the same load on the machine, so the ratio of their
 * medians holds where a figure from a busy machine does not.
 */
import { abPair } from './abPair.js';
import { api } from './daemon.js';
import { median } from './stats.js';

async function main(): Promise<void> {
  const size = Number(process.argv[2] ?? 20);
  const backend = (process.argv[3] ?? 'iptables') as 'nftables' | 'iptables';
  const rounds = Number(process.argv[4] ?? 40);
  const other = process.argv[5];
  if (!other) throw new Error('usage: abCommands.js [size] [backend] [rounds] <other build>/dist/bench/gateway.js');
  const gws = await abPair(other, backend, size);
  try {
    const eip = '172.20.0.10';
    const steps: Array<[string, string, string, unknown?]> = [
      ['PUT dnat', 'PUT', `/v1/dnats/${eip},40001,tcp`, { internalIp: '10.0.1.6', internalPort: 80 }],
      ['DELETE dnat', 'DELETE', `/v1/dnats/${eip},40001,tcp`],
      ['PUT snat', 'PUT', `/v1/snats/${eip},10.250.1.0%2F24`, {}],
      ['DELETE snat', 'DELETE', `/v1/snats/${eip},10.250.1.0%2F24`],
      ['PUT fip', 'PUT', '/v1/fips/172.20.0.10', { internalIp: '10.0.9.9' }],
      ['DELETE fip', 'DELETE', '/v1/fips/172.20.0.10'],
    ];
    const ms: Record<'other' | 'this', Record<string, number[]>> = { other: {}, this: {} };
    for (let i = 0; i < rounds; i++) {
      for (const [what, method, path, body] of steps) {
        for (const which of (i % 2 ? ['this', 'other'] : ['other', 'this']) as Array<'other' | 'this'>) {
          const t0 = performance.now();
          const r = await api(gws[which].socket, method, path, body);
          if (r.status >= 300) throw new Error(`${which} build: ${what} answered ${r.status}: ${r.text}`);
          (ms[which][what] ??= []).push(performance.now() - t0);
        }
      }
    }
    console.log(`${backend}, size ${size}, ${rounds} rounds: median ms, other build / this build (this ÷ other)`);
    for (const [what] of steps) {
      const a = median(ms.other[what] ?? []);
      const b = median(ms.this[what] ?? []);
      console.log(`${what.padEnd(12)} ${a.toFixed(2).padStart(7)} ${b.toFixed(2).padStart(7)}  ×${(b / a).toFixed(2)}`);
    }
  } finally {
    for (const gw of Object.values(gws)) await gw.cleanup();
  }
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
