/**
 * What natgw's QoS reads rely on in the real tc (one namespace of our own, deleted in afterAll):
 * one `tc -d -raw -batch -` lists a device (readback.ts deviceListingScript), and its listings are
 * told apart by their lines; a device that does not exist ends the batch at its first line.
 */
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deviceListingScript, parseDeviceListing } from '../../src/dataplane/qos/readback.js';

const NS = `ngql${randomBytes(3).toString('hex')}`;
const inNs = (argv: string[], input?: string) =>
  execa('ip', ['netns', 'exec', NS, ...argv], { reject: false, timeout: 30_000, ...(input !== undefined ? { input } : {}) });
const must = async (argv: string[]) => {
  const r = await inNs(argv);
  if (r.exitCode !== 0) throw new Error(`${argv.join(' ')}: ${String(r.stderr)}`);
};
const list = (dev: string, ingress = true) => inNs(['tc', '-d', '-raw', '-batch', '-'], deviceListingScript(dev, ingress));

beforeAll(async () => {
  await execa('ip', ['netns', 'add', NS]);
  await must(['ip', 'link', 'add', 'net1', 'type', 'veth', 'peer', 'name', 'net1p']);
  await must(['ip', 'link', 'add', 'ifb-net1', 'type', 'ifb']);
  for (const d of ['net1', 'net1p']) await must(['ip', 'link', 'set', d, 'up']);
  for (const line of [
    'qdisc replace dev net1 root handle 1: htb default 0x9999',
    'class add dev net1 parent 1: classid 1:0x37fa htb rate 10mbit ceil 10mbit burst 1048576 cburst 1048576',
    'filter add dev net1 parent 1: protocol ip prio 1 handle ::0x1 u32 match ip src 10.98.0.2/32 flowid 1:0x37fa',
    'qdisc add dev net1 ingress',
    'filter add dev net1 parent ffff: protocol all prio 65535 u32 match u32 0 0 action mirred egress redirect dev ifb-net1',
  ]) {
    await must(['tc', ...line.split(' ')]);
  }
});

afterAll(async () => {
  await execa('ip', ['netns', 'del', NS], { reject: false });
});

describe('tc device listings (real tool)', () => {
  it("names each root filter's parent and no ingress filter's, so one batch's listings split by their lines", async () => {
    const r = await list('net1');
    expect(r.exitCode).toBe(0);
    const text = String(r.stdout);
    const filterLines = text.split('\n').filter((l) => l.startsWith('filter '));
    expect(filterLines.filter((l) => l.startsWith('filter parent 1: '))).toHaveLength(3);
    expect(filterLines.filter((l) => !l.startsWith('filter parent '))).toHaveLength(3);
    const d = parseDeviceListing(text);
    expect(d.classes.map((c) => c.minor)).toEqual([0x37fa]);
    expect(d.filters.filter((f) => f.node !== undefined).map((f) => f.flowid?.minor)).toEqual([0x37fa]);
    expect(d.ingress.filter((f) => f.redirectTo === 'ifb-net1').map((f) => f.pref)).toEqual([65535]);
  });

  it('lists a device without natgw layout or ingress qdisc as empty, and succeeds', async () => {
    const peer = await list('net1p');
    expect(peer.exitCode).toBe(0);
    expect(parseDeviceListing(String(peer.stdout))).toMatchObject({ classes: [], filters: [], ingress: [] });
    // An IFB that was never up has no qdisc at all: it exists, and prints nothing.
    const ifb = await list('ifb-net1');
    expect(ifb.exitCode).toBe(0);
    expect(String(ifb.stdout)).toBe('');
  });

  it('ends the batch at its first line, printing nothing, where the device does not exist', async () => {
    for (const ingress of [true, false]) {
      const r = await list('nosuchdev0', ingress);
      expect(r.exitCode).not.toBe(0);
      expect(String(r.stdout)).toBe('');
    }
  });
});
