/**
 * The critical path of one bulk `PUT /v1/state`, of each single command, and of the daemon's
 * start up to its first sync's end, for the debug log:
 * wall and CPU milliseconds at each step (request received, body in, parsed, validated, the
 * lock, planned, rendered, tool started and ended, the journal line written and synced,
 * answered). Off unless the daemon logs at debug level; then one timeline at a time
 * (the engine runs one transaction at a time), and a mark costs one hrtime and one cpuUsage.
 * A bulk PUT is judged by its CPU and the order of these steps: wall time alone swings with
 * whatever else shares the machine's cores.
 */

interface Mark {
  readonly step: string;
  readonly wallMs: number;
  readonly cpuMs: number;
}

let enabled = false;
let current: { readonly t0: bigint; readonly epochMs: number; readonly cpu0: NodeJS.CpuUsage; readonly marks: Mark[] } | undefined;

/** Turned on by the daemon at debug level (serve.ts). */
export function enableTimeline(on: boolean): void {
  enabled = on;
  if (!on) current = undefined;
}

export function timelineEnabled(): boolean {
  return enabled;
}

/** Begin a timeline (a bulk PUT arrived); one begun before and not ended is dropped. */
export function timelineStart(first = 'request'): void {
  if (!enabled) return;
  current = { t0: process.hrtime.bigint(), epochMs: Date.now(), cpu0: process.cpuUsage(), marks: [] };
  timelineMark(first);
}

/** The first step of the timeline under way, if any (the daemon's start ends only its own). */
export function timelineBegunAs(): string | undefined {
  return current?.marks[0]?.step;
}

export function timelineMark(step: string): void {
  if (current === undefined) return;
  const cpu = process.cpuUsage(current.cpu0);
  current.marks.push({
    step,
    wallMs: Math.round(Number(process.hrtime.bigint() - current.t0) / 1e4) / 100,
    cpuMs: Math.round((cpu.user + cpu.system) / 10) / 100,
  });
}

/**
 * End the timeline: its marks (undefined when none ran), its start on the monotonic clock in
 * microseconds (a CPU profile's timestamps are on it) and in epoch milliseconds (a log line's
 * `time`), for one debug line.
 */
export function timelineEnd(last = 'answered'): { steps: Mark[]; startUs: number; startMs: number } | undefined {
  if (current === undefined) return undefined;
  timelineMark(last);
  const done = { steps: current.marks, startUs: Number(current.t0 / 1000n), startMs: current.epochMs };
  current = undefined;
  return done;
}
