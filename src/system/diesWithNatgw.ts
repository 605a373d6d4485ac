import { accessSync, constants } from 'node:fs';
import { delimiter, join } from 'node:path';

let setprivAt: string | null | undefined;

/** util-linux's setpriv on PATH, looked up once; null when there is none. */
function setpriv(): string | null {
  if (setprivAt === undefined) {
    setprivAt = null;
    for (const dir of (process.env.PATH ?? '/usr/bin:/bin').split(delimiter)) {
      try {
        accessSync(join(dir, 'setpriv'), constants.X_OK);
        setprivAt = join(dir, 'setpriv');
        break;
      } catch {
        // not here
      }
    }
  }
  return setprivAt;
}

/**
 * The command line of a long-lived child that must not outlive natgw, however natgw ends: a
 * SIGKILL or an OOM kill runs no exit handler, and a follower (`conntrack -E`, `ip monitor`) in
 * a quiet namespace would wait for an event forever, one more at every restart. util-linux's
 * `setpriv --pdeathsig KILL` asks the kernel to kill the child when its parent (natgw's main
 * thread, which starts every child) ends, then execs the tool in its place (the same pid).
 * Where setpriv is missing the tool runs as it is (and ends on its next write, or with natgw's
 * own exit handlers).
 */
export function diesWithNatgw(file: string, args: readonly string[]): { readonly file: string; readonly args: readonly string[] } {
  const at = setpriv();
  return at ? { file: at, args: ['--pdeathsig', 'KILL', '--', file, ...args] } : { file, args };
}
