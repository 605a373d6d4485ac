import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { StateStore } from '../../src/state/store.js';
import { emptyState } from '../../src/state/state.js';
import { testTempDir } from '../helpers/tempDir.js';

const dir = () => testTempDir('natgw-store-');

describe('StateStore', () => {
  it('round-trips a state through its sealed file', async () => {
    const store = new StateStore(dir());
    const s = {
      ...emptyState('eth0', 'net1'),
      initialized: true,
      dnats: [{ eip: '1.2.3.4', port: 80, protocol: 'tcp' as const, internalIp: '10.0.1.6', internalPort: 80 }],
    };
    await store.save(s);
    expect(await store.load()).toEqual(s);
    expect(readFileSync(store.stateFile, 'utf8')).toMatch(/^\{"sha256":"[0-9a-f]{64}","state":\{/);
  });

  it('reads what another writer or a hand edit left', async () => {
    const d = dir();
    const store = new StateStore(d);
    const fresh = new StateStore(d);
    const s = { ...emptyState('eth0', 'net1'), initialized: true };
    await store.save(s);
    expect(await fresh.load()).toEqual(s);
    // Another writer's snapshot, and then a hand edit of the same length: read anew each time.
    const other = { ...s, dnats: [{ eip: '1.2.3.4', port: 80, protocol: 'tcp' as const, internalIp: '10.0.1.6', internalPort: 80 }] };
    await store.save(other);
    expect(await fresh.load()).toEqual(other);
    const text = readFileSync(store.stateFile, 'utf8');
    writeFileSync(store.stateFile, text.replace('"port":80', '"port":81'));
    expect((await fresh.load())?.dnats[0]?.port).toBe(81);
  });

  it('validates a hand-edited file in full (the seal no longer matches), canonicalising it', async () => {
    const store = new StateStore(dir());
    await store.save(emptyState('eth0', 'net1'));
    const doc = JSON.parse(readFileSync(store.stateFile, 'utf8')) as { state: { snats: unknown[] } };
    doc.state.snats = [{ eip: '1.2.3.4', cidr: '10.0.1.7/24' }];
    writeFileSync(store.stateFile, JSON.stringify(doc));
    expect((await store.load())?.snats).toEqual([{ eip: '1.2.3.4', cidr: '10.0.1.0/24', randomFully: false }]);
  });

  it('sets an unreadable file aside instead of failing every command', async () => {
    const d = dir();
    const told: string[] = [];
    const store = new StateStore(d, (file) => told.push(file));
    writeFileSync(store.stateFile, '{"sha256":"x","state":{ truncated');
    // A reader outside the lock (GET /v1/state) reads nothing from it but moves nothing.
    expect(await store.load()).toBeUndefined();
    expect(told).toHaveLength(0);
    expect(readdirSync(d).some((f) => f.startsWith('state.json.unreadable-'))).toBe(false);
    expect(await store.withLock(() => store.load())).toBeUndefined();
    expect(told).toHaveLength(1);
    expect(readdirSync(d).some((f) => f.startsWith('state.json.unreadable-'))).toBe(true);
    writeFileSync(store.stateFile, JSON.stringify({ interfaces: { vpc: 'eth0', ext: 'bad name!' } }));
    expect(await store.withLock(() => store.load())).toBeUndefined();
    expect(told).toHaveLength(2);
  });

  it('a full disk is a clear error naming the file and the key', async () => {
    const store = new StateStore(dir());
    const { durableError } = await import('../../src/state/store.js');
    const e = durableError(store.stateFile, Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' }));
    expect(e.message).toBe(`Error: cannot write ${store.stateFile} (NATGW_STATE_DIR): no space left on device; the change was not applied`);
  });

  it('serialises writers through the lock', async () => {
    const store = new StateStore(dir());
    const order: string[] = [];
    const job = (name: string) =>
      store.withLock(async () => {
        order.push(`${name}:in`);
        await new Promise((r) => setImmediate(r));
        order.push(`${name}:out`);
      });
    await Promise.all([job('a'), job('b')]);
    expect(order.join(' ')).toMatch(/^(a:in a:out b:in b:out|b:in b:out a:in a:out)$/);
  });
});
