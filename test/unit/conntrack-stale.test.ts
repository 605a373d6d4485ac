import { describe, expect, it } from 'vitest';
import { deleteEntryArgs, isTranslated, staleEntries, targetsOf } from '../../src/dataplane/conntrackStale.js';
import { parseConntrackLines } from '../../src/model/conntrackLine.js';
import { emptyState } from '../../src/state/state.js';
import { desiredStateSchema } from '../../src/state/state.js';

// `conntrack -L -o extended` (conntrack-tools 1.4.7), captured in a namespace with a DNAT of
// udp 9000 to 10.0.1.1:9001 and nothing for udp 8080 or ICMP; the IPv6 and TCP lines follow the same format.
const CAPTURED = `ipv4     2 udp      17 29 src=172.20.0.100 dst=172.20.0.10 sport=40001 dport=9000 [UNREPLIED] src=10.0.1.1 dst=172.20.0.100 sport=9001 dport=40001 mark=0 use=1
ipv4     2 udp      17 29 src=172.20.0.100 dst=172.20.0.10 sport=40000 dport=8080 [UNREPLIED] src=172.20.0.10 dst=172.20.0.100 sport=8080 dport=40000 mark=0 use=1
ipv4     2 icmp     1 29 src=172.20.0.100 dst=172.20.0.10 type=8 code=0 id=11980 src=172.20.0.10 dst=172.20.0.100 type=0 code=0 id=11980 mark=0 use=1
ipv4     2 tcp      6 431999 ESTABLISHED src=10.0.1.6 dst=8.8.8.8 sport=50000 dport=443 src=8.8.8.8 dst=10.0.1.6 sport=443 dport=50000 [ASSURED] mark=0 use=1
ipv4     2 tcp      6 431999 ESTABLISHED src=10.0.1.6 dst=10.0.1.7 sport=50001 dport=22 src=10.0.1.7 dst=10.0.1.6 sport=22 dport=50001 [ASSURED] mark=0 use=1
ipv4     2 udp      17 29 src=172.20.0.100 dst=172.20.0.99 sport=40009 dport=53 src=172.20.0.99 dst=172.20.0.100 sport=53 dport=40009 mark=0 use=1
ipv6     10 udp      17 29 src=fd00:20::100 dst=fd00:20::10 sport=40003 dport=8080 [UNREPLIED] src=fd00:20::10 dst=fd00:20::100 sport=8080 dport=40003 mark=0 use=1
conntrack v1.4.7 (conntrack-tools): 7 flow entries have been shown.
`;

const state = desiredStateSchema.parse({
  interfaces: { vpc: 'eth0', ext: 'net1' },
  eips: [
    { address: '172.20.0.10', prefixLength: 24 },
    { address: 'fd00:20::10', prefixLength: 64 },
  ],
  snats: [{ eip: '172.20.0.10', cidr: '10.0.1.0/24' }],
  dnats: [{ eip: '172.20.0.10', port: 9000, protocol: 'tcp', internalIp: '10.0.1.1', internalPort: 9001 }],
});

describe('restart hygiene: untranslated conntrack entries', () => {
  const entries = parseConntrackLines(CAPTURED);

  it('parses both tuples of every entry', () => {
    expect(entries).toHaveLength(7);
    expect(entries[0]).toEqual({
      family: 4,
      protocol: 'udp',
      protocolNumber: 17,
      original: { src: '172.20.0.100', dst: '172.20.0.10', sport: 40001, dport: 9000 },
      reply: { src: '10.0.1.1', dst: '172.20.0.100', sport: 9001, dport: 40001 },
    });
    expect(entries[2]?.original).toEqual({ src: '172.20.0.100', dst: '172.20.0.10' });
    expect(entries[2]?.icmp).toEqual({ type: 8, code: 0, id: 11980 });
    expect(entries[2]?.id).toBeUndefined();
    expect(entries[6]?.family).toBe(6);
    expect(parseConntrackLines(CAPTURED.replace(/^ipv[46]\s+\d+\s+/gm, ''))).toEqual(entries);
  });

  it('tells a translated entry by its reply tuple', () => {
    expect(entries.map(isTranslated)).toEqual([true, false, false, false, false, false, false]);
  });

  it('picks untranslated entries to an EIP or from a SNAT CIDR to outside it, and nothing else', () => {
    const stale = staleEntries(entries, targetsOf(state));
    expect(stale.map((e) => `${e.protocol} ${e.original.src} ${e.original.dst}`)).toEqual([
      'udp 172.20.0.100 172.20.0.10',
      'icmp 172.20.0.100 172.20.0.10',
      'tcp 10.0.1.6 8.8.8.8',
      'udp fd00:20::100 fd00:20::10',
    ]);
    expect(staleEntries(entries, targetsOf(emptyState('eth0', 'net1')))).toEqual([]);
  });

  it('deletes by the exact tuples', () => {
    const [udp, icmp] = staleEntries(entries, targetsOf(state));
    expect(deleteEntryArgs(udp!)).toEqual([
      '-D',
      '-f',
      'ipv4',
      '-p',
      'udp',
      '--orig-src',
      '172.20.0.100',
      '--orig-dst',
      '172.20.0.10',
      '--reply-src',
      '172.20.0.10',
      '--reply-dst',
      '172.20.0.100',
      '--orig-port-src',
      '40000',
      '--orig-port-dst',
      '8080',
    ]);
    expect(deleteEntryArgs(icmp!).slice(-6)).toEqual(['--icmp-type', '8', '--icmp-code', '0', '--icmp-id', '11980']);
  });
});
