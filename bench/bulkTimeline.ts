/**
 * `node dist/bench/bulkTimeline.js [size=10000] [runs=5] [nftables|iptables] [--cpu-prof <dir>] [--node-flags '<flags>']`:
 * the bulk PUT /v1/state into an empty gateway as `npm run bench` makes it (a dry run first),
 * with the daemon at debug level, run by run in fresh namespaces; prints the daemon's CPU for
 * the PUT (/proc/<pid>/stat), its peak RSS and its own timeline of the PUT (system/timeline.ts:
 * wall and CPU ms at each step), then the medians. The daemon's CPU and the order of its steps
 * are what to compare between builds on a shared machine; its wall time swings with the load.
 * `--cpu-prof <dir>` also writes the daemon's V8 CPU profile there (at its exit); `--node-flags
 * '<flags>'` starts the daemon's Node.js with more flags (e.g. --trace-gc), whose output is printed.
 */
import { rmSync } from 'node:fs';
import { Gateway } from './gateway.js';
import { cpuMs, type TimelineStep, wrappingNode } from './daemonProbe.js';
import { median } from './stats.js';
import { stateDoc } from './workload.js';

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  const profAt = argv.indexOf('--cpu-prof');
  const profDir = profAt >= 0 ? argv.splice(profAt, 2)[1] : undefined;
  const flagsAt = argv.indexOf('--node-flags');
  const nodeFlags = flagsAt >= 0 ? (argv.splice(flagsAt, 2)[1] ?? '') : '';
  const wrapped = [profDir ? `--cpu-prof --cpu-prof-interval 100 --cpu-prof-dir=${profDir}` : '', nodeFlags].join(' ').trim();
  const wrapper = wrapped ? wrappingNode(wrapped) : undefined;
  if (wrapper) process.once('exit', () => rmSync(wrapper, { recursive: true, force: true }));
  const size = Number(argv[0] ?? 10000);
  const runs = Number(argv[1] ?? 5);
  const backend = (argv[2] ?? 'nftables') as 'nftables' | 'iptables';
  const doc = stateDoc(size, false);
  const put: number[] = [];
  const cpu: number[] = [];
  const peak: number[] = [];
  const byStep = new Map<string, { wall: number[]; cpu: number[] }>();
  for (let r = 0; r < runs; r++) {
    const gw = await Gateway.bare({ backend, resync: '1h' });
    try {
      Object.assign(gw.topo.env, { NATGW_LOG_LEVEL: 'debug', ...(wrapper ? { PATH: `${wrapper}:${process.env.PATH ?? ''}` } : {}) });
      await gw.startDaemon();
      await gw.putState(doc, '?dryRun=true');
      const pid = gw.daemon?.pid as number;
      const before = cpuMs(pid);
      const { ms } = await gw.putState(doc);
      const used = cpuMs(pid) - before;
      const mem = gw.daemon?.memory();
      await new Promise((res) => setTimeout(res, 100));
      if (nodeFlags) for (const line of (gw.daemon?.logTail() ?? '').split('\n')) if (!line.startsWith('{')) console.log(`  | ${line}`);
      let steps: TimelineStep[] = [];
      let startUs: number | undefined;
      for (const line of (gw.daemon?.logTail() ?? '').split('\n')) {
        try {
          const j = JSON.parse(line) as { steps?: TimelineStep[]; startUs?: number; msg?: string };
          if (j.steps && j.msg?.startsWith('bulk PUT timeline')) {
            steps = j.steps;
            startUs = j.startUs;
          }
        } catch {
          // the tail's cut first line
        }
      }
      put.push(ms);
      cpu.push(used);
      if (mem) peak.push(mem.peakKiB / 1024);
      console.log(
        `${backend} run ${r + 1}: PUT ${ms.toFixed(0)} ms, daemon CPU ${used.toFixed(0)} ms, RSS now/peak ${((mem?.rssKiB ?? 0) / 1024).toFixed(0)}/${((mem?.peakKiB ?? 0) / 1024).toFixed(0)} MiB`,
      );
      if (profDir) console.log(`  timeline start ${startUs} µs (monotonic, as the CPU profile's timestamps)`);
      console.log(`  ${steps.map((s) => `${s.step} ${s.wallMs.toFixed(1)}/${s.cpuMs.toFixed(0)}`).join(' | ')}`);
      for (const s of steps) {
        const e = byStep.get(s.step) ?? { wall: [], cpu: [] };
        e.wall.push(s.wallMs);
        e.cpu.push(s.cpuMs);
        byStep.set(s.step, e);
      }
    } finally {
      await gw.stopDaemon();
      await gw.cleanup();
    }
  }
  console.log(
    `${backend} size ${size}, medians of ${runs}: PUT ${median(put).toFixed(0)} ms, daemon CPU ${median(cpu).toFixed(0)} ms, peak RSS ${median(peak).toFixed(0)} MiB`,
  );
  for (const [step, e] of byStep)
    console.log(`  ${step.padEnd(34)} wall ${median(e.wall).toFixed(1).padStart(6)}  CPU ${median(e.cpu).toFixed(1).padStart(6)}`);
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
