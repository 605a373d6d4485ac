import { execFileSync } from 'node:child_process';

/** Whether the openssl tool is here (tests that make certificates skip without it). */
export function hasOpenssl(): boolean {
  try {
    execFileSync('openssl', ['version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}
