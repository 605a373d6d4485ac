import { promises as fs } from 'node:fs';
import { writeFileAtomic } from './store.js';

/**
 * A small durable JSON record in the state dir (the ownership record, the QoS intent record):
 * written atomically before the kernel changes, re-read by the next process after a crash. It is
 * read from the file each time, never kept in memory: an in-process shim run (another process)
 * may rewrite it, and a stale record misses what it should remove.
 */
export class RecordFile<T> {
  constructor(
    readonly file: string,
    /** The record from the parsed JSON; undefined (or a throw) when it is not one. */
    private readonly parse: (raw: unknown) => T | undefined,
    /** Told when the file cannot be read or parsed. */
    private readonly onUnreadable: (err: unknown) => void,
  ) {}

  /** The record; undefined when the file is absent or is not one. */
  async read(): Promise<T | undefined> {
    try {
      return this.parse(JSON.parse(await fs.readFile(this.file, 'utf8')));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') this.onUnreadable(e);
      return undefined;
    }
  }

  /** Durable before it returns. */
  async write(value: T): Promise<void> {
    await writeFileAtomic(this.file, `${JSON.stringify(value)}\n`);
  }
}
