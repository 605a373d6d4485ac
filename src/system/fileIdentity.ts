import { promises as fs, statSync } from 'node:fs';

/**
 * A file's identity as inode, size and mtime ('-' when absent): what tells this process that
 * another writer (an in-process shim run, a person, a restored backup) replaced or changed a
 * file it last read or wrote, with one stat.
 */
export async function fileIdentity(file: string): Promise<string> {
  try {
    const st = await fs.stat(file, { bigint: true });
    return `${st.ino}:${st.size}:${st.mtimeNs}`;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return '-';
    throw e;
  }
}

/**
 * fileIdentity without the thread pool: a stat of a local file takes microseconds, a round trip
 * through libuv's pool a tenth of a millisecond or more on a busy node — and every command
 * stamps the state files twice.
 */
export function fileIdentitySync(file: string): string {
  const st = statSync(file, { bigint: true, throwIfNoEntry: false });
  return st === undefined ? '-' : `${st.ino}:${st.size}:${st.mtimeNs}`;
}
