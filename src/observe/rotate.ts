import { createWriteStream, fstatSync, mkdirSync, openSync, renameSync, type WriteStream } from 'node:fs';
import { finished } from 'node:stream/promises';
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
 * replaced). Lines go to a write stream, so a caller never waits for the disk write; what the
 * streams have not written yet beyond `maxPendingBytes` is dropped, and write() says so. A
 * rotation renames the file under its stream: the lines still queued for it land in `.1`, where
 * they belong. Opening and renaming are synchronous: a local file's, once per file.
 */
export class RotatingFile {
  private out: WriteStream | undefined;
  private size = 0;
  /** Streams of rotated files, still writing their last lines. */
  private readonly retired = new Set<WriteStream>();

  constructor(private readonly opts: RotatingFileOptions) {}

  /** Queue one line (newline added); false when it was dropped because the queue is full. */
  write(line: string): boolean {
    const text = `${line}\n`;
    const n = Buffer.byteLength(text);
    let pending = this.out?.writableLength ?? 0;
    for (const s of this.retired) pending += s.writableLength;
    if (pending + n > (this.opts.maxPendingBytes ?? 4 * 1024 * 1024)) return false;
    try {
      this.out ??= this.open();
      if (this.size > 0 && this.size + n > this.opts.maxBytes) {
        renameSync(this.opts.path, `${this.opts.path}.1`);
        this.retire();
        this.out = this.open();
      }
    } catch (e) {
      // The line is lost (counted by the caller as written); the next one opens the file anew.
      this.retire();
      this.opts.onError?.(e);
      return true;
    }
    this.out.write(text);
    this.size += n;
    return true;
  }

  /** Resolves when everything queued so far is on disk (or failed). */
  async drained(): Promise<void> {
    const out = this.out;
    if (out) await new Promise<void>((resolve) => out.write('', () => resolve()));
    await Promise.all([...this.retired].map((s) => finished(s).catch(() => undefined)));
  }

  async close(): Promise<void> {
    this.retire();
    await this.drained();
  }

  private open(): WriteStream {
    mkdirSync(dirname(this.opts.path), { recursive: true });
    const fd = openSync(this.opts.path, 'a', 0o640);
    this.size = fstatSync(fd).size;
    const out = createWriteStream('', { fd });
    out.on('error', (e) => {
      if (this.out === out) this.out = undefined;
      this.opts.onError?.(e);
    });
    return out;
  }

  /** End the current stream; it writes what it holds, then closes. */
  private retire(): void {
    const out = this.out;
    this.out = undefined;
    if (!out) return;
    this.retired.add(out);
    out.once('close', () => this.retired.delete(out));
    out.end();
  }
}
