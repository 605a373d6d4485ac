/**
 * The per-command path keeps each collection's identity index across deletes as across adds,
 * and runs tools on child_process directly; these pin the semantics both must keep.
 */
import { describe, expect, it } from 'vitest';
import { ConflictError } from '../../src/model/errors.js';
import type { Dnat } from '../../src/model/rules.js';
import { emptyState } from '../../src/state/state.js';
import { addDnat, addFip, addSnat, delDnat, delFip, delSnat } from '../../src/state/operations.js';
import { dnatKey, fipKey, snatKey } from '../../src/model/rules.js';
import { SystemExecutor } from '../../src/system/exec.js';
import { planChain } from '../helpers/iptablesChain.js';
import { prng } from '../helpers/prng.js';

const base = () => ({ ...emptyState('eth0', 'net1'), initialized: true });
const dnat = (port: number, internalIp = '10.0.1.6'): Dnat => ({ eip: '172.20.0.10', port, protocol: 'tcp', internalIp, internalPort: 80 });

describe('identity index across deletes', () => {
  it('a delete hands the index on: later adds see exactly the objects that are left', () => {
    let s = base();
    for (let p = 1; p <= 50; p++) s = addDnat(s, dnat(p)).state;
    s = delDnat(s, dnat(7)).state;
    expect(s.dnats).toHaveLength(49);
    expect(s.dnats.find((x) => dnatKey(x) === dnatKey(dnat(7)))).toBeUndefined();
    // The deleted identity is free again, with another target.
    s = addDnat(s, dnat(7, '10.0.1.9')).state;
    expect(s.dnats.find((x) => dnatKey(x) === dnatKey(dnat(7)))?.internalIp).toBe('10.0.1.9');
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
    expect(after.fips.find((x) => fipKey(x) === '172.20.0.11')).toBeUndefined();
    expect(s.fips.find((x) => fipKey(x) === '172.20.0.11')?.internalIp).toBe('10.0.1.7');
  });

  it('SNATs: an add after a delete keeps prefix order and refuses nothing it should not', () => {
    let s = base();
    s = addSnat(s, { eip: '172.20.0.10', cidr: '10.0.0.0/16', randomFully: false }).state;
    s = addSnat(s, { eip: '172.20.0.10', cidr: '10.0.1.0/24', randomFully: false }).state;
    s = delSnat(s, { eip: '172.20.0.10', cidr: '10.0.1.0/24' }).state;
    expect(s.snats.find((x) => snatKey(x) === '172.20.0.10|10.0.1.0/24')).toBeUndefined();
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

/** iptables' own semantics: `-D C spec` removes the first copy, `-D C n` / `-I C n` are 1-based. */
function applyChain(have: readonly string[], lines: readonly string[]): string[] {
  const c = [...have];
  for (const l of lines) {
    const m = /^-(D|I|A|F) C(?: (.*))?$/.exec(l);
    if (!m) throw new Error(`unexpected line ${l}`);
    const [, op, rest = ''] = m;
    const num = /^(\d+)(?: (.*))?$/.exec(rest);
    if (op === 'F') c.length = 0;
    else if (op === 'A') c.push(rest);
    else if (op === 'I') c.splice(Number(num?.[1]) - 1, 0, num?.[2] ?? '');
    else if (num && num[2] === undefined) c.splice(Number(num[1]) - 1, 1);
    else {
      const at = c.indexOf(rest);
      if (at === -1) throw new Error(`-D of an absent rule: ${rest}`);
      c.splice(at, 1);
    }
  }
  return c;
}

describe('iptables chain plan: a command-sized change of a long chain', () => {
  const rnd = prng(0x5eed);
  const rule = (i: number) => `-d 172.20.0.10/32 -p tcp -m tcp --dport ${i} -j DNAT --to-destination 10.0.1.6:80`;

  it('a few rules added, removed or replaced anywhere: exact result, by spec where a rule occurs once, no rewrite', () => {
    for (let n = 0; n < 300; n++) {
      const have = Array.from({ length: 200 }, (_, i) => rule(i));
      // Now and then a duplicated copy in the kernel: it must go by position, never by spec.
      if (rnd() < 0.3) have.splice(Math.floor(rnd() * 200), 0, have[Math.floor(rnd() * 200)] as string);
      const want = [...have];
      const at = Math.floor(rnd() * want.length);
      const del = Math.floor(rnd() * 4);
      const add = Array.from({ length: Math.floor(rnd() * 4) }, (_, k) => rule(1000 + n * 10 + k));
      want.splice(at, del, ...add);
      const plan = planChain('C', have, want, { deleteBySpec: true });
      expect(
        plan.lines.some((l) => l.startsWith('-F')),
        JSON.stringify(plan.lines),
      ).toBe(false);
      expect(applyChain(have, plan.lines), JSON.stringify({ n, at, del, lines: plan.lines })).toEqual(want);
      expect(planChain('C', want, want)).toEqual({ lines: [], changes: 0 });
    }
  });

  it('one DNAT more: one -I at its place, or -A at the end', () => {
    const have = [rule(1), rule(2), rule(4)];
    expect(planChain('C', have, [rule(1), rule(2), rule(3), rule(4)]).lines).toEqual([`-I C 3 ${rule(3)}`]);
    expect(planChain('C', have, [...have, rule(5)]).lines).toEqual([`-A C ${rule(5)}`]);
    expect(planChain('C', have, [rule(1), rule(4)], { deleteBySpec: true }).lines).toEqual([`-D C ${rule(2)}`]);
  });
});
