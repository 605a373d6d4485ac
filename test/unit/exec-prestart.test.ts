/**
 * The executor's spare processes for prestartable runs (iptables-restore in the daemon): once
 * the caller says nothing waits (startSpares), a process of the tool used is started and left
 * waiting for its input; the next run of that tool is handed to it. Off by default; a spare
 * that died is not handed out. A small shell stands in for the tool: it prints its own pid.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { SystemExecutor, type ExecRequest } from '../../src/system/exec.js';
import { waitFor } from '../helpers/poll.js';

const started: number[] = [];
afterEach(() => {
  for (const pid of started.splice(0)) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
});

/** The tool: reads one line, answers with its pid and the line. `name` ($0) finds it in /proc. */
function tool(name: string): ExecRequest {
  return { file: 'sh', args: ['-c', 'IFS= read -r l; echo "$$ $l"', name], input: 'go\n', prestartable: true, single: true };
}

/** This process's children whose command line holds `name`. */
function childrenNamed(name: string): number[] {
  const pids: number[] = [];
  for (const task of readdirSync(`/proc/${process.pid}/task`)) {
    let list = '';
    try {
      list = readFileSync(`/proc/${process.pid}/task/${task}/children`, 'utf8');
    } catch {
      continue;
    }
    for (const p of list.trim().split(/\s+/).filter(Boolean).map(Number)) {
      try {
        if (readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0').includes(name)) pids.push(p);
      } catch {
        // gone meanwhile
      }
    }
  }
  started.push(...pids);
  return pids;
}

async function pidOf(exec: SystemExecutor, req: ExecRequest): Promise<number> {
  const r = await exec.run(req);
  expect(r.exitCode).toBe(0);
  const [pid, line] = r.stdout.trim().split(' ');
  expect(line).toBe('go');
  return Number(pid);
}

describe('SystemExecutor spares (prestart)', () => {
  it('hands the next run of a tool the process started at startSpares', async () => {
    const name = `natgw-spare-${randomUUID()}`;
    const exec = new SystemExecutor(undefined, { deadlineMs: 10_000, prestart: true, runner: false });
    const first = await pidOf(exec, tool(name));
    expect(childrenNamed(name)).toEqual([]);
    exec.startSpares();
    const [spare, ...more] = childrenNamed(name);
    expect(more).toEqual([]);
    expect(spare).not.toBe(first);
    expect(await pidOf(exec, tool(name))).toBe(spare);
    // Used up: nothing waits until the caller asks again.
    expect(childrenNamed(name)).toEqual([]);
  });

  it('keeps no spare without prestart, or for a run not marked prestartable', async () => {
    const name = `natgw-spare-${randomUUID()}`;
    const off = new SystemExecutor(undefined, { deadlineMs: 10_000 });
    await pidOf(off, tool(name));
    off.startSpares();
    expect(childrenNamed(name)).toEqual([]);
    const on = new SystemExecutor(undefined, { deadlineMs: 10_000, prestart: true, runner: false });
    await pidOf(on, { ...tool(name), prestartable: false });
    on.startSpares();
    expect(childrenNamed(name)).toEqual([]);
  });

  it('does not hand out a spare that died: the run starts its own', async () => {
    const name = `natgw-spare-${randomUUID()}`;
    const exec = new SystemExecutor(undefined, { deadlineMs: 10_000, prestart: true, runner: false });
    await pidOf(exec, tool(name));
    exec.startSpares();
    const [spare] = childrenNamed(name);
    expect(spare).toBeDefined();
    process.kill(spare!, 'SIGKILL');
    await waitFor(async () => !existsSync(`/proc/${spare}`), { what: 'the killed spare reaped', intervalMs: 10 });
    const pid = await pidOf(exec, tool(name));
    expect(pid).not.toBe(spare);
  });
});
