/**
 * Conntrack flushes after a NAT mapping goes away (SPEC §2 floating-ip-del, dnat-del,
 * nft-dnat-map-del): exact arguments, and "nothing matched" (exit 1) is success.
 */
import { describe, expect, it } from 'vitest';
import { Conntrack, conntrackDeleteArgs } from '../../src/dataplane/conntrack.js';
import { RecordingExecutor } from '../../src/system/exec.js';

describe('conntrackDeleteArgs', () => {
  it('destination only (floating-ip-del)', () => {
    expect(conntrackDeleteArgs({ dst: '172.18.0.10' })).toEqual(['-D', '--orig-dst', '172.18.0.10']);
  });

  it('destination, protocol and port (dnat-del, nft-dnat-map-del)', () => {
    expect(conntrackDeleteArgs({ dst: '172.18.0.10', protocol: 'tcp', port: 8080 })).toEqual(['-D', '--orig-dst', '172.18.0.10', '-p', 'tcp', '--orig-port-dst', '8080']);
    expect(conntrackDeleteArgs({ dst: '172.18.0.10', protocol: 'udp', port: 53 })).toEqual(['-D', '--orig-dst', '172.18.0.10', '-p', 'udp', '--orig-port-dst', '53']);
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
    expect(exec.detached).toEqual([]);
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
