/**
 * The bash text that runs a phased nft apply (phases.ts): the first phase, then the element
 * groups at once, then the last. One small bash process sequences them, not Node.js's event
 * loop: the daemon hashes and persists a bulk change on its thread while the kernel applies,
 * so a phase that ended would wait for that work before the next began. The text is constant;
 * its arguments are a private directory holding the phases' scripts (files `first`,
 * `group0`…, `last`) and how many groups.
 *
 * Output: a stamp `t <EPOCHREALTIME>` on stdout after each step (no process started for it);
 * on a refusal `natgw-phase-refused: first|groups|last` on stderr, exit 1.
 */
import { mkdtempSync, readdir, rm, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const PHASES_SH = `set -u
d=$1; n=$2
echo "t $EPOCHREALTIME"
nft -f - < "$d/first" || { echo "natgw-phase-refused: first" >&2; exit 1; }
echo "t $EPOCHREALTIME"
pids=()
for ((i = 0; i < n; i++)); do nft -f - < "$d/group$i" & pids+=($!); done
rc=0
for p in "\${pids[@]}"; do wait "$p" || rc=1; done
[ "$rc" = 0 ] || { echo "natgw-phase-refused: groups" >&2; exit 1; }
echo "t $EPOCHREALTIME"
nft -f - < "$d/last" || { echo "natgw-phase-refused: last" >&2; exit 1; }
echo "t $EPOCHREALTIME"
`;

/** The scripts PHASES_SH runs, by phase. */
export interface PhaseFiles {
  readonly first: string | Buffer;
  readonly groups: readonly (string | Buffer)[];
  readonly last: string | Buffer;
}

/**
 * The phases' scripts in a new private directory under `parent` (0600 files named as PHASES_SH
 * reads them), and the bash argv that runs them there. The caller removes `dir` once bash ended.
 * Throws when the directory or a file cannot be written; then nothing is left behind.
 */
export function phaseRun(files: PhaseFiles, parent: string, name: string): { readonly dir: string; readonly argv: readonly string[] } {
  // At the next turn, after the caller spawned bash: a temp dir of thousands of entries takes
  // milliseconds to list.
  setImmediate(() => sweepOrphans(parent, name));
  // The pid in the name says whose it is, for sweepOrphans.
  const dir = mkdtempSync(join(parent, `${name}-${process.pid}-`));
  try {
    const write = (file: string, text: string | Buffer) => writeFileSync(join(dir, file), text, { mode: 0o600 });
    write('first', files.first);
    files.groups.forEach((g, i) => write(`group${i}`, g));
    write('last', files.last);
  } catch (e) {
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }
  const argv = ['bash', '-c', PHASES_SH, name, dir, String(files.groups.length)];
  return { dir, argv };
}

/**
 * Directories `name-<pid>-…` under `parent` left by a process that died before removing its
 * own (killed mid-apply). Only those of a pid that no longer exists go: another natgw process
 * (the daemon beside a shim's in-process run) may be applying in phases right now, and a reused
 * pid only keeps an orphan until the next sweep.
 */
function sweepOrphans(parent: string, name: string): void {
  // Listed and removed on the thread pool: a temp dir of thousands of entries took 3-19 ms to
  // list on the event loop, beside a bulk apply whose phases' and tools' ends it then noticed late.
  readdir(parent, (err, entries) => {
    if (err) return;
    const prefix = `${name}-`;
    for (const entry of entries) {
      if (!entry.startsWith(prefix)) continue;
      const pid = Number(/^(\d+)-/.exec(entry.slice(prefix.length))?.[1]);
      if (!Number.isSafeInteger(pid) || pid <= 0 || alive(pid)) continue;
      rm(join(parent, entry), { recursive: true, force: true }, () => undefined);
    }
  });
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    // EPERM: it exists, under another user.
    return (e as NodeJS.ErrnoException).code !== 'ESRCH';
  }
}
