import { promises as fs } from 'node:fs';
import { dirname } from 'node:path';

export interface RotatingFileOptions {
  readonly path: string;
  /** Rotate before a write would take the file past this many bytes. */
  readonly maxBytes: number;
  /** Lines waiting for the disk beyond this many bytes are dropped (a slow disk must not grow memory). */
  readonly maxPendingBytes?: number;
  readonly onError?: (e: unknown) => void;
}

/**
 * An append-only file rotated by size to `<path>.1` (one generation: the previous `.1` is
 * replaced). Writes are queued and flushed by one asynchronous loop, so a caller never waits
 * for the disk; what the queue cannot hold is dropped and reported by write()'s result.
 */
export class RotatingFile {
  private pending: string[] = [];
  private pendingBytes = 0;
  private size: number | undefined;
  private handle: fs.FileHandle | undefined;
  private flushing: Promise<void> | undefined;
  private readonly maxPending: number;

  constructor(private readonly opts: RotatingFileOptions) {
    this.maxPending = opts.maxPendingBytes ?? 4 * 1024 * 1024;
  }

  /** Queue one line (newline added); false when it was dropped because the queue is full. */
  write(line: string): boolean {
    const text = `${line}\n`;
    const n = Buffer.byteLength(text);
    if (this.pendingBytes + n > this.maxPending) return false;
    this.pending.push(text);
    this.pendingBytes += n;
    this.flushing ??= this.flush().finally(() => (this.flushing = undefined));
    return true;
  }

  /** Resolves when everything queued so far is on disk (or failed). */
  async drained(): Promise<void> {
    while (this.flushing) await this.flushing;
  }

  async close(): Promise<void> {
    await this.drained();
    await this.handle?.close().catch(() => undefined);
    this.handle = undefined;
  }

  private async open(): Promise<fs.FileHandle> {
    if (this.handle) return this.handle;
    await fs.mkdir(dirname(this.opts.path), { recursive: true });
    this.handle = await fs.open(this.opts.path, 'a', 0o640);
    this.size = (await this.handle.stat()).size;
    return this.handle;
  }

  private async rotate(): Promise<void> {
    await this.handle?.close().catch(() => undefined);
    this.handle = undefined;
    await fs.rename(this.opts.path, `${this.opts.path}.1`);
  }

  private async flush(): Promise<void> {
    while (this.pending.length > 0) {
      // Everything queued goes out in as few writes as the size limit allows.
      const batch: string[] = [];
      let bytes = 0;
      try {
        const h = await this.open();
        while (this.pending.length > 0) {
          const next = this.pending[0]!;
          const n = Buffer.byteLength(next);
          if ((this.size ?? 0) + bytes + n > this.opts.maxBytes && (this.size ?? 0) + bytes > 0) break;
          batch.push(next);
          bytes += n;
          this.pending.shift();
          this.pendingBytes -= n;
        }
        if (batch.length > 0) {
          await h.write(batch.join(''));
          this.size = (this.size ?? 0) + bytes;
        } else {
          await this.rotate();
        }
      } catch (e) {
        // The lines of a failed write are lost (counted by the caller as written): keep going.
        this.handle = undefined;
        this.opts.onError?.(e);
        if (batch.length === 0) {
          this.pending = [];
          this.pendingBytes = 0;
        }
      }
    }
  }
}
