import { statSync } from 'node:fs';

/** fileIdentitySync's answer for a file that does not exist. */
export const NO_FILE = '-';

/**
 * A file's identity as inode, size and mtime ('-' when absent): what tells this process that
 * another writer (an in-process shim run, a person, a restored backup) replaced or changed a
 * file it last read or wrote, with one stat. Synchronous on purpose: a stat of a local file
 * takes microseconds, a round trip through libuv's pool a tenth of a millisecond or more on a
 * busy node — and every command stamps the state files twice.
 */
export function fileIdentitySync(file: string): string {
  const st = statSync(file, { bigint: true, throwIfNoEntry: false });
  return st === undefined ? NO_FILE : `${st.ino}:${st.size}:${st.mtimeNs}`;
}
