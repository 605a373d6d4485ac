import { closeSync, constants, fstatSync, mkdirSync, openSync, type Stats } from 'node:fs';
import path from 'node:path';

/**
 * Where an autostarted daemon's JSON log goes. Under the controller's pod spec PID 1 is
 * `sleep infinity` and the shim starts the daemon from a pod exec: the container's own stdout,
 * which `kubectl logs` shows, is PID 1's, reachable as /proc/1/fd/1. It is used when it is a
 * pipe or a file (container runtimes give a FIFO) and not the shim's own stdout or stderr;
 * never a terminal or /dev/null (a machine's init). Otherwise, or when it cannot be opened (a
 * socket cannot be, nor another user's process), natgw-daemon.log in the state dir.
 */
const CONTAINER_STDOUT = '/proc/1/fd/1';
export const DAEMON_LOG_FILE = 'natgw-daemon.log';

export interface DaemonLog {
  /** An fd for the child's stdout and stderr (the caller closes it after the spawn). */
  readonly fd: number;
  /** Where that is, in words, for the log lines. */
  readonly where: string;
}

type StatLike = Pick<Stats, 'dev' | 'ino' | 'isFIFO' | 'isFile'>;

/** Pure: may an autostarted daemon log to this (PID 1's stdout), given the shim's own stdout and stderr? */
export function usableContainerStdout(target: StatLike | undefined, own: readonly (StatLike | undefined)[]): boolean {
  if (!target) return false;
  if (!(target.isFIFO() || target.isFile())) return false;
  return !own.some((o) => o !== undefined && o.dev === target.dev && o.ino === target.ino);
}

const fstatOrUndefined = (fd: number): Stats | undefined => {
  try {
    return fstatSync(fd);
  } catch {
    return undefined;
  }
};

/** Open PID 1's stdout if it qualifies. Non-blocking open: a pipe without a reader fails (ENXIO) instead of hanging. */
function openContainerStdout(target: string): number | undefined {
  let fd: number;
  try {
    fd = openSync(target, constants.O_WRONLY | constants.O_APPEND | constants.O_NONBLOCK | constants.O_NOCTTY);
  } catch {
    return undefined;
  }
  if (usableContainerStdout(fstatOrUndefined(fd), [fstatOrUndefined(1), fstatOrUndefined(2)])) return fd;
  closeSync(fd);
  return undefined;
}

export function openDaemonLog(stateDir: string, containerStdout = CONTAINER_STDOUT): DaemonLog | undefined {
  const fd = openContainerStdout(containerStdout);
  if (fd !== undefined) return { fd, where: `container stdout (${containerStdout})` };
  try {
    mkdirSync(stateDir, { recursive: true });
    const file = path.join(stateDir, DAEMON_LOG_FILE);
    return { fd: openSync(file, 'a', 0o600), where: file };
  } catch {
    return undefined;
  }
}

/** The environment variable by which the shim tells the daemon it started where its log goes (its start line says so). */
export const LOG_TO_ENV = 'NATGW_LOG_TO';
