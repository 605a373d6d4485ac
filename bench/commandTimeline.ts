/**
 * `node dist/bench/commandTimeline.js [size] [nftables|iptables] [samples]`: the bench's
 * per-command API series (bench/commands.ts, same order, same identities) against one gateway
 * whose daemon logs at debug level, each series just after a series of the bench's kernel floor;
 * then per command the medians of the client's time, of the daemon's own (request → answered),
 * and of each step of the daemon's timeline (src/system/timeline.ts: the request, the queue,
 * the lock, the plan, the tool, the journal's write and sync, the conntrack check), as the time
 * from the step before. Where a command's milliseconds go, beside the floor's.
 */
import { rmSync } from 'node:fs';
import { COMMANDS, request } from './commands.js';
import { api } from './daemon.js';
import { iptablesTools, Gateway } from './gateway.js';
import { cpuMs, type TimelineStep, wrappingNode } from './daemonProbe.js';
import { median } from './stats.js';
import { stateDoc } from './workload.js';

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  const profAt = argv.indexOf('--cpu-prof');
  const profDir = profAt >= 0 ? argv.splice(profAt, 2)[1] : undefined;
  // --info: the daemon at the bench's own level (no timelines, no debug lines): client time and the daemon's CPU only.
  const infoAt = argv.indexOf('--info');
  const info = infoAt >= 0 && argv.splice(infoAt, 1).length > 0;
  // --interleave: sample k of every command in turn (after one floor sample), instead of one series per command.
  const ilAt = argv.indexOf('--interleave');
  const interleave = ilAt >= 0 && argv.splice(ilAt, 1).length > 0;
  // --gap <ms>: a pause between two requests of a series (the bench sends each as soon as the one before is answered).
  const gapAt = argv.indexOf('--gap');
  const gapMs = gapAt >= 0 ? Number(argv.splice(gapAt, 2)[1]) : 0;
  const wrapper = profDir ? wrappingNode(`--cpu-prof --cpu-prof-interval 50 --cpu-prof-dir=${profDir}`) : undefined;
  if (wrapper) process.once('exit', () => rmSync(wrapper, { recursive: true, force: true }));
  const size = Number(argv[0] ?? 20);
  const backend = (argv[1] ?? 'iptables') as 'nftables' | 'iptables';
  const n = Number(argv[2] ?? 30);
  const gw = await Gateway.bare({ backend, resync: '1h' });
  try {
    Object.assign(gw.topo.env, {
      NATGW_LOG_LEVEL: info ? 'info' : 'debug',
      NATGW_BODY_LIMIT: '512mb',
      ...(wrapper ? { PATH: `${wrapper}:${process.env.PATH ?? ''}` } : {}),
    });
    await gw.startDaemon();
    const timelines: Array<{ steps: TimelineStep[]; method: string; path: string }> = [];
    let buffered = '';
    gw.daemon?.child.stdout?.on('data', (d: string) => {
      buffered += d;
      const lines = buffered.split('\n');
      buffered = lines.pop() ?? '';
      for (const line of lines) {
        if (!line.includes('command timeline')) continue;
        try {
          timelines.push(JSON.parse(line) as (typeof timelines)[number]);
        } catch {
          // not a whole JSON line
        }
      }
    });
    await gw.putState(stateDoc(size, false));
    await gw.settleAnnouncements();
    const bi = await gw.backendInfo();
    const t = iptablesTools(bi.variant);
    const floorChain = 'NATGW_BENCH_FLOOR';
    if (backend === 'iptables') await gw.runner.run([t.cmd, '-w', '-t', 'nat', '-N', floorChain]);
    const floor = async (count: number, from: number): Promise<number[]> => {
      const ms: number[] = [];
      for (let k = from; k < from + count; k++) {
        if (backend === 'iptables') {
          const rule = `-A ${floorChain} -d 172.31.255.1/32 -p udp -m udp --dport ${30000 + k} -j DNAT --to-destination 10.0.1.9:53`;
          ms.push((await gw.runner.run([t.restore, '--noflush', '--wait'], { input: `*nat\n${rule}\nCOMMIT\n` })).ms);
          await gw.runner.run([t.cmd, '-w', '-t', 'nat', '-F', floorChain]);
        } else {
          const elem = `172.31.255.1 . udp . ${30000 + k}`;
          ms.push((await gw.runner.run(['nft', 'add', 'element', 'ip', 'natgw', 'port_dnat', `{ ${elem} : 10.0.1.9 . 53 }`])).ms);
          await gw.runner.run(['nft', 'delete', 'element', 'ip', 'natgw', 'port_dnat', `{ ${elem} }`]);
        }
      }
      return ms;
    };
    // An order other than the bench's (a comma list of commands, each as often as it is named): what the first series pays.
    const order = (argv[3]?.split(',') ?? COMMANDS) as Array<(typeof COMMANDS)[number]>;
    const pid = gw.daemon?.pid as number;
    console.log(
      `${backend} (${bi.variant ?? ''}), size ${size}, ${n} samples per ${interleave ? 'command, interleaved' : 'series'}: medians, ms (step and its CPU: since the step before; at: since the request)`,
    );
    /** One request; its client time, or an error. */
    const one = async (cmd: (typeof COMMANDS)[number], k: number): Promise<number> => {
      if (gapMs > 0) await new Promise((r) => setTimeout(r, gapMs));
      const [method, path, body, want] = request(cmd, k);
      const t0 = performance.now();
      const r = await api(gw.socket, method, path, body);
      const ms = performance.now() - t0;
      if (r.status !== want) throw new Error(`${method} ${path} → ${r.status} ${r.text}`);
      return ms;
    };
    const report = (cmd: string, client: number[], floorMs: number, cpuPer: number | undefined, mine: typeof timelines): void => {
      const byStep = new Map<string, { since: number[]; at: number[]; cpu: number[] }>();
      for (const tl of mine) {
        let prev = 0;
        let prevCpu = 0;
        for (const s of tl.steps) {
          const e = byStep.get(s.step) ?? { since: [], at: [], cpu: [] };
          e.since.push(s.wallMs - prev);
          e.at.push(s.wallMs);
          e.cpu.push(s.cpuMs - prevCpu);
          byStep.set(s.step, e);
          prev = s.wallMs;
          prevCpu = s.cpuMs;
        }
      }
      const server = mine.map((tl) => tl.steps.at(-1)?.wallMs ?? Number.NaN);
      const cpu = mine.map((tl) => tl.steps.at(-1)?.cpuMs ?? Number.NaN);
      console.log(
        `\n${cmd}: client ${median(client).toFixed(2)} (×${(median(client) / floorMs).toFixed(2)} of the floor, ${floorMs.toFixed(2)})${cpuPer === undefined ? '' : `, daemon CPU ${cpuPer.toFixed(2)} per command (/proc)`}${mine.length ? `, daemon ${median(server).toFixed(2)}, its CPU ${median(cpu).toFixed(2)} (${mine.length} timelines)` : ''}`,
      );
      const rows = [...byStep].sort((a, b) => median(a[1].at) - median(b[1].at));
      for (const [step, e] of rows)
        console.log(
          `  ${step.padEnd(40)} step ${median(e.since).toFixed(2).padStart(5)}  CPU ${median(e.cpu).toFixed(2).padStart(5)}  at ${median(e.at).toFixed(2).padStart(5)}  (${e.at.length})`,
        );
    };
    const settle = () => new Promise((r) => setTimeout(r, 100));
    if (interleave) {
      // Every command sees the same warm-up and the same load: sample k of each, one after the other, a floor sample first.
      const client = new Map<string, number[]>();
      const floorMs: number[] = [];
      const mine = new Map<string, typeof timelines>();
      for (let k = 0; k < n; k++) {
        floorMs.push(...(await floor(1, k)));
        for (const cmd of order) {
          const at = timelines.length;
          const ms = await one(cmd, k);
          (client.get(cmd) ?? client.set(cmd, []).get(cmd))?.push(ms);
          // Its timeline line comes on the daemon's stdout just after the answer.
          for (let w = 0; w < 20 && timelines.length <= at && info === false; w++) await new Promise((r) => setTimeout(r, 1));
          if (timelines.length > at) (mine.get(cmd) ?? mine.set(cmd, []).get(cmd))?.push(...timelines.slice(at));
        }
      }
      await settle();
      for (const cmd of new Set(order)) report(cmd, client.get(cmd) ?? [], median(floorMs), undefined, mine.get(cmd) ?? []);
      return;
    }
    const used = new Map<string, number>();
    for (const cmd of order) {
      // A command named again takes identities its series before did not (the matching delete series removes them again).
      const round = used.get(cmd) ?? 0;
      used.set(cmd, round + 1);
      const floorMs = median(await floor(n, 0));
      const client: number[] = [];
      const first = timelines.length;
      const cpu0 = cpuMs(pid);
      for (let k = 0; k < n; k++) client.push(await one(cmd, k + round * 1000));
      const cpuPer = (cpuMs(pid) - cpu0) / n;
      await settle();
      report(cmd, client, floorMs, cpuPer, timelines.slice(first));
    }
  } finally {
    // SIGTERM: the daemon writes its CPU profile on the way out.
    await gw.stopDaemon();
    await gw.cleanup();
  }
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
