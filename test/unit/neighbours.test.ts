import { describe, expect, it } from 'vitest';
import { neighbourSchema, syntheticMac } from '../../src/model/neighbour.js';
import { deletedNeighbourOf, isNeighbourLine, parseNeighbours, planNeighbours, type NeighbourView } from '../../src/dataplane/neighboursPlan.js';
import { linkStateOf, mayLoseState } from '../../src/daemon/linkMonitor.js';
import { addNeighbour, delNeighbour } from '../../src/state/neighbourOperations.js';
import { emptyState } from '../../src/state/state.js';

// Captured from `ip -j neigh show nud permanent` and `ip -o monitor link address neigh` (iproute2 6.1).
const READ_BACK =
  '[{"dst":"10.9.0.50","dev":"d0","lladdr":"0a:58:0a:09:00:32","state":["PERMANENT"]},{"dst":"fd09::50","dev":"d0","lladdr":"0a:58:00:00:00:50","state":["PERMANENT"]}]';
const NEIGH_ADDED = '10.9.0.50 dev d0 lladdr 0a:58:0a:09:00:32 PERMANENT ';
const NEIGH_FAILED = '10.9.0.50 dev d0 FAILED ';
const NEIGH_DELETED = 'Deleted 10.9.0.50 dev d0 FAILED ';
const NEIGH_DELETED_V6 = 'Deleted fd09::50 dev d0 lladdr 0a:58:00:00:00:50 PERMANENT ';
const NEIGH_REACHABLE = '10.0.1.6 dev eth0 lladdr 6e:28:5e:d8:1b:db REACHABLE ';
const LINK_UP =
  '7: net1@if6: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP group default \\    link/ether 6e:28:5e:d8:1b:db brd ff:ff:ff:ff:ff:ff link-netns x';
const LINK_DOWN = '3: d0@NONE: <BROADCAST,MULTICAST> mtu 1500 qdisc noqueue state DOWN group default \\    link/ether 6e:28:5e:d8:1b:db brd ff:ff:ff:ff:ff:ff';

const n = (address: string, dev: string, mac?: string) => neighbourSchema.parse({ address, dev, ...(mac ? { mac } : {}) });

describe('static neighbours: model', () => {
  it('derives 0a:58 and the IPv4 address, or the last four bytes of an IPv6 address', () => {
    expect(syntheticMac('10.0.1.50')).toBe('0a:58:0a:00:01:32');
    expect(syntheticMac('fd00:10::a00:132')).toBe('0a:58:0a:00:01:32');
    expect(syntheticMac('fd09::50')).toBe('0a:58:00:00:00:50');
  });

  it('validates address, device and MAC', () => {
    expect(neighbourSchema.safeParse({ address: '10.0.1.5', dev: 'eth0', mac: 'AA:BB:CC:DD:EE:FF' }).data?.mac).toBe('aa:bb:cc:dd:ee:ff');
    expect(neighbourSchema.safeParse({ address: '10.0.1.5', dev: 'eth0', mac: 'aa:bb:cc:dd:ee' }).success).toBe(false);
    expect(neighbourSchema.safeParse({ address: '10.0.1.5', dev: 'eth0 x' }).success).toBe(false);
    expect(neighbourSchema.safeParse({ address: '10.0.1', dev: 'eth0' }).success).toBe(false);
  });

  it('add is create-or-update by (dev, address); delete is lenient', () => {
    let s = emptyState('eth0', 'net1');
    s = addNeighbour(s, n('10.0.1.5', 'eth0')).state;
    const same = addNeighbour(s, n('10.0.1.5', 'eth0'));
    expect(same.state).toBe(s);
    s = addNeighbour(s, n('10.0.1.5', 'eth0', '02:00:00:00:00:01')).state;
    expect(s.neighbours).toEqual([n('10.0.1.5', 'eth0', '02:00:00:00:00:01')]);
    s = addNeighbour(s, n('10.0.1.5', 'net1')).state;
    expect(s.neighbours).toHaveLength(2);
    expect(delNeighbour(s, { address: '10.0.1.9', dev: 'eth0' }).state).toBe(s);
    expect(delNeighbour(s, { address: '10.0.1.5', dev: 'eth0' }).state.neighbours).toEqual([n('10.0.1.5', 'net1')]);
  });
});

describe('static neighbours: plan and render', () => {
  const view = (entries: NeighbourView['entries'], devices = ['d0', 'eth0']): NeighbourView => ({ entries, devices: new Set(devices) });

  it('parses the read-back', () => {
    expect(parseNeighbours(JSON.parse(READ_BACK))).toEqual([
      { address: '10.9.0.50', dev: 'd0', mac: '0a:58:0a:09:00:32' },
      { address: 'fd09::50', dev: 'd0', mac: '0a:58:00:00:00:50' },
    ]);
  });

  it('adds what is missing or different, leaves what matches, and skips missing devices', () => {
    const have = view(parseNeighbours(JSON.parse(READ_BACK)));
    const want = [n('10.9.0.50', 'd0'), n('fd09::50', 'd0', '02:00:00:00:00:02'), n('10.0.1.8', 'eth0'), n('10.0.1.9', 'gone0')];
    expect(planNeighbours(have, want, [])).toEqual([
      'neigh replace fd09::50 lladdr 02:00:00:00:00:02 nud permanent dev d0',
      'neigh replace 10.0.1.8 lladdr 0a:58:0a:00:01:08 nud permanent dev eth0',
    ]);
    const after = view([
      { address: '10.9.0.50', dev: 'd0', mac: '0a:58:0a:09:00:32' },
      { address: 'fd09::50', dev: 'd0', mac: '02:00:00:00:00:02' },
      { address: '10.0.1.8', dev: 'eth0', mac: '0a:58:0a:00:01:08' },
    ]);
    expect(planNeighbours(after, want, want)).toEqual([]);
  });

  it('removes only entries natgw programmed before', () => {
    const have = view(parseNeighbours(JSON.parse(READ_BACK)));
    // fd09::50 is held by someone else: natgw never listed it, so it stays.
    expect(planNeighbours(have, [], [n('10.9.0.50', 'd0'), n('10.0.1.77', 'eth0')])).toEqual(['neigh del 10.9.0.50 dev d0']);
  });
});

describe('static neighbours: monitor lines', () => {
  it('tells neighbour lines and their deletions apart', () => {
    expect(isNeighbourLine(NEIGH_ADDED)).toBe(true);
    expect(isNeighbourLine(NEIGH_DELETED_V6)).toBe(true);
    expect(isNeighbourLine(LINK_DOWN)).toBe(false);
    expect(deletedNeighbourOf(NEIGH_DELETED)).toEqual({ address: '10.9.0.50', dev: 'd0' });
    expect(deletedNeighbourOf(NEIGH_DELETED_V6)).toEqual({ address: 'fd09::50', dev: 'd0' });
    expect(deletedNeighbourOf(NEIGH_FAILED)).toBeUndefined();
    expect(deletedNeighbourOf('Deleted 3: d0    inet 10.9.0.1/24 scope global d0')).toBeUndefined();
  });

  it('ARP churn never reads as lost state on its own', () => {
    for (const l of [NEIGH_ADDED, NEIGH_FAILED, NEIGH_DELETED, NEIGH_REACHABLE]) expect(mayLoseState(l)).toBe(false);
    expect(mayLoseState(LINK_DOWN)).toBe(true);
  });

  it('reads a link line: index, name, up', () => {
    expect(linkStateOf(LINK_UP)).toEqual({ index: 7, name: 'net1', up: true, deleted: false });
    expect(linkStateOf(LINK_DOWN)).toEqual({ index: 3, name: 'd0', up: false, deleted: false });
    expect(linkStateOf(`Deleted ${LINK_UP}`)).toMatchObject({ name: 'net1', deleted: true });
    expect(linkStateOf(NEIGH_ADDED)).toBeUndefined();
  });
});
