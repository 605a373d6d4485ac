import { describe, expect, it } from 'vitest';
import { mayLoseState } from '../../src/daemon/linkMonitor.js';

// Lines as `ip -o monitor link address` (iproute2 6.1) printed them on this kernel.
const ADDED_V4 = '3: d0    inet 172.20.0.10/24 scope global d0\\       valid_lft forever preferred_lft forever';
const ADDED_V6 = '3: d0    inet6 fd00::10/64 scope global nodad \\       valid_lft forever preferred_lft forever';
const DELETED_V4 = 'Deleted 3: d0    inet 172.20.0.10/24 scope global d0\\       valid_lft forever preferred_lft forever';
const LINK_DOWN =
  '3: d0@d1: <BROADCAST,MULTICAST,M-DOWN> mtu 1500 qdisc noqueue state DOWN group default \\    link/ether 82:cc:db:11:54:47 brd ff:ff:ff:ff:ff:ff';
const LINK_GONE =
  'Deleted 3: d0@NONE: <BROADCAST,MULTICAST> mtu 1500 qdisc noop state DOWN group default \\    link/ether 82:cc:db:11:54:47 brd ff:ff:ff:ff:ff:ff';

describe('link events that may lose what natgw applied', () => {
  it('a new address is not one (natgw adds EIPs itself)', () => {
    expect(mayLoseState(ADDED_V4)).toBe(false);
    expect(mayLoseState(ADDED_V6)).toBe(false);
  });

  it('a deleted address, a link change and a deleted link are', () => {
    expect(mayLoseState(DELETED_V4)).toBe(true);
    expect(mayLoseState(LINK_DOWN)).toBe(true);
    expect(mayLoseState(LINK_GONE)).toBe(true);
  });

  it("the QoS probe's own throwaway device is not one", () => {
    const probe = (prefix: string) =>
      `${prefix}4: ngprobeb0ba04d0: <BROADCAST,NOARP> mtu 1500 qdisc noop state DOWN group default \\    link/ether de:d9:7f:c8:92:4c brd ff:ff:ff:ff:ff:ff`;
    expect(mayLoseState(probe(''))).toBe(false);
    expect(mayLoseState(probe('Deleted '))).toBe(false);
    // A device that only starts like it is someone else's.
    expect(mayLoseState('Deleted 4: ngprobe-x: <BROADCAST,NOARP> mtu 1500 qdisc noop state DOWN')).toBe(true);
  });
});
