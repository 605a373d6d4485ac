/**
 * `node dist/bench/abBurst.js [size] [nftables|iptables] [rounds] [burst] <other-build>/dist/bench/gateway.js`:
 * a controller's redo, as a burst of `burst` script commands sent at once (`POST /v1/legacy`, what
 * the shim sends), to two gateways filled to `size`: one with this build's daemon and one with
 * another build's (a checkout built without a mechanism, say). Each round sends a burst of
 * `dnat-add` and then one of `dnat-del` to each gateway in turn, the order alternating, and takes
 * the kernel floor beside it (one bare `nft add element`; one `iptables-restore --noflush`), so
 * that each burst's wall time reads as a ratio against a floor of the same run.
 */
import { abPair } from './abPair.js';
import type { Gateway } from './gateway.js';
import { api, type ApiResponse } from './daemon.js';
import { openKernelFloor } from './floors.js';
import { median } from './stats.js';

type Which = 'other' | 'this';

/**
 * One request; a connection the socket's full backlog refused is tried again, as the shim's
 * client (`nc -U`, a blocking connect) waits in connect.
 */
async function legacy(gw: Gateway, command: string, rule: string): Promise<ApiResponse> {
  for (;;) {
    try {
      return await api(gw.socket, 'POST', '/v1/legacy', { command, rules: [rule] });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EAGAIN') throw e;
      await new Promise((r) => setTimeout(r, 1));
    }
  }
}

async function burst(gw: Gateway, command: string, rules: readonly string[]): Promise<number> {
  const t0 = performance.now();
  const answers = await Promise.all(rules.map((rule) => legacy(gw, command, rule)));
  const ms = performance.now() - t0;
  const bad = answers.find((r) => r.status !== 200 || r.body?.status !== 0);
  if (bad) throw new Error(`${command}: ${bad.status} ${bad.text.slice(0, 500)}`);
  return ms;
}

async function main(): Promise<void> {
  const size = Number(process.argv[2] ?? 20);
  const backend = (process.argv[3] ?? 'iptables') as 'nftables' | 'iptables';
  const rounds = Number(process.argv[4] ?? 4);
  const n = Number(process.argv[5] ?? 1000);
  const other = process.argv[6];
  if (!other) throw new Error('usage: abBurst.js [size] [backend] [rounds] [burst] <other build>/dist/bench/gateway.js');
  const gws = await abPair(other, backend, size);
  try {
    const floor = await openKernelFloor(gws.this, await gws.this.backendInfo(), size);
    const eip = '172.20.0.10';
    const ms: Record<Which, { add: number[]; del: number[] }> = { other: { add: [], del: [] }, this: { add: [], del: [] } };
    const floorMs: number[] = [];
    for (let i = 0; i < rounds; i++) {
      const ports = Array.from({ length: n }, (_, k) => 40000 + k);
      const adds = ports.map((p) => `${eip},${p},tcp,10.0.1.6,80`);
      const dels = ports.map((p) => `${eip},${p},tcp`);
      for (const which of (i % 2 ? ['this', 'other'] : ['other', 'this']) as Which[]) {
        ms[which].add.push(await burst(gws[which], 'dnat-add', adds));
        ms[which].del.push(await burst(gws[which], 'dnat-del', dels));
      }
      for (let k = 0; k < 10; k++) floorMs.push((await floor.sample(i * 10 + k)).add.ms);
    }
    await floor.close();
    const f = median(floorMs);
    console.log(`${backend}, size ${size}, bursts of ${n}, ${rounds} rounds; floor (${floor.what}) median ${f.toFixed(2)} ms`);
    console.log('burst         other build          this build          (wall time of the whole burst, median; ×floor)');
    for (const what of ['add', 'del'] as const) {
      const a = median(ms.other[what]);
      const b = median(ms.this[what]);
      console.log(
        `dnat-${what.padEnd(8)} ${a.toFixed(0).padStart(7)} ms ×${(a / f).toFixed(0).padStart(5)}   ${b.toFixed(0).padStart(7)} ms ×${(b / f).toFixed(0).padStart(5)}   this ÷ other ×${(b / a).toFixed(2)}`,
      );
      console.log(`  samples other ${ms.other[what].map((x) => x.toFixed(0)).join(' ')}; this ${ms.this[what].map((x) => x.toFixed(0)).join(' ')}`);
    }
  } finally {
    for (const gw of Object.values(gws)) await gw.cleanup();
  }
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
