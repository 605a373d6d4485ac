import { promises as fs } from 'node:fs';
import type { Logger } from 'pino';
import { type Executor, runChecked } from '../system/exec.js';
import { RecordFile } from '../state/recordFile.js';
import { familyOf } from '../model/net.js';
import { heldDefaultRoutes, heldDefaultRouteText } from '../model/defaultRoute.js';
import type { DesiredState } from '../state/state.js';
import type { SyncOptions } from './netfilter/backend.js';
import { timelineMark } from '../system/timeline.js';
import type { UplinkNetwork } from '../model/uplinks.js';
import { z } from 'zod';
import { addressesOf, type IpAddrJson, type LinkAddress, type LinkOwned, type LinkRoute, type LinkView, netDevNames, planLink } from './linkPlan.js';

/**
 * Addresses, routes and ARP on natgw's interfaces: "make it so" for the plan of linkPlan.ts.
 * Every sync reads the kernel (one `ip -batch` per family) and plans against what it lists.
 */
export interface LinkSyncResult {
  readonly changes: number;
  readonly script: string;
  /** Warnings for the change's output (a subnet route held, not installed); absent when there are none. */
  readonly notes?: readonly string[];
}

/**
 * The tool that tells the external segment an EIP lives here: arping's gratuitous ARP for IPv4;
 * for IPv6 an unsolicited neighbour advertisement to all nodes with the override flag and the
 * interface's link-layer address (`na6`, from ipv6toolkit: arping speaks only IPv4, ndisc6 only
 * solicits, and the kernel announces only after DAD, which natgw skips for EIPs).
 */
function announcement(ifname: string, ip: string): { file: string; args: string[] } {
  return familyOf(ip) === 4
    ? { file: 'arping', args: ['-U', '-c', '3', '-I', ifname, ip] }
    : { file: 'na6', args: ['-i', ifname, '-s', ip, '-d', 'ff02::1', '-t', ip, '-o', '-e'] };
}

/** Announcing processes at once, and how long one may take (`arping -c 3` sends for about 2 s). */
const ARP_PARALLELISM = 8;
const ARP_TIMEOUT_MS = 10_000;

/**
 * The durable ownership record of the link part (`owned.json` in the state dir): the EIP
 * addresses on EXT and the route destinations on VPC that natgw may have put into the kernel.
 *
 * Netfilter and share DNAT need no such record: their transactions are atomic and everything
 * in natgw's own tables and chains is natgw's, so a full sync converges them whatever a crash
 * left. Addresses and routes share their interfaces with other owners (the pod's own address,
 * the CNI's routes) and `ip -batch` stops half-way on an error, so the link part writes its
 * intent before touching the kernel: the record grows by what a change adds BEFORE it runs and
 * shrinks to what the state wants only AFTER it succeeded. Whatever happens in between (a
 * refused line, a hung tool, kill -9), the next sync finds every address and route natgw may
 * have added in the record and removes those the state does not want (roll forward to the
 * state that was persisted, which is the old or the new one).
 */
const ownedRecordSchema = z.object({ ext: z.string(), vpc: z.string(), addresses: z.array(z.string()), routes: z.array(z.string()) });
type OwnedRecord = z.infer<typeof ownedRecordSchema>;

/** A record of `want`'s interfaces owning these addresses and routes. */
function recordOf(want: DesiredState, addresses: readonly string[], routes: readonly string[]): OwnedRecord {
  return { ext: want.interfaces.ext, vpc: want.interfaces.vpc, addresses: [...new Set(addresses)], routes: [...new Set(routes)] };
}

const eipsOf = (s: DesiredState | undefined): string[] => (s?.eips ?? []).map((e) => e.address);
const routesOf = (s: DesiredState | undefined): string[] => (s?.routes ?? []).map((r) => r.cidr);

export class LinkManager {
  /** The durable ownership record (see RecordFile for when it is read again). */
  private readonly owned: RecordFile<OwnedRecord> | undefined;
  /** Objects a delete command named in the transaction under way (see release). */
  private releasing: { addresses: Set<string>; routes: Set<string> } = { addresses: new Set(), routes: new Set() };

  constructor(
    private readonly exec: Executor,
    private readonly log?: Logger,
    /** Where the ownership record lives; without one (unit tests) only the previous state counts. */
    ownedFile?: string,
  ) {
    this.owned = ownedFile
      ? new RecordFile(
          ownedFile,
          (raw) => ownedRecordSchema.parse(raw),
          (err) => log?.warn({ err, file: ownedFile }, 'ownership record unreadable: ignored'),
        )
      : undefined;
  }

  /**
   * A delete command named these objects: the transaction under way removes them from natgw's
   * interfaces even where the state does not list them (SPEC §5). Cleared by endTransaction.
   */
  release(what: { readonly addresses?: readonly string[]; readonly routes?: readonly string[] }): void {
    for (const a of what.addresses ?? []) this.releasing.addresses.add(a);
    for (const r of what.routes ?? []) this.releasing.routes.add(r);
  }

  /** Whether a sync has removals of its own to do even where the state did not change. */
  hasReleases(): boolean {
    return this.releasing.addresses.size > 0 || this.releasing.routes.size > 0;
  }

  endTransaction(): void {
    this.releasing = { addresses: new Set(), routes: new Set() };
  }

  /** The ownership record; a missing or unreadable one owns nothing (the state's own lists still count). */
  async ownedRecord(): Promise<OwnedRecord | undefined> {
    return this.owned?.read();
  }

  /** Write `rec` unless the file already holds it (`cur`: what this sync read or wrote there). */
  private async writeOwned(rec: OwnedRecord, cur: OwnedRecord | undefined): Promise<void> {
    if (JSON.stringify(rec) !== JSON.stringify(cur)) await this.owned?.write(rec);
  }

  /**
   * Whether the interface exists. /proc/net/dev (this network namespace's interfaces) answers
   * without starting a process (the start-up and every resync ask); a name it does not list may
   * still be an alternative name, which only `ip` resolves.
   */
  async exists(ifname: string): Promise<boolean> {
    const dev = await this.exec.readKernelFile?.('/proc/net/dev');
    if (dev !== undefined && netDevNames(dev).has(ifname)) return true;
    const r = await this.exec.run({ file: 'ip', args: ['link', 'show', 'dev', ifname] });
    return r.exitCode === 0;
  }

  /**
   * Wait until every named interface exists, polling with a deadline (Multus attaches net1
   * late). Returns the names still missing at the deadline.
   */
  async waitFor(names: readonly string[], timeoutMs: number, onWait?: (missing: string[]) => void): Promise<string[]> {
    const deadline = Date.now() + timeoutMs;
    let told = '';
    for (;;) {
      const found = await Promise.all(names.map((n) => this.exists(n)));
      const missing = names.filter((_, i) => !found[i]);
      if (missing.length === 0 || Date.now() >= deadline) return missing;
      if (missing.join(',') !== told) {
        told = missing.join(',');
        onWait?.(missing);
      }
      await new Promise((r) => setTimeout(r, Math.min(100, Math.max(0, deadline - Date.now()))));
    }
  }

  async addresses(ifname: string): Promise<LinkAddress[]> {
    const r = await this.exec.run({ file: 'ip', args: ['-j', 'addr', 'show', 'dev', ifname] });
    return r.exitCode === 0 ? addressesOf(JSON.parse(r.stdout || '[]') as IpAddrJson[]) : [];
  }

  /**
   * Everything planLink needs, in two `ip -batch` runs (one per family) instead of one process
   * per question: spawning is the dominant cost of a command on a small machine.
   */
  async view(s: DesiredState, previous?: DesiredState): Promise<LinkView> {
    const { vpc, ext } = s.interfaces;
    // The uplinks natgw applied before count too: a re-init that drops one takes its EIPs off it.
    const secondary = [...new Set([...(s.interfaces.secondary ?? []), ...(previous?.interfaces.secondary ?? [])].map((u) => u.name).filter((n) => n !== ext))];
    const [v4, v6] = await Promise.all([
      this.batchJson(['-j', '-batch', '-'], ['addr show', `route show dev ${vpc}`, `route show default dev ${ext}`]),
      this.batchJson(['-6', '-j', '-batch', '-'], [`route show dev ${vpc}`, `route show default dev ${ext}`]),
    ]);
    const routes = (x: unknown): LinkRoute[] =>
      ((x ?? []) as { dst: string; gateway?: string; protocol?: string }[]).map((r) => ({
        dst: r.dst,
        gateway: r.gateway,
        ...(r.protocol ? { protocol: r.protocol } : {}),
      }));
    const links = (v4[0] ?? []) as IpAddrJson[];
    const on = (dev: string) => addressesOf(links.filter((l) => l.ifname === dev));
    return {
      extAddresses: [...on(ext), ...secondary.flatMap((dev) => on(dev).map((a) => ({ ...a, dev })))],
      devices: new Set(secondary.filter((dev) => links.some((l) => l.ifname === dev))),
      vpcRoutes: [...routes(v4[1]), ...routes(v6[0])],
      extDefaults: [...routes(v4[2]), ...routes(v6[1])],
    };
  }

  /** The networks the named uplinks are connected to, from their addresses (what `ip route get` consults). */
  async uplinkNetworks(names: readonly string[]): Promise<UplinkNetwork[]> {
    const r = await this.exec.run({ file: 'ip', args: ['-j', 'addr', 'show'] });
    const links = r.exitCode === 0 ? (JSON.parse(r.stdout || '[]') as IpAddrJson[]) : [];
    return names.flatMap((dev) =>
      addressesOf(links.filter((l) => l.ifname === dev))
        .filter((a) => a.scope === 'global')
        .map((a) => ({ dev, cidr: `${a.address}/${a.prefixLength}` })),
    );
  }

  /** One JSON document per batch line; a line that failed (missing device) yields nothing. */
  private async batchJson(args: string[], lines: string[]): Promise<unknown[]> {
    const r = await this.exec.run({ file: 'ip', args, input: `${lines.join('\n')}\n` });
    return r.stdout
      .split('\n')
      .filter((l) => l.startsWith('['))
      .map((l) => JSON.parse(l) as unknown);
  }

  /**
   * Deleting a primary IPv4 address also deletes the secondaries of its subnet unless
   * promote_secondaries is on (it is off in a new network namespace, so in a pod): an eip-del
   * would take the other EIPs of that subnet with it. Best effort; failures are logged.
   */
  async promoteSecondaries(ifname: string): Promise<void> {
    const file = `/proc/sys/net/ipv4/conf/${ifname}/promote_secondaries`;
    try {
      if ((await fs.readFile(file, 'utf8')).trim() !== '1') await fs.writeFile(file, '1\n');
    } catch (e) {
      this.log?.warn({ err: e, ifname }, 'could not enable promote_secondaries');
    }
  }

  /** Make addresses and routes hold `want`, planned against what the kernel lists now. */
  async sync(want: DesiredState, previous: DesiredState | undefined, opts: SyncOptions = {}): Promise<LinkSyncResult> {
    const notes = this.heldNotes(want, opts.dryRun === true);
    const have = await this.view(want, previous);
    const record = await this.ownedRecord();
    // A record of other interfaces owns nothing on these.
    const mine = record?.ext === want.interfaces.ext && record.vpc === want.interfaces.vpc ? record : { addresses: [], routes: [] };
    // What natgw may remove: what the record owns and what the delete commands under way named.
    const owned: LinkOwned = {
      addresses: new Set([...mine.addresses, ...this.releasing.addresses]),
      routes: new Set([...mine.routes, ...this.releasing.routes]),
    };
    const lines = planLink(have, want, previous, owned);
    const script = lines.length ? `${lines.join('\n')}\n` : '';
    const result = { changes: lines.length, script, ...(notes.length ? { notes } : {}) };
    if (opts.dryRun) return result;
    const settled = recordOf(want, eipsOf(want), routesOf(want));
    if (lines.length === 0) {
      await this.writeOwned(settled, record);
      return result;
    }
    // Intent first, durable before the kernel changes: everything this change may add joins
    // what natgw already owns.
    timelineMark('link: planned');
    const intent = recordOf(want, [...mine.addresses, ...eipsOf(previous), ...eipsOf(want)], [...mine.routes, ...routesOf(previous), ...routesOf(want)]);
    await this.writeOwned(intent, record);
    // Without promote_secondaries a deleted primary takes the rest of its subnet along.
    if (lines.some((l) => l.startsWith('addr del '))) for (const dev of [want.interfaces.ext, ...(have.devices ?? [])]) await this.promoteSecondaries(dev);
    timelineMark('link: intent recorded');
    // `ip -batch` stops at the first error with the lines before it applied: the kernel is
    // somewhere in between, and the record (intent) lets the next sync finish the job.
    await runChecked(this.exec, { file: 'ip', args: ['-batch', '-'], input: script }, 'the address and route change');
    await this.writeOwned(settled, intent);
    this.log?.debug({ changes: lines.length }, 'addresses and routes applied');
    return result;
  }

  /** Subnet routes to the default the external one owns (heldDefaultRoutes) warned about in the log so far. */
  private heldWarned = new Set<string>();

  /**
   * Each held subnet route as a `Warning:` line for the change's output; logged once while it
   * stays held (a resync every few seconds would repeat it), again if it comes back.
   */
  private heldNotes(want: DesiredState, dryRun: boolean): string[] {
    const texts = heldDefaultRoutes(want).map((h) => heldDefaultRouteText(h, want.interfaces));
    if (!dryRun) {
      for (const t of texts) if (!this.heldWarned.has(t)) this.log?.warn(t);
      this.heldWarned = new Set(texts);
    }
    return texts.map((t) => `Warning: ${t}`);
  }

  /**
   * Gratuitous ARP (IPv4) or an unsolicited neighbour advertisement (IPv6) without holding the
   * command (the script blocked ~3 s per EIP): queued and sent a few at a time (a bulk change
   * may announce thousands of EIPs), each tool a child this process waits for — so it is reaped
   * even where PID 1 (`sleep infinity`) reaps nothing.
   */
  announce(ifname: string, ip: string): void {
    this.arpQueue.set(`${ifname} ${ip}`, { ifname, ip });
    this.schedulePump();
  }

  /**
   * Spawning a tool blocks the event loop for milliseconds: starting 8 announcements in one go
   * (every restart queues one per EIP) held the daemon's readiness and its requests for ~50 ms.
   * One process is started per turn of the loop, after what is already waiting.
   */
  private schedulePump(): void {
    if (this.arpPumpScheduled) return;
    this.arpPumpScheduled = true;
    setImmediate(() => {
      this.arpPumpScheduled = false;
      this.pumpArp();
    });
  }

  /** Resolves when every announcement queued so far has finished (an in-process run waits for it). */
  async settle(): Promise<void> {
    while (this.arpRunning > 0 || this.arpQueue.size > 0) await new Promise<void>((r) => this.arpIdle.push(r));
  }

  /** By `ifname ip`, in the order queued: an EIP announced again while still queued is sent once. */
  private readonly arpQueue = new Map<string, { ifname: string; ip: string }>();
  private arpRunning = 0;
  private arpPumpScheduled = false;
  private arpIdle: Array<() => void> = [];

  private pumpArp(): void {
    const [key, next] = this.arpQueue.entries().next().value ?? [];
    if (this.arpRunning < ARP_PARALLELISM && key !== undefined && next !== undefined) {
      const { ifname, ip } = next;
      this.arpQueue.delete(key);
      this.arpRunning++;
      void this.exec
        .run({ ...announcement(ifname, ip), timeoutMs: ARP_TIMEOUT_MS })
        .then(
          (r) => {
            if (r.exitCode !== 0 || r.failedToStart) this.log?.debug({ ip, ifname, exitCode: r.exitCode, stderr: r.stderr.trim() }, 'announcement not sent');
          },
          (e: unknown) => this.log?.debug({ err: e, ip }, 'announcement not sent'),
        )
        .finally(() => {
          this.arpRunning--;
          this.schedulePump();
          if (this.arpRunning === 0 && this.arpQueue.size === 0) for (const r of this.arpIdle.splice(0)) r();
        });
      if (this.arpQueue.size > 0) this.schedulePump();
    }
  }

  async ensureUp(ifname: string): Promise<void> {
    await runChecked(this.exec, { file: 'ip', args: ['link', 'set', 'dev', ifname, 'up'] });
  }
}
