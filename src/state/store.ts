import { promises as fs } from 'node:fs';
import path from 'node:path';
import { createHash } from 'node:crypto';
import lockfile from 'proper-lockfile';
import { z } from 'zod';
import { desiredStateSchema, type DesiredState } from './state.js';

/**
 * Durable files in the state dir. Writes are atomic (temp file, fsync, rename, fsync of the
 * directory) so a crash leaves either the old or the new document, never half of one.
 */
export async function writeFileAtomic(file: string, data: string): Promise<void> {
  await fs.mkdir(path.dirname(file), { recursive: true });
  const tmp = `${file}.tmp-${process.pid}-${Date.now()}`;
  const fh = await fs.open(tmp, 'w', 0o600);
  try {
    await fh.writeFile(data);
    await fh.sync();
  } finally {
    await fh.close();
  }
  await fs.rename(tmp, file);
  const dir = await fs.open(path.dirname(file), 'r');
  try {
    await dir.sync();
  } finally {
    await dir.close();
  }
}

async function readJson(file: string): Promise<unknown | undefined> {
  try {
    return JSON.parse(await fs.readFile(file, 'utf8'));
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
}

/** The backend natgw chose in this network namespace, and a switch still to be finished. */
export const backendRecordSchema = z.object({
  kind: z.enum(['iptables', 'nftables']),
  variant: z.enum(['legacy', 'nft']).optional(),
  /** The previous backend whose objects still wait to be removed (SPEC §4.3 switching). */
  pendingCleanup: z
    .object({ kind: z.enum(['iptables', 'nftables']), variant: z.enum(['legacy', 'nft']).optional() })
    .optional(),
});
export type BackendRecord = z.infer<typeof backendRecordSchema>;

const SEAL_PREFIX_LEN = '{"sha256":"'.length + 64 + '","state":'.length;
const SEALED = /^\{"sha256":"([0-9a-f]{64})","state":$/;
const sha256 = (s: string): string => createHash('sha256').update(s).digest('hex');

export class StateStore {
  readonly stateFile: string;
  readonly backendFile: string;
  readonly lockTarget: string;

  constructor(
    readonly dir: string,
    /** Told when a state file could not be read and was set aside (it is then adopted anew). */
    private readonly onCorrupt?: (file: string, reason: string) => void,
  ) {
    this.stateFile = path.join(dir, 'state.json');
    this.backendFile = path.join(dir, 'backend.json');
    this.lockTarget = path.join(dir, 'natgw');
  }

  /**
   * Load the desired state. The file carries the sha256 of its state text: a match proves it
   * is the document natgw itself wrote (already validated and canonical), so the full schema
   * check — hundreds of milliseconds at ten thousand rules — runs only for a file someone
   * edited or an older format.
   */
  async load(): Promise<DesiredState | undefined> {
    let text: string;
    try {
      text = await fs.readFile(this.stateFile, 'utf8');
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw e;
    }
    const sealed = SEALED.exec(text.slice(0, SEAL_PREFIX_LEN));
    if (sealed && text.endsWith('}\n')) {
      const body = text.slice(SEAL_PREFIX_LEN, -2);
      if (sha256(body) === sealed[1]) return JSON.parse(body) as DesiredState;
    }
    let raw: { state?: unknown };
    try {
      raw = JSON.parse(text) as { state?: unknown };
    } catch (e) {
      return this.setAside(`not JSON: ${(e as Error).message}`);
    }
    const parsed = desiredStateSchema.safeParse(sealed ? raw.state : raw);
    return parsed.success ? parsed.data : this.setAside(parsed.error.message);
  }

  /**
   * A state file that cannot be read must not wedge the gateway (every command would fail
   * until someone intervened): it is kept beside, for a person to look at, and the state is
   * adopted from the kernel as after a lost file.
   */
  private async setAside(reason: string): Promise<undefined> {
    const aside = `${this.stateFile}.unreadable-${Date.now()}`;
    await fs.rename(this.stateFile, aside).catch(() => undefined);
    this.onCorrupt?.(aside, reason);
    return undefined;
  }

  async save(state: DesiredState): Promise<void> {
    const body = JSON.stringify(state);
    await writeFileAtomic(this.stateFile, `{"sha256":"${sha256(body)}","state":${body}}\n`);
  }

  async loadBackend(): Promise<BackendRecord | undefined> {
    const raw = await readJson(this.backendFile);
    if (raw === undefined) return undefined;
    const parsed = backendRecordSchema.safeParse(raw);
    return parsed.success ? parsed.data : undefined;
  }

  async saveBackend(rec: BackendRecord): Promise<void> {
    await writeFileAtomic(this.backendFile, JSON.stringify(rec) + '\n');
  }

  /**
   * One writer at a time across processes (daemon, in-process shim runs). A holder killed
   * with SIGKILL leaves a lock that goes stale after `stale` ms and is then taken over.
   */
  async withLock<T>(fn: () => Promise<T>): Promise<T> {
    await fs.mkdir(this.dir, { recursive: true });
    const release = await lockfile.lock(this.lockTarget, {
      realpath: false,
      stale: 10_000,
      update: 2_000,
      retries: { retries: 600, factor: 1.2, minTimeout: 5, maxTimeout: 100 },
    });
    try {
      return await fn();
    } finally {
      await release().catch(() => undefined);
    }
  }
}
