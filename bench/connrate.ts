/**
 * New TCP connections per second from the external host through the first and the last DNAT
 * of a full gateway: NAT rules see the first packet of every connection, so a linear chain
 * shows up here and a map lookup does not.
 */
import { startServer } from '../test/helpers/traffic.js';
import { api, must } from './daemon.js';
import { iptablesTools, type BackendInfo, type Gateway } from './gateway.js';
import { progress } from './progress.js';
import { median } from './stats.js';
import { PROBE } from './workload.js';

export interface ConnRates {
  readonly firstPerSec: number;
  readonly lastPerSec: number;
  /** Where the probes sit in SHARED_DNAT (iptables only): 1-based positions and the chain length. */
  readonly positions?: { first: number; last: number; of: number };
}

const CONNECT_LOOP = `
const net = require('node:net');
const [host, port, count] = process.argv.slice(1);
let done = 0; const t0 = process.hrtime.bigint();
const next = () => {
  if (done === Number(count)) {
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(JSON.stringify({ perSecond: Math.round(done / s) }));
    return;
  }
  const c = net.connect({ host, port: Number(port), localAddress: '172.20.0.100' }, () => { c.destroy(); done++; next(); });
  c.on('error', (e) => { console.error(e.message); process.exit(1); });
};
next();`;

const CONNECTIONS = 2000;
const ROUNDS = 5;

export async function connectionRates(gw: Gateway, backend: BackendInfo): Promise<ConnRates> {
  const { topo } = gw;
  const { last, target } = PROBE;
  must(await api(gw.socket, 'PUT', `/v1/eips/${last.eip}`, { prefixLength: 16 }), 'PUT probe EIP');
  must(await api(gw.socket, 'PUT', `/v1/dnats/${last.eip},${last.port},tcp`, { internalIp: target.ip, internalPort: target.port }), 'PUT probe DNAT');
  await topo.exec('ext', ['ip', 'route', 'replace', '172.20.0.0/16', 'dev', 'e0']);
  const server = startServer(topo, 'vpc1', 'tcp', target.port);
  await server.ready;
  try {
    const rate = async (host: string, port: number) => {
      const r = await topo.exec('ext', [process.execPath, '-e', CONNECT_LOOP, host, String(port), String(CONNECTIONS)], { timeoutMs: 300_000 });
      return (JSON.parse(r.stdout.trim()) as { perSecond: number }).perSecond;
    };
    // One rate swings ×3 from run to run here (whatever the rule's position): the two probes
    // take turns, and each figure is the median of its rounds.
    const first: number[] = [];
    const lastRates: number[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      first.push(await rate(PROBE.first.eip, PROBE.first.port));
      lastRates.push(await rate(last.eip, last.port));
    }
    progress(`connections/s, round by round: first ${first.join(' ')}; last ${lastRates.join(' ')}`);
    return {
      firstPerSec: median(first),
      lastPerSec: median(lastRates),
      ...(backend.kind === 'iptables' ? { positions: await positions(gw, backend.variant) } : {}),
    };
  } finally {
    await server.stop();
  }
}

async function positions(gw: Gateway, variant: string | undefined): Promise<{ first: number; last: number; of: number }> {
  // Not through the runner: it keeps only the tail of a command's output, and this dump is large.
  const r = await gw.topo.exec('gw', [iptablesTools(variant).save, '-t', 'nat']);
  const rules = r.stdout.split('\n').filter((l) => l.startsWith('-A SHARED_DNAT '));
  const at = (eip: string, port: number) => 1 + rules.findIndex((l) => l.includes(`-d ${eip}/32`) && new RegExp(`--dport ${port}( |$)`).test(l));
  return { first: at(PROBE.first.eip, PROBE.first.port), last: at(PROBE.last.eip, PROBE.last.port), of: rules.length };
}
