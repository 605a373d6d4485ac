/**
 * What the timeline benches (bulkTimeline, commandTimeline) read of the daemon beside its log:
 * the shape of a timeline step, its process's CPU, and a `node` that starts it with V8 flags.
 */
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** One step of a daemon's debug timeline (src/system/timeline.ts): ms since the request. */
export interface TimelineStep {
  readonly step: string;
  readonly wallMs: number;
  readonly cpuMs: number;
}

/**
 * A directory whose `node` runs this Node.js with `flags` (--cpu-prof is not allowed in
 * NODE_OPTIONS): first on the daemon's PATH, so the shim's `exec node` of serve takes them.
 */
export function wrappingNode(flags: string): string {
  const bin = mkdtempSync(join(tmpdir(), 'natgw-prof-node-'));
  writeFileSync(join(bin, 'node'), `#!/bin/sh\nexec ${process.execPath} ${flags} "$@"\n`, { mode: 0o755 });
  return bin;
}

/** utime + stime of a process, in ms (the clock tick is 10 ms: meaningful over a series). */
export function cpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100;
}
