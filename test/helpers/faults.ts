/**
 * Fault injection on PATH (issue 12): one bash wrapper per tool that makes the Nth matching call
 * of `nft`, `iptables-restore`, `ip`, `tc` or `conntrack` fail, fail half-way or hang, and runs
 * the real tool otherwise. Used by the fault tests and the crash test.
 */
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execFileSync } from 'node:child_process';

export const TOOLS = ['nft', 'iptables-legacy-restore', 'iptables-nft-restore', 'ip', 'tc', 'conntrack'] as const;
export type Tool = (typeof TOOLS)[number];
export type Mode = 'fail' | 'half' | 'hang' | 'half-hang';

export interface Faults {
  /** Put this directory first on the daemon's PATH. */
  readonly dir: string;
  /** `lines`: how many lines of the script the real tool gets in the half modes (default 1). */
  arm(tool: Tool, n: number, mode: Mode, args: string, stdin?: string, lines?: number): void;
  disarm(): void;
  /** The calls that misbehaved since the last arm, one per line. */
  fired(): string;
  /** Whether a call hangs now (in the half mode: after the real tool applied its lines). */
  hanging(): boolean;
  /** End the hangs still running (their daemon was killed), by their own pids. */
  endHung(): void;
  /** endHung, then remove the wrappers. */
  remove(): void;
}

/**
 * One bash wrapper per tool. While `<tool>.plan` holds `N MODE ARGS [STDIN-REGEX [LINES]]`, the
 * calls whose arguments contain ARGS (and whose stdin script has a line matching STDIN-REGEX,
 * when given) are counted, and from the Nth on they misbehave: `fail` (nothing applied), `half`
 * (the real tool gets only the first LINES lines of the script, then the call fails: a batch
 * stopped half-way), `hang`, or `half-hang`. A matching regex picks the change forward and
 * not the roll-back that follows it (which deletes), so the engine's retry fails too and its
 * roll-back runs against the real tool. Every other call runs the real tool.
 */
export function makeWrappers(): Faults {
  const dir = mkdtempSync(join(tmpdir(), 'natgw-faults-'));
  const q = (s: string) => JSON.stringify(s);
  for (const tool of TOOLS) {
    const real = execFileSync('bash', ['-c', 'command -v "$1"', '_', tool], { encoding: 'utf8' }).trim();
    // A restore tool's wrapper reads the plan once the input is in.
    // Spooled inputs live in the wrappers' own directory, removed with it (a fired or passed-on
    // call execs its tool with the file still open, so the script itself cannot remove it).
    const spool = tool.endsWith('-restore') ? `spool=$(mktemp -p ${q(dir)}); cat > "$spool"; exec < "$spool"; rm -f "$spool"\n` : '';
    const script = `#!/bin/bash
${spool}plan=${q(join(dir, `${tool}.plan`))}
count=${q(join(dir, `${tool}.count`))}
if [ -f "$plan" ]; then
  { read -r n; read -r mode; read -r args; read -r re; read -r lines; } < "$plan"
  if [[ "$*" == *"$args"* ]]; then
    input=""
    if [ -n "$re" ]; then
      input=$(mktemp -p ${q(dir)}); cat > "$input"
      if ! grep -qE -- "$re" "$input"; then exec < "$input"; rm -f "$input"; exec ${q(real)} "$@"; fi
    fi
    exec 9>>"$count.lock"; flock 9
    c=$(( $(cat "$count" 2>/dev/null || echo 0) + 1 )); echo "$c" > "$count"
    exec 9>&-
    if [ "$c" -ge "$n" ]; then
      echo "${tool} $*" >> ${q(join(dir, 'fired'))}
      [ -n "$input" ] && exec < "$input" && rm -f "$input"
      case "$mode" in
        hang) echo $$ >> ${q(join(dir, 'hung.pids'))}; exec sleep 600 ;;
        half) head -n "\${lines:-1}" | ${q(real)} "$@"; echo "injected fault: ${tool} stopped half-way" >&2; exit 1 ;;
        half-hang) head -n "\${lines:-1}" | ${q(real)} "$@"; echo $$ >> ${q(join(dir, 'hung.pids'))}; exec sleep 600 ;;
        *) echo "injected fault: ${tool} failed" >&2; exit 1 ;;
      esac
    fi
    [ -n "$input" ] && exec < "$input" && rm -f "$input"
  fi
fi
exec ${q(real)} "$@"
`;
    writeFileSync(join(dir, tool), script);
    chmodSync(join(dir, tool), 0o755);
  }
  const endHung = () => {
    const file = join(dir, 'hung.pids');
    const pids = existsSync(file) ? readFileSync(file, 'utf8').split('\n').filter(Boolean) : [];
    for (const pid of pids) {
      try {
        process.kill(Number(pid), 'SIGKILL');
      } catch {
        // already gone
      }
    }
    rmSync(file, { force: true });
  };
  return {
    dir,
    arm(tool, n, mode, args, stdin = '', lines = 1) {
      rmSync(join(dir, `${tool}.count`), { force: true });
      rmSync(join(dir, 'fired'), { force: true });
      writeFileSync(join(dir, `${tool}.plan`), `${n}\n${mode}\n${args}\n${stdin}\n${lines}\n`);
    },
    disarm() {
      for (const t of TOOLS) rmSync(join(dir, `${t}.plan`), { force: true });
    },
    fired: () => (existsSync(join(dir, 'fired')) ? readFileSync(join(dir, 'fired'), 'utf8') : ''),
    hanging: () => existsSync(join(dir, 'hung.pids')) && readFileSync(join(dir, 'hung.pids'), 'utf8').trim() !== '',
    endHung,
    remove() {
      endHung();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
