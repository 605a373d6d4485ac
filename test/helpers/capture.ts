import type { ChildProcess } from 'node:child_process';
import type { NsRef, Topology } from './netns.js';
import { waitFor } from './poll.js';

/** A running packet capture (tcpdump, line-buffered, numeric) on one interface of a namespace. */
export interface Capture {
  /** The decoded packet lines so far. */
  lines(): string[];
  /** Stop it (SIGKILL: tcpdump's -l output is already flushed line by line). */
  stop(): Promise<void>;
}

/** Start tcpdump on `ifname` in `ns` with a filter given as argv words; resolves once it listens. */
export async function startCapture(topo: Topology, ns: NsRef, ifname: string, filter: readonly string[]): Promise<Capture> {
  const child: ChildProcess = topo.spawn(ns, ['tcpdump', '-i', ifname, '-n', '-l', '-e', ...filter]);
  let out = '';
  let err = '';
  child.stdout?.setEncoding('utf8').on('data', (d: string) => (out += d));
  child.stderr?.setEncoding('utf8').on('data', (d: string) => (err += d));
  const gone = new Promise<void>((r) => child.once('exit', () => r()));
  await waitFor(
    async () => {
      if (child.exitCode !== null) throw new Error(`tcpdump exited: ${err}`);
      return /listening on/.test(err);
    },
    { what: `tcpdump on ${ifname} to listen`, timeoutMs: 10_000, intervalMs: 20 },
  );
  return {
    lines: () => out.split('\n').filter((l) => l.trim() !== ''),
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await gone;
    },
  };
}
