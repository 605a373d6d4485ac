/**
 * Flow lines in the schema of Kube-OVN's VPC egress gateway observer (NATGW_FLOW_LOG_SCHEMA=
 * kube-ovn, Kube-OVN #7116), from real flows: exactly that observer's field names, and values
 * that describe the connection. The lines come from the kernel's conntrack events, which do not
 * depend on the netfilter backend: one backend does (flow-log.test.ts proves natgw's own schema).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { ONE_BACKEND, type BackendCase } from '../helpers/backends.js';
import { parsePeer, request, startServer, type ServerHandle } from '../helpers/traffic.js';
import { waitFor } from '../helpers/poll.js';
import { api, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';

/** The observer's field names (pkg/vegobserver/flow.go): a line has these, `counters` only when accounted. */
const RECORD_FIELDS = [
  'schemaVersion',
  'timestamp',
  'event',
  'conntrackID',
  'zone',
  'namespace',
  'name',
  'pod',
  'node',
  'addressFamily',
  'protocol',
  'protocolNumber',
  'natType',
  'original',
  'translated',
];
const COUNTER_FIELDS = ['originalPackets', 'originalBytes', 'replyPackets', 'replyBytes'];
const TUPLE_FIELDS = ['sourceIP', 'sourcePort', 'destinationIP', 'destinationPort'];

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Line = any;

const lines = (path: string): Line[] =>
  existsSync(path)
    ? readFileSync(path, 'utf8')
        .split('\n')
        .filter((l) => l.trim() !== '')
        .map((l) => JSON.parse(l) as Line)
    : [];

describe.each(ONE_BACKEND)('flow lines in the kube-ovn schema on $name', (backend: BackendCase) => {
  let topo: Topology;
  let servers: ServerHandle[] = [];
  let daemon: Daemon | undefined;
  let flowFile: string;

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env);
    servers = [startServer(topo, 'ext', 'tcp', 7001), startServer(topo, 'vpc1', 'tcp', 80)];
    await Promise.all(servers.map((s) => s.ready));
    await topo.natgwOk('init');
    await topo.natgwOk('eip-add', `${EIP}/24`);
    await topo.natgwOk('snat-add', `${EIP},${ADDR.vpcCidr}`);
    await topo.natgwOk('dnat-add', `${EIP},8080,tcp,${ADDR.vpc1},80`);
    flowFile = join(topo.stateDir, 'flows.log');
    daemon = await startDaemon(topo, {
      NATGW_FLOW_LOG: 'file',
      NATGW_FLOW_LOG_FILE: flowFile,
      NATGW_FLOW_LOG_SCHEMA: 'kube-ovn',
      NATGW_GATEWAY_NAME: 'gw1',
      NATGW_CONNTRACK_SYSCTLS: 'true',
      // As the downward API would set them in the pod.
      POD_NAMESPACE: 'kube-system',
      POD_NAME: 'vpc-nat-gw-gw1-0',
      NODE_NAME: 'node1',
    });
    await waitReady(topo, daemon);
    await waitFor(async () => /^natgw_conntrack_events_up 1$/m.test((await api(socketOf(topo), 'GET', '/metrics')).text), {
      what: 'the conntrack event follower to run',
    });
  });

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon).catch(() => undefined);
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  });

  it('a SNAT and a DNAT connection: start and end lines with the observer fields and values', async () => {
    const snat = parsePeer(await request(topo, 'vpc1', 'tcp', ADDR.extHost, 7001, { localPort: 40101 }));
    await request(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost, localPort: 40102 });
    expect(snat.ip).toBe(EIP);
    // The connections are over: end them now rather than after the kernel's TIME_WAIT.
    const ended = await waitFor(
      async () => {
        for (const sport of ['40101', '40102']) await topo.exec('gw', ['conntrack', '-D', '-p', 'tcp', '--orig-port-src', sport], { reject: false });
        const l = lines(flowFile);
        return l.filter((x) => x.event === 'end').length >= 2 ? l : undefined;
      },
      { what: 'an end line for each connection', timeoutMs: 20_000, intervalMs: 250 },
    );
    expect(ended.map((l) => `${l.event} ${l.original.sourcePort}`).sort()).toEqual(['end 40101', 'end 40102', 'start 40101', 'start 40102']);
    for (const l of ended) {
      const fields = Object.keys(l);
      expect(fields.filter((f) => f !== 'counters')).toEqual(RECORD_FIELDS);
      expect(Object.keys(l.original)).toEqual(TUPLE_FIELDS);
      expect(Object.keys(l.translated)).toEqual(TUPLE_FIELDS);
      expect(l).toMatchObject({
        schemaVersion: 'v1',
        zone: 0,
        namespace: 'kube-system',
        name: 'gw1',
        pod: 'vpc-nat-gw-gw1-0',
        node: 'node1',
        addressFamily: 'ipv4',
        protocol: 'tcp',
        protocolNumber: 6,
      });
      expect(typeof l.conntrackID).toBe('number');
      expect(new Date(l.timestamp).toISOString()).toBe(l.timestamp);
      // Counters only where the kernel accounted them: at the end (NATGW_CONNTRACK_SYSCTLS).
      if (l.event === 'start') expect(l.counters).toBeUndefined();
      else {
        expect(Object.keys(l.counters)).toEqual(COUNTER_FIELDS);
        for (const f of COUNTER_FIELDS) expect(l.counters[f]).toBeGreaterThan(0);
      }
    }
    const of = (sport: number, event: string) => ended.find((l) => l.original.sourcePort === sport && l.event === event);
    expect(of(40101, 'start')).toMatchObject({
      natType: ['snat'],
      original: { sourceIP: ADDR.vpc1, sourcePort: 40101, destinationIP: ADDR.extHost, destinationPort: 7001 },
      translated: { sourceIP: EIP, sourcePort: snat.port, destinationIP: ADDR.extHost, destinationPort: 7001 },
    });
    expect(of(40102, 'start')).toMatchObject({
      natType: ['dnat'],
      original: { sourceIP: ADDR.extHost, sourcePort: 40102, destinationIP: EIP, destinationPort: 8080 },
      translated: { sourceIP: ADDR.extHost, sourcePort: 40102, destinationIP: ADDR.vpc1, destinationPort: 80 },
    });
    // A connection's end names the same kernel entry as its start.
    expect(of(40101, 'end').conntrackID).toBe(of(40101, 'start').conntrackID);
    expect(of(40102, 'end').conntrackID).toBe(of(40102, 'start').conntrackID);
  });
});
