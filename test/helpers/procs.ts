import { readdirSync, readFileSync } from 'node:fs';

/** The live children of `pid` (zombies left out) whose argv `match` accepts, from /proc. */
export function childrenOf(pid: number, match: (argv: readonly string[]) => boolean): number[] {
  const out: number[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const [state, ppid] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(ppid) !== pid || state === 'Z') continue;
      if (match(readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0'))) out.push(Number(d));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}
