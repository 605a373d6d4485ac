/**
 * A long-lived child started through diesWithNatgw is killed by the kernel when its parent
 * dies, SIGKILL included (no exit handler runs then).
 */
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { diesWithNatgw } from '../../src/system/diesWithNatgw.js';
import { waitFor } from '../helpers/poll.js';

const alive = (pid: number) => existsSync(`/proc/${pid}`) && !/^\S+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));

describe('diesWithNatgw', () => {
  it('runs the tool under setpriv with a parent-death SIGKILL', () => {
    const c = diesWithNatgw('conntrack', ['-E']);
    expect(c.file).toMatch(/\/setpriv$/);
    expect(c.args).toEqual(['--pdeathsig', 'KILL', '--', 'conntrack', '-E']);
  });

  it('its child goes when the parent is killed with SIGKILL', async () => {
    const url = new URL('../../src/system/diesWithNatgw.ts', import.meta.url).href;
    // A parent (node) that starts `sleep` the way natgw starts its followers, prints its pid, and waits.
    const parent = spawn(
      process.execPath,
      [
        '--experimental-strip-types',
        '--input-type=module',
        '-e',
        `import { spawn } from 'node:child_process'; const { diesWithNatgw } = await import(${JSON.stringify(url)});
         const c = diesWithNatgw('sleep', ['300']); const s = spawn(c.file, c.args, { stdio: 'ignore' }); console.log(s.pid); setInterval(() => {}, 1000);`,
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let out = '';
    parent.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
    await waitFor(async () => /^\d+\n/.test(out), { what: 'the child pid', timeoutMs: 10_000 });
    const child = Number(out.trim());
    // The child has exec'd the tool (the same pid) and runs.
    await waitFor(async () => readFileSync(`/proc/${child}/cmdline`, 'utf8').startsWith('sleep\0'), { what: 'sleep to run', timeoutMs: 5000 });
    parent.kill('SIGKILL');
    await waitFor(async () => !alive(child), { what: 'the child to die with its parent', timeoutMs: 5000 });
  }, 20_000);
});
