/** Driving two natgw replicas of an HaTopology: start, configure through the script's commands, read /v1/ha and /metrics. */
import type { ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { HA_ADDR, type HaTopology, type Replica } from '../helpers/haTopology.js';
import { api, ok, waitServing } from './daemon-util.js';

export interface Replicad {
  readonly r: Replica;
  readonly child: ChildProcess;
  logs(): string;
}

export const other = (r: Replica): Replica => (r === 'ga' ? 'gb' : 'ga');

/** Environment that turns replica sync on for `r` (peer over sync0). */
export function syncEnv(r: Replica): Record<string, string> {
  return { NATGW_HA_PEERS: HA_ADDR.sync[other(r)], NATGW_HA_SYNC_INTERFACE: 'sync0', NATGW_HA_SYNC_TIMEOUT: '3s' };
}

export async function startReplica(topo: HaTopology, r: Replica, env: Record<string, string>): Promise<Replicad> {
  const child = topo.spawnNatgw(r, env, 'serve');
  return { r, child, logs: await waitServing(child, topo.socket(r), r) };
}

export async function legacy(topo: HaTopology, r: Replica, command: string, ...rules: string[]): Promise<void> {
  const res = ok(await api(topo.socket(r), 'POST', '/v1/legacy', { command, rules }), `${command} on ${r}`);
  if (res.body.status !== 0) throw new Error(`${command} ${rules.join(' ')} on ${r}: ${JSON.stringify(res.body)}`);
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export async function haStatus(topo: HaTopology, r: Replica): Promise<any> {
  return ok(await api(topo.socket(r), 'GET', '/v1/ha'), `GET /v1/ha on ${r}`).body;
}

/** One sample of a metric from /metrics (first line matching name and labels). */
export async function metric(topo: HaTopology, r: Replica, name: string, labels = ''): Promise<number | undefined> {
  const text = ok(await api(topo.socket(r), 'GET', '/metrics'), `metrics of ${r}`).text;
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels ? `{${labels}}` : ''} `) || (!labels && l.startsWith(`${name}{`)));
  return line === undefined ? undefined : Number(line.split(' ').pop());
}

export async function metricsText(topo: HaTopology, r: Replica): Promise<string> {
  return ok(await api(topo.socket(r), 'GET', '/metrics'), `metrics of ${r}`).text;
}

/** A UDP "connection": one socket, one datagram per send(), the answer line back (or null). */
const UDP_FLOW = `
const [host, port] = process.argv.slice(1);
const s = require('dgram').createSocket('udp4');
s.on('message', (m) => process.stdout.write(String(m).trim() + '\\n'));
s.bind(0, () => process.stdout.write('bound\\n'));
process.stdin.on('data', (d) => s.send(String(d).trim(), Number(port), host));`;

export interface UdpFlow {
  send(timeoutMs?: number): Promise<string | null>;
  close(): void;
}

export async function startUdpFlow(topo: HaTopology, ns: string, host: string, port: number): Promise<UdpFlow> {
  const child = topo.spawn(ns, [process.execPath, '-e', UDP_FLOW, '--', host, String(port)]);
  const lines = createInterface({ input: child.stdout! });
  const queue: string[] = [];
  let waiter: ((l: string) => void) | undefined;
  lines.on('line', (l) => {
    if (waiter) waiter(l);
    else queue.push(l);
  });
  const next = (timeoutMs: number): Promise<string | null> =>
    new Promise((resolve) => {
      const l = queue.shift();
      if (l !== undefined) return resolve(l);
      const t = setTimeout(() => {
        waiter = undefined;
        resolve(null);
      }, timeoutMs);
      waiter = (line) => {
        clearTimeout(t);
        waiter = undefined;
        resolve(line);
      };
    });
  if ((await next(10_000)) !== 'bound') throw new Error('udp flow did not start');
  return {
    send: async (timeoutMs = 3000) => {
      queue.length = 0;
      child.stdin!.write('ping\n');
      return next(timeoutMs);
    },
    close: () => child.kill('SIGKILL'),
  };
}
