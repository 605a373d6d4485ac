/**
 * Where an autostarted daemon logs (src/cli/daemonLog.ts): PID 1's stdout when it is a pipe
 * or a file that is not the shim's own output, else natgw-daemon.log in the state
 * dir. The choice on fake stats, and the opening on real files, FIFOs and /dev/null in place
 * of /proc/1/fd/1. A real autostart under a PID namespace: test/netns/cli.test.ts.
 */
import { execFileSync } from 'node:child_process';
import { closeSync, fstatSync, mkdtempSync, openSync, readFileSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { DAEMON_LOG_FILE, openDaemonLog, usableContainerStdout } from '../../src/cli/daemonLog.js';

const stat = (kind: 'fifo' | 'socket' | 'file' | 'char', dev = 1, ino = 1) => ({
  dev,
  ino,
  isFIFO: () => kind === 'fifo',
  isSocket: () => kind === 'socket',
  isFile: () => kind === 'file',
});

describe('usableContainerStdout', () => {
  it('takes a pipe or a file; never a terminal or /dev/null (character devices), a socket (no open() reaches one), nor what cannot be read', () => {
    expect(usableContainerStdout(stat('fifo'), [])).toBe(true);
    expect(usableContainerStdout(stat('socket'), [])).toBe(false);
    expect(usableContainerStdout(stat('file'), [])).toBe(true);
    expect(usableContainerStdout(stat('char'), [])).toBe(false);
    expect(usableContainerStdout(undefined, [])).toBe(false);
  });

  it("refuses the shim's own stdout or stderr (the log would land in the command's output)", () => {
    expect(usableContainerStdout(stat('fifo', 5, 42), [stat('fifo', 5, 42), undefined])).toBe(false);
    expect(usableContainerStdout(stat('fifo', 5, 42), [undefined, stat('fifo', 5, 42)])).toBe(false);
    expect(usableContainerStdout(stat('fifo', 5, 42), [stat('fifo', 5, 43), stat('fifo', 6, 42)])).toBe(true);
  });
});

describe('openDaemonLog', () => {
  let dir: string;
  afterEach(() => rmSync(dir, { recursive: true, force: true }));
  const fresh = () => {
    dir = mkdtempSync(join(tmpdir(), 'natgw-dlog-'));
    return join(dir, 'state');
  };

  it('appends to a file standing in for PID 1 stdout', () => {
    const stateDir = fresh();
    const stdout = join(dir, 'pid1.out');
    writeFileAndClose(stdout, 'before\n');
    const d = openDaemonLog(stateDir, stdout);
    expect(d?.where).toBe(`container stdout (${stdout})`);
    writeSync(d!.fd, 'line\n');
    closeSync(d!.fd);
    expect(readFileSync(stdout, 'utf8')).toBe('before\nline\n');
  });

  it('falls back to the state dir: /dev/null, a FIFO nobody reads (without hanging), a path that is not there', () => {
    const stateDir = fresh();
    const fifo = join(dir, 'fifo');
    execFileSync('mkfifo', [fifo]);
    for (const target of ['/dev/null', fifo, join(dir, 'absent', 'x')]) {
      const d = openDaemonLog(stateDir, target);
      expect(d?.where, target).toBe(join(stateDir, DAEMON_LOG_FILE));
      expect(fstatSync(d!.fd).isFile()).toBe(true);
      closeSync(d!.fd);
    }
  });
});

function writeFileAndClose(p: string, text: string): void {
  const fd = openSync(p, 'w');
  writeSync(fd, text);
  closeSync(fd);
}
