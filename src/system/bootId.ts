import { readFileSync } from 'node:fs';

let read: string | undefined;
/** This boot of the machine (`/proc/sys/kernel/random/boot_id`), read once; empty where it cannot be read. */
export function bootId(): string {
  if (read === undefined) {
    try {
      read = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
    } catch {
      read = '';
    }
  }
  return read;
}
