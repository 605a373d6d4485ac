/**
 * The per-command path keeps each collection's identity index across deletes as across adds,
 * and runs tools on child_process directly; these pin the semantics both must keep.
 */
import { describe, expect, it } from 'vitest';
import { ConflictError } from '../../src/model/errors.js';
import type { Dnat } from '../../src/model/rules.js';
import { emptyState } from '../../src/state/state.js';
import { addDnat, addFip, addSnat, delDnat, delFip, delSnat, findByKey } from '../../src/state/operations.js';
import { dnatKey, fipKey, snatKey } from '../../src/model/rules.js';
import { SystemExecutor } from '../../src/system/exec.js';

const base = () => ({ ...emptyState('eth0', 'net1'), initialized: true });
const dnat = (port: number, internalIp = '10.0.1.6'): Dnat => ({ eip: '172.20.0.10', port, protocol: 'tcp', internalIp, internalPort: 80 });

describe('identity index across deletes', () => {
  it('a delete hands the index on: later adds see exactly the objects that are left', () => {
    let s = base();
    for (let p = 1; p <= 50; p++) s = addDnat(s, dnat(p)).state;
    s = delDnat(s, dnat(7)).state;
    expect(s.dnats).toHaveLength(49);
    expect(findByKey(s.dnats, dnatKey, dnatKey(dnat(7)))).toBeUndefined();
    // The deleted identity is free again, with another target.
    s = addDnat(s, dnat(7, '10.0.1.9')).state;
    expect(findByKey(s.dnats, dnatKey, dnatKey(dnat(7)))?.internalIp).toBe('10.0.1.9');
    // One that was kept still conflicts.
    expect(() => addDnat(s, dnat(8, '10.0.1.9'))).toThrow(ConflictError);
    expect(s.dnats.map((d) => d.port)).toEqual([...Array.from({ length: 50 }, (_, i) => i + 1).filter((p) => p !== 7), 7]);
  });

  it('a delete of an absent identity keeps the collection itself (nothing to sync, nothing to journal)', () => {
    const s = addDnat(base(), dnat(1)).state;
    const r = delDnat(s, dnat(2));
    expect(r.state.dnats).toBe(s.dnats);
    expect(r.effects).toEqual([{ kind: 'conntrack-flush', dst: '172.20.0.10', protocol: 'tcp', port: 2 }]);
  });

  it('the state an operation started from still answers by its own objects', () => {
    const s = addFip(addFip(base(), { eip: '172.20.0.11', internalIp: '10.0.1.7' }).state, { eip: '172.20.0.12', internalIp: '10.0.1.8' }).state;
    const after = delFip(s, '172.20.0.11').state;
    expect(findByKey(after.fips, fipKey, '172.20.0.11')).toBeUndefined();
    expect(findByKey(s.fips, fipKey, '172.20.0.11')?.internalIp).toBe('10.0.1.7');
  });

  it('SNATs: an add after a delete keeps prefix order and refuses nothing it should not', () => {
    let s = base();
    s = addSnat(s, { eip: '172.20.0.10', cidr: '10.0.0.0/16', randomFully: false }).state;
    s = addSnat(s, { eip: '172.20.0.10', cidr: '10.0.1.0/24', randomFully: false }).state;
    s = delSnat(s, { eip: '172.20.0.10', cidr: '10.0.1.0/24' }).state;
    expect(findByKey(s.snats, snatKey, '172.20.0.10|10.0.1.0/24')).toBeUndefined();
    s = addSnat(s, { eip: '172.20.0.10', cidr: '10.0.1.0/24', randomFully: true }).state;
    expect(s.snats.map((x) => x.cidr)).toEqual(['10.0.1.0/24', '10.0.0.0/16']);
    // Re-adding an existing identity changes nothing.
    expect(addSnat(s, { eip: '172.20.0.10', cidr: '10.0.0.0/16', randomFully: true }).state).toBe(s);
  });
});

describe('SystemExecutor', () => {
  const exec = new SystemExecutor(undefined, { deadlineMs: 10_000 });

  it('feeds the script on stdin and reads both outputs untouched', async () => {
    const r = await exec.run({ file: 'bash', args: ['-c', 'cat; printf "e\\n\\n" >&2'], input: 'a\nb\n\n' });
    expect(r).toMatchObject({ exitCode: 0, stdout: 'a\nb\n\n', stderr: 'e\n\n', timedOut: false, failedToStart: false });
  });

  it('without a script stdin is at its end at once', async () => {
    const r = await exec.run({ file: 'cat', args: [] });
    expect(r).toMatchObject({ exitCode: 0, stdout: '' });
  });

  it('a tool killed by a signal failed (127) but did start', async () => {
    const r = await exec.run({ file: 'bash', args: ['-c', 'kill -9 $$'] });
    expect(r).toMatchObject({ exitCode: 127, timedOut: false, failedToStart: false });
  });

  it('runs in the C locale with the environment natgw has', async () => {
    const r = await exec.run({ file: 'bash', args: ['-c', 'echo "$LC_ALL:${PATH:+path}"'] });
    expect(r.stdout).toBe('C:path\n');
  });
});
