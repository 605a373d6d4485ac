/**
 * `node dist/bench/memoryTimeline.js [size=10000] [runs=3] [nftables|iptables] [--commands 300] [--node-flags '<flags>']`:
 * where the daemon's resident memory peaks, step by step, in fresh namespaces per run: the
 * `npm run bench` sequences that reach the target size (a dry run then a bulk PUT /v1/state
 * into an empty gateway; a fill from 20 objects to `size`, GET /v1/state, then `--commands`
 * DNAT adds and deletes through the API, as the bench's per-command series make them: each
 * command leaves a little garbage in the old generation, so the heap grows until its next
 * full collection, and the run's peak is often reached there). After each step: VmRSS and VmHWM (the peak so far) of the daemon,
 * in MiB. RSS does not depend on the machine's load, so builds can be compared across runs;
 * `--node-flags` starts the daemon's Node.js with more flags (e.g. --trace-gc), whose output
 * is printed.
 */
import { rmSync } from 'node:fs';
import { Gateway } from './gateway.js';
import { api, must } from './daemon.js';
import { wrappingNode } from './daemonProbe.js';
import { median } from './stats.js';
import { stateDoc } from './workload.js';

type Step = { readonly step: string; readonly rssMiB: number; readonly peakMiB: number };

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  const flagsAt = argv.indexOf('--node-flags');
  const nodeFlags = flagsAt >= 0 ? (argv.splice(flagsAt, 2)[1] ?? '') : '';
  const commandsAt = argv.indexOf('--commands');
  const commands = commandsAt >= 0 ? Number(argv.splice(commandsAt, 2)[1]) : 300;
  const wrapper = nodeFlags ? wrappingNode(nodeFlags) : undefined;
  if (wrapper) process.once('exit', () => rmSync(wrapper, { recursive: true, force: true }));
  const size = Number(argv[0] ?? 10000);
  const runs = Number(argv[1] ?? 3);
  const backend = (argv[2] ?? 'iptables') as 'nftables' | 'iptables';
  const byStep = new Map<string, { rss: number[]; peak: number[] }>();
  for (let r = 0; r < runs; r++) {
    for (const sequence of ['bulk', 'fill'] as const) {
      const gw = await Gateway.bare({ backend, resync: '1h' });
      const steps: Step[] = [];
      try {
        if (wrapper) Object.assign(gw.topo.env, { PATH: `${wrapper}:${process.env.PATH ?? ''}` });
        await gw.startDaemon();
        const mark = (step: string): void => {
          const m = gw.daemon?.memory();
          if (m) steps.push({ step: `${sequence}: ${step}`, rssMiB: m.rssKiB / 1024, peakMiB: m.peakKiB / 1024 });
        };
        mark('started');
        if (sequence === 'bulk') {
          await gw.putState(stateDoc(size, false), '?dryRun=true');
          mark('dry run');
          await gw.putState(stateDoc(size, false));
          mark('PUT into empty');
        } else {
          await gw.putState(stateDoc(20, false));
          mark('PUT 20');
          await gw.putState(stateDoc(size, false));
          mark(`PUT ${size} over 20`);
          must(await api(gw.socket, 'GET', '/v1/state'), 'GET /v1/state');
          mark('GET /v1/state');
          for (let i = 0; i < commands; i++) {
            const id = encodeURIComponent(`172.20.250.251,${40000 + (i % 100)},tcp`);
            must(await api(gw.socket, 'PUT', `/v1/dnats/${id}`, { internalIp: '10.0.1.6', internalPort: 80 }), 'PUT /v1/dnats');
            must(await api(gw.socket, 'DELETE', `/v1/dnats/${id}`), 'DELETE /v1/dnats');
          }
          mark(`${commands} DNAT add+delete`);
        }
        if (nodeFlags) for (const line of (gw.daemon?.logTail() ?? '').split('\n')) if (!line.startsWith('{')) console.log(`  | ${line}`);
      } finally {
        await gw.stopDaemon();
        await gw.cleanup();
      }
      console.log(`${backend} run ${r + 1} ${steps.map((s) => `${s.step} ${s.rssMiB.toFixed(0)}/${s.peakMiB.toFixed(0)}`).join(' | ')}`);
      for (const s of steps) {
        const e = byStep.get(s.step) ?? { rss: [], peak: [] };
        e.rss.push(s.rssMiB);
        e.peak.push(s.peakMiB);
        byStep.set(s.step, e);
      }
    }
  }
  console.log(`${backend} size ${size}, RSS now/peak MiB after each step, median (min–max of the peak) of ${runs} runs:`);
  for (const [step, e] of byStep)
    console.log(
      `  ${step.padEnd(36)} ${median(e.rss).toFixed(0).padStart(4)}/${median(e.peak).toFixed(0).padStart(4)}  (${Math.min(...e.peak).toFixed(0)}–${Math.max(...e.peak).toFixed(0)})`,
    );
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
