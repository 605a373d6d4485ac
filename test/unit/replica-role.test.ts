/**
 * Only the active replica announces (issue 30): the role each configuration starts in, the
 * gate that an eip-add's effect, the start's announcement and a takeover go through, and a
 * resent eip-add that announces nothing on any replica.
 */
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { RestartHygiene } from '../../src/daemon/hygiene.js';
import type { ConntrackEntry } from '../../src/model/conntrackLine.js';
import { ReplicaRole } from '../../src/engine/replicaRole.js';
import * as Ops from '../../src/state/operations.js';
import { desiredStateSchema } from '../../src/state/state.js';
import { RecordingKernel } from '../helpers/recordingKernel.js';

const HA = { ha: { peers: ['10.99.0.2'], peerApis: [], port: 3780, syncTimeoutMs: 3000, conntrackd: 'conntrackd', initialRole: 'standby' as const } };

function recordingLog(): { log: pino.Logger; lines: Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = [];
  const log = pino({ level: 'debug' }, { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) });
  return { log, lines };
}

describe('ReplicaRole', () => {
  it('without a peer the gateway is always active (one gateway, as before)', () => {
    const r = new ReplicaRole({});
    expect(r.status()).toMatchObject({ mode: 'single', role: 'active' });
    expect(r.mayAnnounce('init', ['172.20.0.10'])).toBe(true);
  });

  it('with a peer a replica starts as standby, announces nothing and says so at debug level, until a takeover', () => {
    const { log, lines } = recordingLog();
    const r = new ReplicaRole(HA, log);
    expect(r.status()).toMatchObject({ mode: 'takeover', role: 'standby' });
    expect(r.mayAnnounce('init', ['172.20.0.10', '172.20.0.11'])).toBe(false);
    expect(lines).toEqual([expect.objectContaining({ level: 20, why: 'init', ips: ['172.20.0.10', '172.20.0.11'], msg: 'standby replica: not announced' })]);
    r.activate('test');
    expect(r.name).toBe('active');
    expect(r.mayAnnounce('init', ['172.20.0.10'])).toBe(true);
  });

  it('NATGW_HA_INITIAL_ROLE=active starts a replica active', () => {
    expect(new ReplicaRole({ ha: { ...HA.ha, initialRole: 'active' } }).name).toBe('active');
  });
});

const state = desiredStateSchema.parse({
  initialized: true,
  interfaces: { vpc: 'eth0', ext: 'net1' },
  eips: [{ address: '172.20.0.10', prefixLength: 24 }],
});

describe('the gate on every announcement', () => {
  const kernels: RecordingKernel[] = [];
  afterEach(() => {
    for (const k of kernels.splice(0)) k.cleanup();
  });

  it("restart hygiene: a standby's first apply and link-up announce nothing; an active one's do", async () => {
    for (const [role, expected] of [
      [new ReplicaRole(HA), []],
      [new ReplicaRole({}), ['net1 172.20.0.10']],
    ] as const) {
      const announced: string[] = [];
      const h = new RestartHygiene({
        config: { conntrackCleanup: false },
        conntrack: { deleteUntranslated: async () => [] as ConntrackEntry[] },
        link: { announce: (ifname: string, ip: string) => void announced.push(`${ifname} ${ip}`) },
        role,
        log: pino({ level: 'silent' }),
      });
      await h.afterFirstSync(state);
      h.announce(state, 'external interface up');
      expect(announced.slice(0, 1)).toEqual(expected);
      if (expected.length === 0) expect(announced).toEqual([]);
      h.stop();
    }
  });

  it("an eip-add's gratuitous ARP: sent by a single gateway, not by a standby, sent after a takeover", async () => {
    const arpings = async (env: Record<string, string>, activate: boolean): Promise<string[]> => {
      const k = new RecordingKernel();
      kernels.push(k);
      const engine = await k.initialised(env);
      if (activate) engine.role.activate('test');
      await engine.transact(({ state: s }) => Ops.addEip(s, { address: '172.20.0.30', prefixLength: 24 }, {}), { guarded: true });
      await engine.link.settle();
      return k.calls.filter((c) => c.startsWith('arping'));
    };
    const peer = { NATGW_HA_PEERS: '10.99.0.2' };
    expect(await arpings({}, false)).toEqual([expect.stringContaining('172.20.0.30')]);
    expect(await arpings(peer, false)).toEqual([]);
    expect(await arpings(peer, true)).toEqual([expect.stringContaining('172.20.0.30')]);
  });

  it('a resent eip-add announces nothing even on the active gateway', async () => {
    const k = new RecordingKernel();
    kernels.push(k);
    const engine = await k.initialised();
    const add = () => engine.transact(({ state: s }) => Ops.addEip(s, { address: '172.20.0.30', prefixLength: 24 }, {}), { guarded: true });
    await add();
    await engine.link.settle();
    const first = k.calls.filter((c) => c.startsWith('arping')).length;
    expect(first).toBe(1);
    await add();
    await engine.link.settle();
    expect(k.calls.filter((c) => c.startsWith('arping')).length).toBe(first);
  });
});
