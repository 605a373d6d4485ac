/**
 * The state dir on a full tiny tmpfs (issue 12): a change that cannot be made durable is not
 * acknowledged — a clear error naming the file and NATGW_STATE_DIR — and the kernel is put
 * back as it was, so kernel and state still agree; with room again the same change goes through.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync, openSync, writeSync, closeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, ownedNetfilter, ownedLinks, type BackendCase } from '../helpers/backends.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

/** Fill the file system holding `file` until it refuses another byte. */
function fill(file: string): void {
  const fd = openSync(file, 'w');
  const chunk = Buffer.alloc(4096);
  try {
    for (;;) writeSync(fd, chunk);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOSPC') throw e;
  } finally {
    closeSync(fd);
  }
}

describe.each(BACKENDS)('state dir full ($name)', (b: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;
  let mnt: string;
  let mounted = false;

  beforeAll(async () => {
    mnt = mkdtempSync(join(tmpdir(), 'natgw-tinyfs-'));
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=512k', 'tmpfs', mnt]);
    mounted = true;
    topo = await createTopology();
    Object.assign(topo.env, b.env, { GATEWAY_V4: ADDR.extGateway, NATGW_RESYNC_PERIOD: '1h', NATGW_STATE_DIR: join(mnt, 'state') });
    sock = socketOf(topo);
    daemon = await startDaemon(topo);
    await waitReady(topo, daemon);
    for (const [command, rule] of [
      ['init', ''],
      ['eip-add', '172.20.0.10/24'],
      ['dnat-add', '172.20.0.10,8080,tcp,10.0.1.6,80'],
    ] as const) {
      const r = ok(await api(sock, 'POST', '/v1/legacy', { command, rules: rule ? [rule] : [] }), command);
      expect(r.body.status, r.text).toBe(0);
    }
  }, 120_000);

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
    if (mounted) execFileSync('umount', [mnt]);
    rmSync(mnt, { recursive: true, force: true });
  });

  it('a clear error, nothing acknowledged, the kernel as before; with room the change goes through', async () => {
    const doc = (await api(sock, 'GET', '/v1/state')).body;
    const before = { netfilter: await ownedNetfilter(topo, b), links: await ownedLinks(topo) };
    // A change big enough to be written as a new snapshot.
    const dnats = Array.from({ length: 200 }, (_, i) => ({ eip: '172.20.0.10', port: 10_000 + i, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 }));
    const next = { desired: { ...doc.desired, dnats: [...doc.desired.dnats, ...dnats], routes: [{ cidr: '10.0.2.0/24', nexthop: ADDR.rtr }] } };
    const filler = join(mnt, 'filler');
    fill(filler);
    const refused = await api(sock, 'PUT', '/v1/state', next);
    expect(refused.status).toBe(500);
    expect(refused.body.message).toMatch(/^Error: cannot write .*\(NATGW_STATE_DIR\): no space left on device; the change was not applied$/);
    // An eip-add through the script's door: status 1, the same message on stderr.
    const legacy = ok(await api(sock, 'POST', '/v1/legacy', { command: 'eip-add', rules: ['172.20.0.12/24'] }), 'eip-add');
    expect(legacy.body.status).toBe(1);
    expect(legacy.body.stderr).toMatch(/no space left on device/);
    expect((await api(sock, 'GET', '/v1/state')).body.digest).toBe(doc.digest);
    expect({ netfilter: await ownedNetfilter(topo, b), links: await ownedLinks(topo) }).toEqual(before);

    rmSync(filler);
    writeFileSync(join(mnt, 'marker'), '');
    ok(await api(sock, 'PUT', '/v1/state', next), 'the change with room again');
    expect(await ownedNetfilter(topo, b)).toContain('10199');
  }, 60_000);
});
