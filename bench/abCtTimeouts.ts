/**
 * `node dist/bench/abCtTimeouts.js [size] [nftables|iptables] [rounds]`: what configured
 * connection timeouts cost a command. Two gateways of this build filled to `size`, one with
 * NATGW_CT_TIMEOUT_* set and one without (the floor), and the per-command API requests sent to
 * them alternately, one by one, in alternating order; prints the ratio of their medians.
 */
import { Gateway } from './gateway.js';
import { api } from './daemon.js';
import { median } from './stats.js';
import { stateDoc } from './workload.js';

const TIMEOUTS = {
  NATGW_CT_TIMEOUT_TCP_ESTABLISHED: '1200s',
  NATGW_CT_TIMEOUT_TCP_TRANSITORY: '30s',
  NATGW_CT_TIMEOUT_TCP_TIME_WAIT: '120s',
  NATGW_CT_TIMEOUT_UDP: '30s',
};

async function main(): Promise<void> {
  const size = Number(process.argv[2] ?? 20);
  const backend = (process.argv[3] ?? 'iptables') as 'nftables' | 'iptables';
  const rounds = Number(process.argv[4] ?? 40);
  const gws = { floor: await Gateway.bare({ backend, resync: '1h' }), timeouts: await Gateway.bare({ backend, resync: '1h' }) };
  try {
    for (const [which, gw] of Object.entries(gws)) {
      Object.assign(gw.topo.env, { NATGW_BODY_LIMIT: '512mb' }, which === 'timeouts' ? TIMEOUTS : {});
      await gw.startDaemon();
      await gw.putState(stateDoc(size, false));
      await gw.settleAnnouncements();
    }
    const eip = '172.20.0.10';
    const steps: Array<[string, string, string, unknown?]> = [
      ['PUT dnat', 'PUT', `/v1/dnats/${eip},40001,tcp`, { internalIp: '10.0.1.6', internalPort: 80 }],
      ['DELETE dnat', 'DELETE', `/v1/dnats/${eip},40001,tcp`],
      ['PUT snat', 'PUT', `/v1/snats/${eip},10.250.1.0%2F24`, {}],
      ['DELETE snat', 'DELETE', `/v1/snats/${eip},10.250.1.0%2F24`],
    ];
    const ms: Record<string, Record<string, number[]>> = { floor: {}, timeouts: {} };
    for (let i = 0; i < rounds; i++) {
      for (const [what, method, path, body] of steps) {
        for (const which of i % 2 ? ['timeouts', 'floor'] : ['floor', 'timeouts']) {
          const gw = gws[which as keyof typeof gws];
          const t0 = performance.now();
          const r = await api(gw.socket, method, path, body);
          if (r.status >= 300) throw new Error(`${which}: ${what} answered ${r.status}: ${r.text}`);
          ((ms[which] as Record<string, number[]>)[what] ??= []).push(performance.now() - t0);
        }
      }
    }
    console.log(`${backend}, size ${size}, ${rounds} rounds: median ms, without timeouts / with (with ÷ without)`);
    for (const [what] of steps) {
      const a = median(ms.floor?.[what] ?? []);
      const b = median(ms.timeouts?.[what] ?? []);
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
