/**
 * A link "came up" only on a transition from not up (or absent) to up, per link (issue 30):
 * a flag change of a link that is up (promiscuous mode, as tcpdump sets it) re-announces no
 * EIP; a link brought up, or recreated (a new index) up, does.
 */
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { LinkMonitor, LinkUpTracker } from '../../src/daemon/linkMonitor.js';
import { waitFor } from '../helpers/poll.js';

const line = (index: number, name: string, flags: string) =>
  `${index}: ${name}@if6: <${flags}> mtu 1500 qdisc noqueue state UP group default \\    link/ether 6e:28:5e:d8:1b:db brd ff:ff:ff:ff:ff:ff`;
const UP = 'BROADCAST,MULTICAST,UP,LOWER_UP';
const PROMISC = 'BROADCAST,MULTICAST,PROMISC,UP,LOWER_UP';
const DOWN = 'BROADCAST,MULTICAST';

describe('LinkUpTracker', () => {
  it('a flag change of a link that is up is not "came up"', () => {
    const t = new LinkUpTracker();
    t.seed(`${line(7, 'net1', UP)}\n${line(1, 'lo', 'LOOPBACK,UP,LOWER_UP')}\n`);
    expect(t.observe(line(7, 'net1', PROMISC))).toBeUndefined();
    expect(t.observe(line(7, 'net1', UP))).toBeUndefined();
  });

  it('down then up is', () => {
    const t = new LinkUpTracker();
    t.seed(line(7, 'net1', UP));
    expect(t.observe(line(7, 'net1', DOWN))).toBeUndefined();
    expect(t.observe(line(7, 'net1', UP))).toBe('net1');
    expect(t.observe(line(7, 'net1', PROMISC))).toBeUndefined();
  });

  it('a link recreated (deleted, or a new index) and up is', () => {
    const t = new LinkUpTracker();
    t.seed(line(7, 'net1', UP));
    expect(t.observe(`Deleted ${line(7, 'net1', UP)}`)).toBeUndefined();
    expect(t.observe(line(9, 'net1', UP))).toBe('net1');
    // A new index without a deletion seen (missed events): new link.
    expect(t.observe(line(11, 'net1', UP))).toBe('net1');
  });

  it('a link it never heard of, seen up, came up (created after the seed)', () => {
    const t = new LinkUpTracker();
    t.seed('');
    expect(t.observe(line(12, 'net2', UP))).toBe('net2');
    expect(t.observe(line(12, 'net2', UP))).toBeUndefined();
  });
});

describe('LinkMonitor: onLinkUp', () => {
  it('reports the transitions only, against the links read at its start', async () => {
    // The last line, a link created up, marks the end of what the monitor printed.
    const events = [line(7, 'net1', PROMISC), line(7, 'net1', UP), line(7, 'net1', DOWN), line(7, 'net1', UP), line(13, 'end0', UP)];
    const ups: string[] = [];
    const m = new LinkMonitor({
      log: pino({ level: 'silent' }),
      onChange: () => undefined,
      ownsNeighbour: () => false,
      onLinkUp: (n) => ups.push(n),
      // Prints once the links are surely read (they answer at once).
      argv: ['sh', '-c', `sleep 0.3; printf '%s\\n' "$@"; sleep 30`, 'mon', ...events],
      links: async () => line(7, 'net1', UP),
    });
    try {
      m.start();
      await waitFor(async () => ups.includes('end0'), { what: 'the monitor lines', timeoutMs: 5000 });
      expect(ups).toEqual(['net1', 'end0']);
    } finally {
      m.stop();
    }
  });
});
