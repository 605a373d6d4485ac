/**
 * SNAT port usage (per EIP and destination, from conntrack events), the port-allocation failure
 * count from `conntrack -S`, and flow lines in the schema of Kube-OVN's egress gateway observer.
 * The real kernel's side is test/netns/snat-ports.test.ts and test/netns/flow-log-schema.test.ts.
 */
import { describe, expect, it } from 'vitest';
import pino from 'pino';
import { Registry } from 'prom-client';
import { ConntrackMonitor } from '../../src/observe/conntrackMonitor.js';
import { ConntrackMetrics, portAllocationFailures } from '../../src/observe/conntrackMetrics.js';
import { parseConntrackLine } from '../../src/model/conntrackLine.js';
import { parseConntrackStats } from '../../src/observe/conntrackMetrics.js';
import { kubeOvnFlowRecord } from '../../src/observe/flowLog.js';
import { PortUsage } from '../../src/observe/portUsage.js';
import type { Executor } from '../../src/system/exec.js';
import { emptyState } from '../../src/state/state.js';

const EIP = '172.20.0.10';
const EIP2 = '172.20.0.11';
const state = {
  ...emptyState('eth0', 'net1'),
  eips: [
    { address: EIP, prefixLength: 24 },
    { address: EIP2, prefixLength: 24 },
  ],
  snats: [
    { eip: EIP, cidr: '10.0.1.0/24', randomFully: false },
    { eip: EIP2, cidr: '10.0.2.0/24', randomFully: false },
  ],
  dnats: [{ eip: EIP, port: 8080, protocol: 'tcp' as const, internalIp: '10.0.1.6', internalPort: 80 }],
};

/** A SNAT connection from `src`:sport to dst:dport, translated to eip:port. */
const snat = (
  event: 'NEW' | 'DESTROY',
  id: number,
  o: { src?: string; sport: number; dst?: string; dport?: number; eip?: string; port: number; proto?: 'tcp' | 'udp' },
) => {
  const proto = o.proto ?? 'tcp';
  const dst = o.dst ?? '172.20.0.100';
  const dport = o.dport ?? 7001;
  return `[1796044351.5]\t[${event}] ipv4     2 ${proto}      ${proto === 'tcp' ? 6 : 17} 120 src=${o.src ?? '10.0.1.6'} dst=${dst} sport=${o.sport} dport=${dport} src=${dst} dst=${o.eip ?? EIP} sport=${dport} dport=${o.port} id=${id}`;
};

const noListing: Executor = {
  run: async (req) => ({ command: req.file, exitCode: 0, stdout: '', stderr: '', timedOut: false, failedToStart: false }),
};

function monitor(range = { min: 20000, max: 20009 }) {
  const m = new ConntrackMonitor({ exec: noListing, log: pino({ level: 'silent' }), snatPorts: range });
  m.setState(state);
  return m;
}

describe('PortUsage', () => {
  it('counts connections per EIP and destination and forgets empty destinations', () => {
    const u = new PortUsage({ min: 1, max: 4 });
    const a = u.add(EIP, '1.1.1.1', 443, 'tcp', undefined);
    u.add(EIP, '1.1.1.1', 443, 'tcp', undefined);
    const b = u.add(EIP, '1.1.1.1', 443, 'udp', undefined);
    expect(u.report(0)).toEqual([{ eip: EIP, destinations: 2, maxPorts: 2, maxShare: 0.5, top: [] }]);
    u.remove(b);
    u.remove(a);
    u.remove(a);
    expect(u.report(0)).toEqual([]);
  });

  it('keeps an IPv6 destination whole', () => {
    const u = new PortUsage();
    u.add('fd00:20::10', 'fd00:20::100', 443, 'tcp', undefined);
    expect(u.report()[0]!.top).toEqual([{ ip: 'fd00:20::100', port: 443, protocol: 'tcp', ports: 1, share: 1 / 64512 }]);
  });

  it('reports the busiest destinations, most ports first, at most `top` of them', () => {
    const u = new PortUsage({ min: 1, max: 10 });
    const ns = [3, 1, 7, 5, 2, 9, 4];
    ns.forEach((n, i) => {
      for (let k = 0; k < n; k++) u.add(EIP, `10.9.0.${i}`, 80, 'tcp', undefined);
    });
    const [r] = u.report(3);
    expect(r!.top.map((d) => d.ports)).toEqual([9, 7, 5]);
    expect(r!.top[0]).toEqual({ ip: '10.9.0.5', port: 80, protocol: 'tcp', ports: 9, share: 0.9 });
    expect(r!.destinations).toBe(7);
    expect(r!.maxShare).toBe(0.9);
  });
});

describe('ConntrackMonitor SNAT port usage', () => {
  it('counts the ports each EIP uses toward each destination, up and down', () => {
    const m = monitor();
    for (let i = 0; i < 10; i++) m.onLine(snat('NEW', i + 1, { sport: 40000 + i, port: 20000 + i }));
    // Another destination port, another protocol, another EIP: each its own destination.
    m.onLine(snat('NEW', 100, { sport: 41000, dport: 7002, port: 20000 }));
    m.onLine(snat('NEW', 101, { sport: 41001, port: 20000, proto: 'udp' }));
    m.onLine(snat('NEW', 102, { src: '10.0.2.5', sport: 41002, eip: EIP2, port: 20000 }));
    const byEip = new Map(m.portUsage({ top: 5 }).map((u) => [u.eip, u]));
    expect(byEip.get(EIP)).toMatchObject({ destinations: 3, maxPorts: 10, maxShare: 1 });
    expect(byEip.get(EIP)!.top[0]).toEqual({ ip: '172.20.0.100', port: 7001, protocol: 'tcp', ports: 10, share: 1 });
    expect(byEip.get(EIP2)).toMatchObject({ destinations: 1, maxPorts: 1, maxShare: 0.1 });
    for (let i = 0; i < 5; i++) m.onLine(snat('DESTROY', i + 1, { sport: 40000 + i, port: 20000 + i }));
    expect(m.portUsage().find((u) => u.eip === EIP)).toMatchObject({ maxPorts: 5, maxShare: 0.5 });
    // The per-kind counts stay as they were.
    expect(m.connections().find((c) => c.eip === EIP && c.kind === 'snat')?.n).toBe(7);
  });

  it('leaves DNAT and ICMP connections out', () => {
    const m = monitor();
    m.onLine(
      `[1796044351.5]\t[NEW] ipv4     2 tcp      6 120 SYN_SENT src=172.20.0.100 dst=${EIP} sport=5000 dport=8080 src=10.0.1.6 dst=172.20.0.100 sport=80 dport=5000 id=1`,
    );
    m.onLine(
      `[1796044351.5]\t[NEW] ipv4     2 icmp     1 30 src=10.0.1.6 dst=172.20.0.100 type=8 code=0 id=7 src=172.20.0.100 dst=${EIP} type=0 code=0 id=7 id=2`,
    );
    expect(m.portUsage()).toEqual([]);
    expect(
      m
        .connections()
        .map((c) => c.kind)
        .sort(),
    ).toEqual(['dnat', 'snat']);
  });
});

describe('port allocation failures', () => {
  const stats = (insertFailed: number, chainTooLong = 0) =>
    parseConntrackStats(
      `cpu=0   \tfound=0 invalid=0 insert=0 insert_failed=${insertFailed} drop=${insertFailed} early_drop=0 error=0 search_restart=0 clash_resolve=0 chaintoolong=${chainTooLong} \ncpu=1   \tfound=0 invalid=0 insert=0 insert_failed=2 drop=2 early_drop=0 error=0 search_restart=0 clash_resolve=0 chaintoolong=0 \n`,
    );

  it('are insert_failed without the refusals of a too-long hash chain', () => {
    expect(portAllocationFailures(stats(5))).toBe(7);
    expect(portAllocationFailures(stats(5, 3))).toBe(4);
    expect(portAllocationFailures(new Map())).toBeUndefined();
  });

  it('the counter follows the kernel across scrapes, reading conntrack -S once per scrape', async () => {
    let failed = 3;
    let runs = 0;
    const exec: Executor = {
      run: async (req) => {
        runs++;
        return {
          command: req.file,
          exitCode: 0,
          stdout: `cpu=0   \tfound=0 invalid=0 insert=0 insert_failed=${failed} drop=${failed} early_drop=0 error=0 search_restart=0 clash_resolve=0 chaintoolong=0 \n`,
          stderr: '',
          timedOut: false,
          failedToStart: false,
        };
      },
    };
    const registry = new Registry();
    new ConntrackMetrics(registry, { exec, procDir: '/nonexistent', snatPortRangeSize: 10 });
    const value = async () => (await registry.getSingleMetric('natgw_snat_port_allocation_failures_total')!.get()).values[0]?.value;
    const text = await registry.metrics();
    expect(text).toContain('natgw_snat_port_allocation_failures_total 3');
    expect(text).toContain('natgw_conntrack_stat{stat="insert_failed"} 3');
    expect(text).toContain('natgw_snat_port_range_size 10');
    expect(runs).toBe(1);
    failed = 8;
    await new Promise((r) => setTimeout(r, 1100));
    expect(await value()).toBe(8);
  });
});

describe('flow lines in the kube-ovn schema', () => {
  const id = { namespace: 'kube-system', name: 'gw1', pod: 'vpc-nat-gw-gw1-0', node: 'node1' };

  it('a SNAT start: the observer fields, ports, natType, no counters', () => {
    const e = parseConntrackLine(snat('NEW', 42, { sport: 40001, port: 20005 }))!;
    expect(kubeOvnFlowRecord(e, id, 0)).toEqual({
      schemaVersion: 'v1',
      timestamp: new Date(1796044351500).toISOString(),
      event: 'start',
      conntrackID: 42,
      zone: 0,
      namespace: 'kube-system',
      name: 'gw1',
      pod: 'vpc-nat-gw-gw1-0',
      node: 'node1',
      addressFamily: 'ipv4',
      protocol: 'tcp',
      protocolNumber: 6,
      natType: ['snat'],
      original: { sourceIP: '10.0.1.6', sourcePort: 40001, destinationIP: '172.20.0.100', destinationPort: 7001 },
      translated: { sourceIP: EIP, sourcePort: 20005, destinationIP: '172.20.0.100', destinationPort: 7001 },
    });
  });

  it('an end with accounting carries counters; ICMP has no ports; a zone is kept', () => {
    const end = parseConntrackLine(
      `[1796044351.5]\t[DESTROY] ipv6     10 udp      17 src=fd00::6 dst=fd00:20::100 sport=5000 dport=53 packets=1 bytes=70 src=fd00:20::100 dst=fd00:20::10 sport=53 dport=5000 packets=1 bytes=90 zone=3 delta-time=0 id=9`,
    )!;
    const r = kubeOvnFlowRecord(end, id, 0);
    expect(r).toMatchObject({ event: 'end', addressFamily: 'ipv6', protocol: 'udp', protocolNumber: 17, zone: 3, conntrackID: 9, natType: ['snat'] });
    expect(r.counters).toEqual({ originalPackets: 1, originalBytes: 70, replyPackets: 1, replyBytes: 90 });
    const icmp = parseConntrackLine(
      `[1796044351.5]\t[NEW] ipv4     2 icmp     1 30 src=172.20.0.100 dst=${EIP} type=8 code=0 id=7 src=10.0.1.6 dst=172.20.0.100 type=0 code=0 id=7 id=2`,
    )!;
    const ri = kubeOvnFlowRecord(icmp, id, 0);
    expect(ri.original).toEqual({ sourceIP: '172.20.0.100', destinationIP: EIP });
    expect(ri).toMatchObject({ protocol: 'icmp', protocolNumber: 1, natType: ['dnat'] });
    const sctp = parseConntrackLine(snat('NEW', 5, { sport: 1, port: 2 }).replace('tcp      6', 'dccp     33'))!;
    expect(kubeOvnFlowRecord(sctp, id, 0)).toMatchObject({ protocol: 'other', protocolNumber: 33 });
  });
});
