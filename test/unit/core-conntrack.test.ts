/**
 * Conntrack flushes after a NAT mapping goes away (SPEC §2 floating-ip-del, dnat-del,
 * nft-dnat-map-del): exact arguments, and "nothing matched" (exit 1) is success.
 */
import { describe, expect, it } from 'vitest';
import { Conntrack, conntrackDeleteArgs } from '../../src/dataplane/conntrack.js';
import { RecordingExecutor } from '../helpers/execCalls.js';

describe('conntrackDeleteArgs', () => {
  it('destination only (floating-ip-del)', () => {
    expect(conntrackDeleteArgs({ dst: '172.18.0.10' })).toEqual(['-D', '--orig-dst', '172.18.0.10']);
  });

  it('destination, protocol and port (dnat-del, nft-dnat-map-del)', () => {
    expect(conntrackDeleteArgs({ dst: '172.18.0.10', protocol: 'tcp', port: 8080 })).toEqual([
      '-D',
      '--orig-dst',
      '172.18.0.10',
      '-p',
      'tcp',
      '--orig-port-dst',
      '8080',
    ]);
    expect(conntrackDeleteArgs({ dst: '172.18.0.10', protocol: 'udp', port: 53 })).toEqual([
      '-D',
      '--orig-dst',
      '172.18.0.10',
      '-p',
      'udp',
      '--orig-port-dst',
      '53',
    ]);
  });

  it('a protocol without a port; a port without a protocol is not usable by conntrack and is dropped', () => {
    expect(conntrackDeleteArgs({ dst: '172.18.0.10', protocol: 'udp' })).toEqual(['-D', '--orig-dst', '172.18.0.10', '-p', 'udp']);
    expect(conntrackDeleteArgs({ dst: '172.18.0.10', port: 80 })).toEqual(['-D', '--orig-dst', '172.18.0.10']);
  });

  it('every value sits in a value position (never an option of its own)', () => {
    const args = conntrackDeleteArgs({ dst: '2001:db8::10', protocol: 'tcp', port: 1 });
    expect(args).toEqual(['-D', '--orig-dst', '2001:db8::10', '-p', 'tcp', '--orig-port-dst', '1']);
    expect(args[0]).toBe('-D');
    // After -D: option, value, option, value, ...
    for (let i = 1; i < args.length; i += 2) {
      expect(args[i]).toMatch(/^-/);
      expect(args[i + 1]).not.toMatch(/^-/);
    }
  });
});

describe('Conntrack.flush', () => {
  it('exit 1 with "0 flow entries have been deleted." on stderr resolves 0, no throw', async () => {
    const exec = new RecordingExecutor(() => ({
      exitCode: 1,
      stderr: 'conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.\n',
    }));
    await expect(new Conntrack(exec).flush({ dst: '172.18.0.10', protocol: 'tcp', port: 80 })).resolves.toBe(0);
    expect(exec.calls).toEqual([{ file: 'conntrack', args: ['-D', '--orig-dst', '172.18.0.10', '-p', 'tcp', '--orig-port-dst', '80'] }]);
  });

  it('returns the number of deleted entries', async () => {
    const exec = new RecordingExecutor(() => ({
      exitCode: 0,
      stdout: 'tcp      6 431999 ESTABLISHED src=10.0.1.6 dst=172.18.0.10 sport=1 dport=80 ...\n',
      stderr: 'conntrack v1.4.7 (conntrack-tools): 3 flow entries have been deleted.\n',
    }));
    expect(await new Conntrack(exec).flush({ dst: '172.18.0.10' })).toBe(3);
    expect(exec.calls[0]?.args).toEqual(['-D', '--orig-dst', '172.18.0.10']);
  });

  it('a missing conntrack binary resolves 0 (flushing is best effort)', async () => {
    const exec = new RecordingExecutor(() => ({ exitCode: 127, failedToStart: true, stderr: 'spawn conntrack ENOENT' }));
    await expect(new Conntrack(exec).flush({ dst: '172.18.0.10' })).resolves.toBe(0);
  });

  it('output without a summary resolves 0', async () => {
    const exec = new RecordingExecutor(() => ({ exitCode: 0 }));
    await expect(new Conntrack(exec).flush({ dst: '172.18.0.10' })).resolves.toBe(0);
  });

  it('runs exactly one conntrack process per flush, never through a shell', async () => {
    const exec = new RecordingExecutor();
    const ct = new Conntrack(exec);
    await ct.flush({ dst: '172.18.0.10' });
    await ct.flush({ dst: '172.18.0.11', protocol: 'udp', port: 53 });
    expect(exec.calls.map((c) => c.file)).toEqual(['conntrack', 'conntrack']);
    expect(exec.calls.every((c) => c.input === undefined)).toBe(true);
  });
});

describe('Conntrack.flushOwed', () => {
  // Two tracked flows as conntrack -L (1.4.7) prints them: one to a DNAT that goes, one elsewhere.
  const LISTING = [
    'tcp      6 431999 ESTABLISHED src=172.20.0.100 dst=172.18.0.10 sport=40000 dport=8081 src=10.0.1.6 dst=172.20.0.100 sport=80 dport=40000 [ASSURED] mark=0 use=1',
    'udp      17 29 src=172.20.0.100 dst=172.18.0.11 sport=5353 dport=53 [UNREPLIED] src=10.0.1.7 dst=172.20.0.100 sport=53 dport=5353 mark=0 use=1',
    '',
  ].join('\n');

  it('a bulk of filters lists once and deletes only where a tracked flow matches', async () => {
    const exec = new RecordingExecutor((r) =>
      r.args[0] === '-L'
        ? { stdout: LISTING, stderr: 'conntrack v1.4.7 (conntrack-tools): 2 flow entries have been shown.\n' }
        : { exitCode: 1, stderr: '0 flow entries have been deleted.\n' },
    );
    const filters = Array.from({ length: 500 }, (_, i) => ({ dst: '172.18.0.10', protocol: 'tcp' as const, port: 8000 + i }));
    await new Conntrack(exec).flushOwed(filters);
    expect(exec.calls.map((c) => c.args.join(' '))).toEqual(['-L -f ipv4 -o extended', '-D --orig-dst 172.18.0.10 -p tcp --orig-port-dst 8081']);
  });

  it('a few filters are flushed one by one without a listing; a failed listing falls back to that', async () => {
    const few = new RecordingExecutor(() => ({ exitCode: 1, stderr: '0 flow entries have been deleted.\n' }));
    await new Conntrack(few).flushOwed([{ dst: '172.18.0.10' }, { dst: '172.18.0.11', protocol: 'udp', port: 53 }]);
    expect(few.calls.map((c) => c.args[0])).toEqual(['-D', '-D']);
    const broken = new RecordingExecutor((r) => (r.args[0] === '-L' ? { exitCode: 1, stderr: 'conntrack: Operation not permitted\n' } : undefined));
    await new Conntrack(broken).flushOwed(Array.from({ length: 20 }, (_, i) => ({ dst: `172.18.0.${i}` })));
    expect(broken.calls.filter((c) => c.args[0] === '-D')).toHaveLength(20);
  });
});

describe('Conntrack: flushes owed after a failure', () => {
  const range = { dst: '172.18.0.10', protocol: 'tcp' as const, port: 9000, portEnd: 9010 };
  const LISTED = [
    'tcp      6 431999 ESTABLISHED src=172.20.0.100 dst=172.18.0.10 sport=40000 dport=9005 src=10.0.1.6 dst=172.20.0.100 sport=80 dport=40000 [ASSURED] mark=0 use=1',
    'tcp      6 431999 ESTABLISHED src=172.20.0.100 dst=172.18.0.10 sport=40001 dport=8080 src=10.0.1.6 dst=172.20.0.100 sport=80 dport=40001 [ASSURED] mark=0 use=1',
    '',
  ].join('\n');
  const shown = 'conntrack v1.4.7 (conntrack-tools): 2 flow entries have been shown.\n';

  it('a port range whose listing fails is owed, retried at the next resync, and then deletes its ports', async () => {
    let listingFails = true;
    const exec = new RecordingExecutor((r) => {
      if (r.args[0] === '-L')
        return listingFails ? { exitCode: 1, stderr: 'conntrack v1.4.7 (conntrack-tools): Operation not permitted\n' } : { stdout: LISTED, stderr: shown };
      return { stderr: 'conntrack v1.4.7 (conntrack-tools): 1 flow entries have been deleted.\n' };
    });
    const ct = new Conntrack(exec);
    expect((await ct.flushOwed([range])).deleted).toBe(0);
    expect(ct.pendingFlushes).toBe(1);
    expect(exec.calls.map((c) => c.args[0])).toEqual(['-L']);
    // Still failing: still owed.
    await ct.retryFailed();
    expect(ct.pendingFlushes).toBe(1);
    listingFails = false;
    exec.calls.length = 0;
    expect(await ct.retryFailed()).toBe(1);
    expect(ct.pendingFlushes).toBe(0);
    expect(exec.calls.map((c) => c.args.join(' '))).toEqual(['-L -f ipv4 -o extended', '-D --orig-dst 172.18.0.10 -p tcp --orig-port-dst 9005']);
  });

  it('a timed-out range listing is owed too; a range and a single port of it are separate debts', async () => {
    const exec = new RecordingExecutor((r) =>
      r.args[0] === '-L' ? { exitCode: 1, timedOut: true } : { exitCode: 1, stderr: 'failed: Device or resource busy\n' },
    );
    const ct = new Conntrack(exec);
    await ct.flushOwed([range, { dst: '172.18.0.10', protocol: 'tcp', port: 9000 }]);
    expect(ct.pendingFlushes).toBe(2);
  });

  it('a range is given up after as many attempts as a single port', async () => {
    const exec = new RecordingExecutor(() => ({ exitCode: 1, stderr: 'conntrack: Operation not permitted\n' }));
    const ct = new Conntrack(exec);
    await ct.flushOwed([range, { dst: '172.18.0.11', protocol: 'udp', port: 53 }]);
    let rounds = 1;
    while (ct.pendingFlushes > 0 && rounds < 20) {
      await ct.retryFailed();
      rounds++;
    }
    expect(ct.pendingFlushes).toBe(0);
    // Both stopped at the same bound: one listing and one delete per attempt.
    expect(exec.calls.filter((c) => c.args[0] === '-L')).toHaveLength(exec.calls.filter((c) => c.args[0] === '-D').length);
    expect(rounds).toBeLessThan(20);
  });
});
