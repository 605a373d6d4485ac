import type { Logger } from 'pino';
import { ExecError, type Executor, runChecked } from '../system/exec.js';
import { type Neighbour, neighbourKey } from '../model/neighbour.js';
import type { SyncOptions } from './netfilter/backend.js';
import { type NeighbourView, parseNeighbours, planNeighbours } from './neighboursPlan.js';

/**
 * Static neighbour entries (PERMANENT, owned by natgw). Every sync reads the kernel back
 * (`ip -j neigh show nud permanent` and the device list, in one `ip -batch`) and plans against
 * it. Only entries natgw programmed are removed.
 */
export class NeighbourManager {
  /** Identities natgw holds or is about to hold: a kernel deletion of one of these is drift. */
  private held = new Set<string>();

  constructor(
    private readonly exec: Executor,
    private readonly log?: Logger,
  ) {}

  /** Whether natgw holds an entry for this device and address (the link monitor asks). */
  holds(address: string, dev: string): boolean {
    return this.held.has(neighbourKey({ address, dev }));
  }

  async view(): Promise<NeighbourView> {
    const r = await this.exec.run({ file: 'ip', args: ['-j', '-batch', '-'], input: 'neigh show nud permanent\nlink show\n' });
    const docs = r.stdout
      .split('\n')
      .filter((l) => l.startsWith('['))
      .map((l) => JSON.parse(l) as unknown);
    if (r.exitCode !== 0 || docs.length < 2) {
      throw new ExecError(r, 'the read-back of static neighbours');
    }
    const links = (docs[1] ?? []) as { ifname?: string }[];
    return { entries: parseNeighbours(docs[0]), devices: new Set(links.map((l) => l.ifname ?? '').filter(Boolean)) };
  }

  async sync(want: readonly Neighbour[], previous: readonly Neighbour[], opts: SyncOptions = {}): Promise<{ changes: number; script: string }> {
    const have = await this.view();
    const lines = planNeighbours(have, want, previous);
    const script = lines.map((l) => `${l}\n`).join('');
    if (opts.dryRun) return { changes: lines.length, script };
    // Before the apply: the deletions natgw makes itself must not read as drift.
    this.held = new Set(want.map(neighbourKey));
    if (lines.length > 0) {
      await runChecked(this.exec, { file: 'ip', args: ['-batch', '-'], input: script }, 'the static neighbour change');
      this.log?.debug({ changes: lines.length }, 'static neighbours applied');
    }
    return { changes: lines.length, script };
  }
}
