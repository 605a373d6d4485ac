/**
 * `node dist/bench/repair.js [backends…]`: the time figures that used to be assertions in the
 * real-kernel tests (a test must fail for the reason its name gives, and a loaded CI machine
 * is not such a reason): how long after NAT rules are flushed behind its back the daemon has
 * put them back (resync period 1 s), and the latency of one client's sequential changes over
 * the socket. Printed, never asserted.
 */
import { api } from '../test/netns/daemon-util.js';
import { waitFor } from '../test/helpers/poll.js';
import { Gateway, iptablesTools, type BackendName } from './gateway.js';

const EIP = '172.20.0.10';

function doc(n: number): unknown {
  const dnats = Array.from({ length: n }, (_, i) => ({ eip: EIP, port: 10000 + i, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 }));
  return { initialized: true, interfaces: { vpc: 'eth0', ext: 'net1' }, eips: [{ address: EIP, prefixLength: 24 }], snats: [], dnats, fips: [] };
}

async function figures(backend: BackendName): Promise<string> {
  const gw = await Gateway.withDaemon({ backend, resync: '1s' });
  try {
    await gw.putState(doc(20));
    const info = await gw.backendInfo();
    const dump = async (): Promise<string> => {
      if (info.kind === 'nftables') return (await gw.topo.exec('gw', ['nft', 'list', 'table', 'ip', 'natgw'], { reject: false })).stdout;
      return (await gw.topo.exec('gw', [iptablesTools(info.variant).save, '-t', 'nat'])).stdout.replace(/^[#:].*\n/gm, '');
    };
    const want = await dump();
    const flush = info.kind === 'nftables' ? ['nft', 'flush', 'table', 'ip', 'natgw'] : [iptablesTools(info.variant).cmd, '-t', 'nat', '-F', 'SHARED_DNAT'];
    const repairs: number[] = [];
    for (let i = 0; i < 5; i++) {
      await gw.topo.exec('gw', flush);
      const t = Date.now();
      await waitFor(async () => (await dump()) === want, { what: 'the flushed rules back', timeoutMs: 30_000, intervalMs: 20 });
      repairs.push(Date.now() - t);
    }
    const n = 40;
    const started = Date.now();
    for (let i = 0; i < n; i++) {
      const path = `/v1/dnats/${EIP},${30000 + (i % 10)},tcp`;
      const r = await (i % 2 === 0 ? api(gw.socket, 'PUT', path, { internalIp: '10.0.1.6', internalPort: 80 }) : api(gw.socket, 'DELETE', path));
      if (r.status >= 300) throw new Error(`${path}: HTTP ${r.status} ${r.text}`);
    }
    const per = (Date.now() - started) / n;
    return `${backend}${info.variant ? `-${info.variant}` : ''}: flushed NAT repaired after ${repairs.join(', ')} ms (resync period 1 s); one client's sequential changes ${per.toFixed(0)} ms each`;
  } finally {
    await gw.cleanup();
  }
}

async function main(): Promise<void> {
  const backends = (process.argv.slice(2).length ? process.argv.slice(2) : ['nftables', 'iptables']) as BackendName[];
  for (const b of backends) console.log(await figures(b));
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((e: unknown) => {
    console.error(e);
    process.exit(1);
  });
}
