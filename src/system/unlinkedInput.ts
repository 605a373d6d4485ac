/**
 * A tool's stdin as a file, not a pipe: `nft -f -` and `iptables-restore` read all of their
 * input before they work, and a pipe holds 64 KiB, the rest written only as the event loop
 * turns — busy with other work (a bulk change's hashing). A file is there whole at once.
 */
import { closeSync, openSync, unlinkSync, writeSync } from 'node:fs';

/**
 * A read descriptor at offset 0 of a file created at `path` (O_EXCL: never an existing file or
 * a link someone planted; 0600), unlinked at once and holding `data` (written with pwrite). The
 * caller closes it once a child holds its own copy. Throws when it cannot be made; then nothing
 * is left at `path`.
 */
export function unlinkedFileWith(path: string, data: Buffer): number {
  const fd = openSync(path, 'wx+', 0o600);
  try {
    unlinkSync(path);
    let at = 0;
    while (at < data.length) at += writeSync(fd, data, at, data.length - at, at);
    return fd;
  } catch (e) {
    closeSync(fd);
    try {
      unlinkSync(path);
    } catch {}
    throw e;
  }
}
