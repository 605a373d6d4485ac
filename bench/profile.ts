/**
 * `node dist/bench/profile.js [size] [backend]`: one gateway with a daemon at debug level,
 * filled to `size`, then a few commands through the API; prints the daemon's own log lines
 * of each command (every tool it ran and how long it took), to see where a command's time goes.
 */
import { Gateway } from './gateway.js';
import { api } from './daemon.js';
import { stateDoc } from './workload.js';

async function main(): Promise<void> {
  const size = Number(process.argv[2] ?? 10000);
  const backend = (process.argv[3] ?? 'nftables') as 'nftables' | 'iptables';
  const gw = await Gateway.bare({ backend, resync: '1h' });
  try {
    Object.assign(gw.topo.env, { NATGW_LOG_LEVEL: 'debug', NATGW_BODY_LIMIT: '512mb' });
    await gw.startDaemon();
    await gw.putState(stateDoc(size, false));
    const eip = '172.20.0.10';
    const steps: Array<[string, string, unknown?]> = [
      ['PUT', `/v1/dnats/${eip},40001,tcp`, { internalIp: '10.0.1.6', internalPort: 80 }],
      ['DELETE', `/v1/dnats/${eip},40001,tcp`],
      ['PUT', `/v1/snats/${eip},10.250.1.0%2F24`, {}],
      ['DELETE', `/v1/snats/${eip},10.250.1.0%2F24`],
    ];
    for (const [method, path, body] of steps) {
      const t0 = performance.now();
      const r = await api(gw.socket, method, path, body);
      console.log(`${method} ${path} -> ${r.status} in ${(performance.now() - t0).toFixed(1)} ms`);
    }
    await new Promise((r) => setTimeout(r, 200));
    for (const line of (gw.daemon?.logTail() ?? '').split('\n')) {
      try {
        const j = JSON.parse(line) as Record<string, unknown>;
        console.log(String(j.time).slice(-6), j.msg, j.cmd ?? '', j.ms ?? '', j.kind ?? '', j.status ?? '');
      } catch {
        // a partial first line of the tail
      }
    }
  } finally {
    await gw.cleanup();
  }
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
