/**
 * `node dist/bench/restoreTimeline.js [size=10000] [runs=3] [nftables|iptables]`: the bulk bench's
 * restore at start, run by run, with the daemon at debug level: a gateway filled by PUT /v1/state
 * and stopped, the same run's raw apply of its dry-run script in fresh namespaces (the floor),
 * then its state dir in fresh namespaces and a daemon started there. Prints spawn → /healthz and
 * → /readyz against the raw apply, and every log line of the start with its milliseconds since
 * the spawn (pino's `time`), so that what a restore waits for can be read off, not guessed.
 * `--keep <dir>` leaves a copy of the filled gateway's state dir there; `--path-prefix <dir>` puts
 * a directory first on the daemon's PATH (tool wrappers that log their start and end);
 * `--node-options '<opts>'` is the daemon's NODE_OPTIONS (its non-JSON output is printed too);
 * `--warm` also stops the restored daemon and starts it again on the kernel it left (a container
 * restart in a pod that kept its network namespace), and prints that start the same way;
 * `--libnft off` runs the daemons without the libnftables helper.
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { copyStateFiles, rawApply, splitScript } from './bulk.js';
import { Daemon } from './daemon.js';
import { type BackendInfo, Gateway, setLibnft } from './gateway.js';
import { median } from './stats.js';
import { stateDoc } from './workload.js';

interface LogLine {
  readonly time?: number;
  readonly msg?: string;
  readonly [k: string]: unknown;
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  // `--keep <dir>`: also leave the filled gateway's state dir there (to start a daemon on by hand).
  const keepAt = argv.indexOf('--keep');
  const keep = keepAt >= 0 ? argv.splice(keepAt, 2)[1] : undefined;
  // `--path-prefix <dir>`: first on the daemon's PATH (wrappers of nft, ip, ... that append
  // "<start ns> <end ns> <argv>" lines to $NATGW_WRAP_LOG, printed against the spawn).
  const prefixAt = argv.indexOf('--path-prefix');
  const pathPrefix = prefixAt >= 0 ? argv.splice(prefixAt, 2)[1] : undefined;
  // `--node-options '<opts>'`: NODE_OPTIONS for the daemon (e.g. `--trace-gc`; its lines are printed as they come).
  const optionsAt = argv.indexOf('--node-options');
  const nodeOptions = optionsAt >= 0 ? argv.splice(optionsAt, 2)[1] : undefined;
  // `--libnft off`: the daemons run every nft change as a tool (NATGW_LIBNFTABLES=off).
  const libnftAt = argv.indexOf('--libnft');
  if (libnftAt >= 0) {
    const v = argv.splice(libnftAt, 2)[1];
    if (v !== 'auto' && v !== 'off') throw new Error(`--libnft: auto or off, not ${v}`);
    setLibnft(v);
  }
  const warmAt = argv.indexOf('--warm');
  const warm = warmAt >= 0 && argv.splice(warmAt, 1).length > 0;
  if (keep) mkdirSync(keep, { recursive: true });
  const size = Number(argv[0] ?? 10000);
  const runs = Number(argv[1] ?? 3);
  const backend = (argv[2] ?? 'nftables') as 'nftables' | 'iptables';
  const opts = { backend, resync: '1h' };
  const doc = stateDoc(size, false);
  Daemon.tailBytes = 4 << 20;
  const ratios: number[] = [];
  for (let r = 1; r <= runs; r++) {
    const saved = mkdtempSync(join(tmpdir(), 'natgw-restore-tl-'));
    try {
      let script = '';
      let info: BackendInfo = { kind: backend };
      const filled = await Gateway.withDaemon(opts);
      try {
        script = String((await filled.putState(doc, '?dryRun=true')).body?.script ?? '');
        await filled.putState(doc);
        info = await filled.backendInfo();
        await filled.stopDaemon();
        copyStateFiles(filled.topo.stateDir, saved);
        if (keep) copyStateFiles(filled.topo.stateDir, keep);
      } finally {
        await filled.cleanup();
      }
      const raw = await rawApply(opts, info, splitScript(script));
      const gw = await Gateway.bare(opts);
      try {
        copyStateFiles(saved, gw.topo.stateDir);
        const wrapLog = join(saved, 'wrap.log');
        Object.assign(gw.topo.env, {
          NATGW_LOG_LEVEL: 'debug',
          ...(pathPrefix ? { PATH: `${pathPrefix}:${process.env.PATH ?? ''}`, NATGW_WRAP_LOG: wrapLog } : {}),
          ...(nodeOptions ? { NODE_OPTIONS: nodeOptions } : {}),
        });
        const spawnedAt = Date.now();
        const t = await gw.startDaemon();
        await new Promise((res) => setTimeout(res, 50));
        const nf = raw.rawNetfilterMs ?? Number.NaN;
        ratios.push(t.readyzMs / nf);
        console.log(
          `${backend} run ${r}: raw ${nf} + ip ${raw.rawLinkMs} ms; restore /healthz ${t.healthzMs.toFixed(0)} ms, /readyz ${t.readyzMs.toFixed(0)} ms ×${(t.readyzMs / nf).toFixed(2)}`,
        );
        printStart(gw.daemon?.logTail() ?? '', spawnedAt);
        if (pathPrefix && existsSync(wrapLog)) {
          for (const l of readFileSync(wrapLog, 'utf8').trim().split('\n').sort()) {
            const [a, b, ...cmd] = l.split(' ');
            const at = (ns: string | undefined) => String(Math.round(Number(ns) / 1e6 - spawnedAt)).padStart(4);
            console.log(`  tool +${at(a)} → +${at(b)} ${cmd.join(' ').slice(0, 120)}`);
          }
        }
        if (warm) {
          await gw.stopDaemon();
          const again = Date.now();
          const w = await gw.startDaemon();
          await new Promise((res) => setTimeout(res, 50));
          console.log(
            `${backend} run ${r}, warm restart (kernel intact): /healthz ${w.healthzMs.toFixed(0)} ms, /readyz ${w.readyzMs.toFixed(0)} ms ×${(w.readyzMs / nf).toFixed(2)}`,
          );
          printStart(gw.daemon?.logTail() ?? '', again);
        }
        await gw.stopDaemon();
      } finally {
        await gw.cleanup();
      }
    } finally {
      rmSync(saved, { recursive: true, force: true });
    }
  }
  console.log(`${backend} size ${size}: restore ÷ raw netfilter, median of ${runs}: ×${median(ratios).toFixed(2)}`);
}

/** A start's log lines and its start timeline, each at its milliseconds since `spawnedAt`. */
function printStart(tail: string, spawnedAt: number): void {
  for (const text of tail.split('\n')) {
    if (!text.startsWith('{')) {
      if (text.trim() !== '') console.log(`        ${text.trim().slice(0, 200)}`);
      continue;
    }
    let line: LogLine;
    try {
      line = JSON.parse(text) as LogLine;
    } catch {
      // A line cut by the log tail's size limit (the debug line of a whole ruleset's script).
      continue;
    }
    const { time, msg, level: _l, pid: _p, hostname: _h, ...rest } = line;
    if (msg?.startsWith('start timeline') && Array.isArray(rest.steps) && typeof rest.startMs === 'number') {
      const at = rest.startMs - spawnedAt;
      const steps = rest.steps as Array<{ step: string; wallMs: number; cpuMs: number }>;
      console.log(
        `  start timeline (ms since the spawn / CPU since serve began): ${steps.map((s) => `${s.step} +${Math.round(at + s.wallMs)}/${Math.round(s.cpuMs)}`).join(' | ')}`,
      );
      continue;
    }
    const extra = JSON.stringify(rest);
    console.log(`  +${String((time ?? spawnedAt) - spawnedAt).padStart(4)} ${msg ?? ''}${extra === '{}' ? '' : ` ${extra.slice(0, 220)}`}`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
