import { promises as fs } from 'node:fs';
import { NO_FILE, fileIdentitySync } from '../system/fileIdentity.js';
import { writeFileAtomic } from './store.js';

/**
 * A small durable JSON record in the state dir (the ownership record, the QoS intent record):
 * written atomically before the kernel changes, re-read by the next process after a crash, and
 * kept in memory only while the file keeps the identity it had when this process read or wrote
 * it. An in-process shim run (another process) may rewrite it, and a reader outside the lock may
 * finish reading the old file after this process wrote a new one: a stale record misses what
 * it should remove, or makes an intent equal to it go unwritten.
 */
export class RecordFile<T> {
  private cached: { readonly value: T | undefined; readonly key: string } | undefined;

  constructor(
    readonly file: string,
    /** The record from the parsed JSON; undefined (or a throw) when it is not one. */
    private readonly parse: (raw: unknown) => T | undefined,
    /** Told once per version of a file that cannot be read or parsed. */
    private readonly onUnreadable: (err: unknown) => void,
  ) {}

  /**
   * The record; undefined when the file is absent or is not one. One stat when unchanged, made
   * synchronously (as the store's stamp): a sync reads it up to three times before its `ip -batch`,
   * and each trip through libuv's pool cost milliseconds while a restore kept both cores busy.
   */
  async read(): Promise<T | undefined> {
    const key = fileIdentitySync(this.file);
    if (this.cached?.key === key) return this.cached.value;
    let value: T | undefined;
    // No file (the QoS intent record of a gateway without QoS): the stat said so, no open to wait for.
    if (key === NO_FILE) {
      this.cached = { value, key };
      return value;
    }
    try {
      value = this.parse(JSON.parse(await fs.readFile(this.file, 'utf8')));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') this.onUnreadable(e);
    }
    this.cached = { value, key };
    return value;
  }

  /** Durable before it returns. */
  async write(value: T): Promise<void> {
    this.cached = undefined;
    await writeFileAtomic(this.file, `${JSON.stringify(value)}\n`);
    this.cached = { value, key: fileIdentitySync(this.file) };
  }
}
