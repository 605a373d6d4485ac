import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { Agent } from '../../src/api/agent.js';
import { RestartHygiene } from '../../src/daemon/hygiene.js';
import type { ConntrackEntry } from '../../src/model/conntrackLine.js';
import { desiredStateSchema, type DesiredState } from '../../src/state/state.js';
import { FakeEngine } from '../api/fakeEngine.js';
import { waitFor } from '../helpers/poll.js';

const log = pino({ level: 'silent' });
const state = desiredStateSchema.parse({
  interfaces: { vpc: 'eth0', ext: 'net1' },
  eips: [
    { address: '172.20.0.10', prefixLength: 24 },
    { address: '172.20.0.11', prefixLength: 24 },
    { address: 'fd00::10', prefixLength: 64 },
  ],
});

describe('restart hygiene', () => {
  it('readiness waits for the cleanup after the first resync; later resyncs do not run it again', async () => {
    const engine = await FakeEngine.create();
    let release!: () => void;
    const calls: string[] = [];
    const agent = new Agent({
      engine,
      log,
      hygiene: {
        afterFirstSync: (s: DesiredState) => {
          calls.push(`first ${s.interfaces.ext}`);
          return new Promise<void>((r) => (release = r));
        },
        announce: (_s, why) => calls.push(`announce ${why}`),
      },
    });
    agent.setInterfaces([]);
    const first = agent.resync('start');
    await waitFor(async () => calls.length === 1, { what: 'the cleanup to start' });
    expect(agent.readiness().ready).toBe(false);
    expect(agent.readiness().reasons.join()).toContain('restart hygiene');
    release();
    await first;
    expect(agent.readiness().ready).toBe(true);
    await agent.resync('periodic');
    expect(calls).toEqual(['first net1']);
    agent.requestAnnounce();
    await agent.resync('link event');
    await agent.resync('periodic');
    expect(calls).toEqual(['first net1', 'announce external interface up']);
  });

  it('without hygiene (API tests, in-process runs) readiness does not wait for it', async () => {
    const agent = new Agent({ engine: await FakeEngine.create(), log });
    agent.setInterfaces([]);
    await agent.resync('start');
    expect(agent.readiness().ready).toBe(true);
  });

  it('cleans up unless switched off, and announces every IPv4 EIP at most once per second', async () => {
    const announced: string[] = [];
    let cleaned = 0;
    const mk = (conntrackCleanup: boolean) =>
      new RestartHygiene({
        config: { conntrackCleanup },
        conntrack: { deleteUntranslated: async () => (cleaned++, [] as ConntrackEntry[]) },
        link: { announce: (ifname: string, ip: string) => void announced.push(`${ifname} ${ip}`) },
        log,
      });
    const h = mk(true);
    await h.afterFirstSync(state);
    expect(cleaned).toBe(1);
    expect(announced).toEqual(['net1 172.20.0.10', 'net1 172.20.0.11', 'net1 fd00::10']);
    // A burst of link events: one more round at the end of the gap, not one per event.
    h.announce(state, 'up');
    h.announce(state, 'up');
    expect(announced).toHaveLength(3);
    await waitFor(async () => announced.length === 6, { what: 'the trailing announcement', timeoutMs: 3000 });
    h.stop();
    const off = mk(false);
    await off.afterFirstSync(state);
    expect(cleaned).toBe(1);
    off.stop();
  });

  it('lists nothing for a state that translates nothing', async () => {
    let listed = 0;
    const h = new RestartHygiene({
      config: { conntrackCleanup: true },
      conntrack: { deleteUntranslated: async () => (listed++, [] as ConntrackEntry[]) },
      link: { announce: () => undefined },
      log,
    });
    await h.afterFirstSync(desiredStateSchema.parse({ interfaces: { vpc: 'eth0', ext: 'net1' } }));
    expect(listed).toBe(0);
    await h.afterFirstSync(state);
    expect(listed).toBe(1);
    h.stop();
  });
});
