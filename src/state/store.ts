import { promises as fs } from 'node:fs';
import path from 'node:path';
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

export class StateStore {
  readonly stateFile: string;
  readonly backendFile: string;
  readonly lockTarget: string;

  constructor(readonly dir: string) {
    this.stateFile = path.join(dir, 'state.json');
    this.backendFile = path.join(dir, 'backend.json');
    this.lockTarget = path.join(dir, 'natgw');
  }

  async load(): Promise<DesiredState | undefined> {
    const raw = await readJson(this.stateFile);
    if (raw === undefined) return undefined;
    const parsed = desiredStateSchema.safeParse(raw);
    if (!parsed.success) throw new Error(`state file ${this.stateFile} is invalid: ${parsed.error.message}`);
    return parsed.data;
  }

  async save(state: DesiredState): Promise<void> {
    await writeFileAtomic(this.stateFile, JSON.stringify(state, null, 1) + '\n');
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
