/**
 * The pure parts of flow logs and conntrack metrics: parsing conntrack's output (lines captured
 * from real runs of conntrack v1.4.7 on Linux 6.18), classifying entries against a desired
 * state, the token bucket and the flow-line shape.
 */
import { describe, expect, it } from 'vitest';
import { parseConntrackLine } from '../../src/model/conntrackLine.js';
import { parseConntrackStats } from '../../src/observe/conntrackMetrics.js';
import { FlowIndex } from '../../src/observe/classify.js';
import { FlowLog, flowRecord, type FlowSink } from '../../src/observe/flowLog.js';
import { emptyState } from '../../src/state/state.js';

// `conntrack -E -e NEW,DESTROY -o timestamp,extended,id` (a DNAT by an output hook, UDP, ICMP, a -D).
const NEW_TCP =
  '[1796044351.519127]\t    [NEW] ipv4     2 tcp      6 120 SYN_SENT src=10.99.0.1 dst=10.99.0.2 sport=41946 dport=8080 [UNREPLIED] src=10.99.0.2 dst=10.99.0.1 sport=9000 dport=41946 id=4219329350';
const NEW_ICMP =
  '[1796044351.662377]\t    [NEW] ipv4     2 icmp     1 30 src=10.99.0.1 dst=10.99.0.2 type=8 code=0 id=31334 [UNREPLIED] src=10.99.0.2 dst=10.99.0.1 type=0 code=0 id=31334 id=1655812393';
const DESTROY_UDP =
  '[1796044351.681118]\t[DESTROY] ipv4     2 udp      17 29 src=10.99.0.1 dst=10.99.0.2 sport=55330 dport=5353 packets=1 bytes=29 [UNREPLIED] src=10.99.0.2 dst=10.99.0.1 sport=5353 dport=55330 packets=0 bytes=0 delta-time=0 id=4150140721 [USERSPACE] portid=2529794349 progname=conntrack';
// `conntrack -L -o extended,id`
const LIST_TCP =
  'ipv4     2 tcp      6 119 TIME_WAIT src=10.99.0.1 dst=10.99.0.2 sport=41946 dport=8080 packets=4 bytes=216 src=10.99.0.2 dst=10.99.0.1 sport=9000 dport=41946 packets=4 bytes=218 [ASSURED] mark=0 delta-time=0 use=1 id=4219329350';
const STATS = `cpu=0   \tfound=0 invalid=3 insert=0 insert_failed=2 drop=1 early_drop=0 error=0 search_restart=0 clash_resolve=0 chaintoolong=0 
cpu=1   \tfound=0 invalid=1 insert=0 insert_failed=5 drop=0 early_drop=7 error=0 search_restart=0 clash_resolve=0 chaintoolong=0 
`;

describe('parseConntrackLine', () => {
  it('reads a NEW event: time, both tuples, the entry id', () => {
    expect(parseConntrackLine(NEW_TCP)).toEqual({
      event: 'new',
      time: 1796044351.519127,
      family: 4,
      protocol: 'tcp',
      protocolNumber: 6,
      original: { src: '10.99.0.1', dst: '10.99.0.2', sport: 41946, dport: 8080 },
      reply: { src: '10.99.0.2', dst: '10.99.0.1', sport: 9000, dport: 41946 },
      id: 4219329350,
    });
  });

  it('takes the last id= as the entry id (ICMP tuples carry an echo id)', () => {
    const e = parseConntrackLine(NEW_ICMP)!;
    expect(e.id).toBe(1655812393);
    expect(e.protocol).toBe('icmp');
    expect(e.original).toEqual({ src: '10.99.0.1', dst: '10.99.0.2' });
  });

  it('reads a DESTROY with accounting: counters per direction and the lifetime', () => {
    const e = parseConntrackLine(DESTROY_UDP)!;
    expect(e.event).toBe('destroy');
    expect(e.originalCounters).toEqual({ packets: 1, bytes: 29 });
    expect(e.replyCounters).toEqual({ packets: 0, bytes: 0 });
    expect(e.durationS).toBe(0);
    expect(e.id).toBe(4150140721);
  });

  it('reads a listing line (no event, no time)', () => {
    const e = parseConntrackLine(LIST_TCP)!;
    expect(e.event).toBeUndefined();
    expect(e.time).toBeUndefined();
    expect(e.reply).toEqual({ src: '10.99.0.2', dst: '10.99.0.1', sport: 9000, dport: 41946 });
    expect(e.id).toBe(4219329350);
  });

  it('has no counters without accounting', () => {
    expect(parseConntrackLine(NEW_TCP)!.originalCounters).toBeUndefined();
  });

  it('ignores summaries, UPDATE events and garbage', () => {
    for (const l of [
      'conntrack v1.4.7 (conntrack-tools): 4 flow events have been shown.',
      '',
      'src=1.2.3.4',
      NEW_TCP.replace('[NEW]', '[UPDATE]'),
      'ipv4 2 tcp 6 120 src=x dst=y src=z dst=w',
    ]) {
      expect(parseConntrackLine(l)).toBeUndefined();
    }
  });

  it('canonicalises IPv6 addresses', () => {
    const l =
      '[1.5]\t    [NEW] ipv6     10 tcp      6 120 SYN_SENT src=fd00:0:0::6 dst=fd00:20::100 sport=1 dport=2 [UNREPLIED] src=fd00:20::100 dst=fd00:20::a sport=2 dport=1 id=7';
    const e = parseConntrackLine(l)!;
    expect(e.family).toBe(6);
    expect(e.original.src).toBe('fd00::6');
  });
});

// Captured in natgw's test topology (nftables backend): SNAT 10.0.1.6 → 172.20.0.10, DNAT
// 172.20.0.10:8080 → 10.0.1.6:80, FIP 172.20.0.11 ↔ 10.0.1.7; the DESTROYs came from expiry
// (no timeout column), with accounting and timestamps on.
const NATGW_EVENTS = [
  '[1796045938.952373]\t    [NEW] ipv4     2 tcp      6 120 SYN_SENT src=10.0.1.6 dst=172.20.0.100 sport=40001 dport=7001 [UNREPLIED] src=172.20.0.100 dst=172.20.0.10 sport=7001 dport=40001 id=4265518758',
  '[1796045939.354995]\t    [NEW] ipv4     2 tcp      6 120 SYN_SENT src=172.20.0.100 dst=172.20.0.10 sport=40002 dport=8080 [UNREPLIED] src=10.0.1.6 dst=172.20.0.100 sport=80 dport=40002 id=3703823808',
  '[1796045939.700646]\t    [NEW] ipv4     2 udp      17 1 src=10.0.1.7 dst=172.20.0.100 sport=40004 dport=7002 [UNREPLIED] src=172.20.0.100 dst=172.20.0.11 sport=7002 dport=40004 id=3471850376',
  '[1796045957.137831]\t[DESTROY] ipv4     2 udp      17 src=10.0.1.7 dst=172.20.0.100 sport=40004 dport=7002 packets=1 bytes=34 src=172.20.0.100 dst=172.20.0.11 sport=7002 dport=40004 packets=1 bytes=51 delta-time=1 id=3471850376',
  '[1796045957.138472]\t[DESTROY] ipv4     2 tcp      6 TIME_WAIT src=10.0.1.6 dst=172.20.0.100 sport=40001 dport=7001 packets=4 bytes=216 src=172.20.0.100 dst=172.20.0.10 sport=7001 dport=40001 packets=4 bytes=239 [ASSURED] delta-time=1 id=4265518758',
  '[1796045957.138614]\t[DESTROY] ipv4     2 tcp      6 TIME_WAIT src=172.20.0.100 dst=172.20.0.10 sport=40002 dport=8080 packets=4 bytes=216 src=10.0.1.6 dst=172.20.0.100 sport=80 dport=40002 packets=4 bytes=240 [ASSURED] delta-time=1 id=3703823808',
];

describe('real natgw events', () => {
  const idx = new FlowIndex({
    ...emptyState('eth0', 'net1'),
    eips: [
      { address: '172.20.0.10', prefixLength: 24 },
      { address: '172.20.0.11', prefixLength: 24 },
    ],
    snats: [{ eip: '172.20.0.10', cidr: '10.0.1.0/24', randomFully: false }],
    dnats: [{ eip: '172.20.0.10', port: 8080, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 }],
    fips: [{ eip: '172.20.0.11', internalIp: '10.0.1.7' }],
  });

  it('parses every line and classifies it', () => {
    const got = NATGW_EVENTS.map((l) => {
      const e = parseConntrackLine(l)!;
      const c = idx.classify(e)!;
      return `${e.event} ${c.kind} ${c.eip} ${e.original.sport}${e.originalCounters ? ` ${e.originalCounters.bytes}/${e.replyCounters!.bytes}` : ''}`;
    });
    expect(got).toEqual([
      'new snat 172.20.0.10 40001',
      'new dnat 172.20.0.10 40002',
      'new fip 172.20.0.11 40004',
      'destroy fip 172.20.0.11 40004 34/51',
      'destroy snat 172.20.0.10 40001 216/239',
      'destroy dnat 172.20.0.10 40002 216/240',
    ]);
  });
});

describe('parseConntrackStats', () => {
  it('sums every statistic over CPUs', () => {
    const s = parseConntrackStats(STATS);
    expect(s.get('insert_failed')).toBe(7);
    expect(s.get('drop')).toBe(1);
    expect(s.get('early_drop')).toBe(7);
    expect(s.get('invalid')).toBe(4);
  });
});

describe('FlowIndex.classify', () => {
  const state = {
    ...emptyState('eth0', 'net1'),
    eips: [
      { address: '172.20.0.10', prefixLength: 24 },
      { address: '172.20.0.11', prefixLength: 24 },
      { address: '172.20.0.12', prefixLength: 24 },
    ],
    snats: [{ eip: '172.20.0.10', cidr: '10.0.1.0/24', randomFully: false }],
    dnats: [{ eip: '172.20.0.10', port: 8080, protocol: 'tcp' as const, internalIp: '10.0.1.6', internalPort: 80 }],
    fips: [{ eip: '172.20.0.11', internalIp: '10.0.1.7' }],
    shareDnats: [{ eip: '172.20.0.12', port: 53, protocol: 'udp' as const, protocolText: 'udp', backends: [{ ip: '10.0.1.6', port: 5353 }] }],
  };
  const idx = new FlowIndex(state);
  const t = (src: string, sport: number, dst: string, dport: number) => ({ src, sport, dst, dport });

  it('SNAT: the reply goes to an EIP the original did not come from', () => {
    expect(idx.classify({ protocol: 'tcp', original: t('10.0.1.6', 4000, '172.20.0.100', 7001), reply: t('172.20.0.100', 7001, '172.20.0.10', 4000) })).toEqual(
      { kind: 'snat', eip: '172.20.0.10' },
    );
  });
  it('DNAT: the reply comes from the rule’s internal address', () => {
    expect(idx.classify({ protocol: 'tcp', original: t('172.20.0.100', 5000, '172.20.0.10', 8080), reply: t('10.0.1.6', 80, '172.20.0.100', 5000) })).toEqual({
      kind: 'dnat',
      eip: '172.20.0.10',
    });
  });
  it('FIP both ways', () => {
    expect(idx.classify({ protocol: 'udp', original: t('172.20.0.100', 5000, '172.20.0.11', 99), reply: t('10.0.1.7', 99, '172.20.0.100', 5000) })).toEqual({
      kind: 'fip',
      eip: '172.20.0.11',
    });
    expect(idx.classify({ protocol: 'udp', original: t('10.0.1.7', 5000, '172.20.0.100', 99), reply: t('172.20.0.100', 99, '172.20.0.11', 5000) })).toEqual({
      kind: 'fip',
      eip: '172.20.0.11',
    });
  });
  it('share DNAT by EIP, port and protocol', () => {
    expect(idx.classify({ protocol: 'udp', original: t('172.20.0.100', 5000, '172.20.0.12', 53), reply: t('10.0.1.6', 5353, '172.20.0.100', 5000) })).toEqual({
      kind: 'share-dnat',
      eip: '172.20.0.12',
    });
  });
  it('nothing for untranslated entries or foreign addresses', () => {
    expect(idx.classify({ protocol: 'tcp', original: t('10.0.1.6', 4000, '10.0.2.5', 80), reply: t('10.0.2.5', 80, '10.0.1.6', 4000) })).toBeUndefined();
    expect(idx.classify({ protocol: 'tcp', original: t('10.0.1.6', 4000, '1.1.1.1', 80), reply: t('1.1.1.1', 80, '9.9.9.9', 4000) })).toBeUndefined();
    // Traffic to the EIP itself (the gateway answering), not translated.
    expect(
      idx.classify({ protocol: 'tcp', original: t('172.20.0.100', 4000, '172.20.0.10', 22), reply: t('172.20.0.10', 22, '172.20.0.100', 4000) }),
    ).toBeUndefined();
    expect(
      new FlowIndex().classify({ protocol: 'tcp', original: t('10.0.1.6', 4000, '172.20.0.100', 7001), reply: t('172.20.0.100', 7001, '172.20.0.10', 4000) }),
    ).toBeUndefined();
  });
});

describe('the flow log rate limit', () => {
  it('admits the burst, then the refill rate', () => {
    let now = 0;
    const b = new FlowLog({ sink: { write: () => true, close: async () => undefined }, ratePerS: 10, burst: 3, now: () => now });
    expect([b.take(), b.take(), b.take(), b.take()]).toEqual([true, true, true, false]);
    now += 100; // 0.1 s at 10/s: one token
    expect([b.take(), b.take()]).toEqual([true, false]);
    now += 10_000; // refills to the burst, not beyond
    expect([b.take(), b.take(), b.take(), b.take()]).toEqual([true, true, true, false]);
  });
});

describe('flow lines', () => {
  const c = { kind: 'dnat' as const, eip: '10.99.0.2' };

  it('start: time from the event, original and translated tuples, no counters', () => {
    const r = flowRecord(parseConntrackLine(NEW_TCP)!, c, 0);
    expect(r).toEqual({
      type: 'flow',
      msg: 'flow',
      event: 'start',
      time: new Date(1796044351519.127).toISOString(),
      id: 4219329350,
      kind: 'dnat',
      eip: '10.99.0.2',
      protocol: 'tcp',
      original: { src: '10.99.0.1', sport: 41946, dst: '10.99.0.2', dport: 8080 },
      translated: { src: '10.99.0.1', sport: 41946, dst: '10.99.0.2', dport: 9000 },
    });
  });

  it('end: packets and bytes per direction and the lifetime when accounting is on', () => {
    const r = flowRecord(parseConntrackLine(DESTROY_UDP)!, c, 0);
    expect(r.event).toBe('end');
    expect(r.packets).toEqual({ original: 1, reply: 0 });
    expect(r.bytes).toEqual({ original: 29, reply: 0 });
    expect(r.durationS).toBe(0);
  });

  it('drops above the rate and when the sink refuses, counting each', () => {
    const lines: string[] = [];
    let accept = true;
    const sink: FlowSink = { write: (l) => (accept ? (lines.push(l), true) : false), close: async () => undefined };
    const drops: string[] = [];
    const log = new FlowLog({ sink, ratePerS: 1, burst: 2, onDrop: (r) => drops.push(r) });
    const r = flowRecord(parseConntrackLine(NEW_TCP)!, c, 0);
    const put = () => log.take() && log.write(r);
    put();
    accept = false;
    put();
    put();
    expect(lines.map((l) => JSON.parse(l).type)).toEqual(['flow']);
    expect(drops).toEqual(['backlog', 'rate']);
  });
});
