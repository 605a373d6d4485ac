import { z } from 'zod';
import type { Logger } from 'pino';
import { SystemError } from '../../model/errors.js';
import { type EipQos, type GwQos, eipQosDevice, eipQosKey, gwQosDevice, gwQosKey, ifbName, IFB_PREFIX } from '../../model/qos.js';
import { ExecError, type Executor, type ExecResult } from '../../system/exec.js';
import { allocateQos } from '../../state/qosOperations.js';
import type { DesiredState } from '../../state/state.js';
import { type ProbeResult, describe, probeDeviceName, probeQosFeatures } from './probe.js';
import {
  type DeviceListing,
  type DeviceTc,
  type TcFilter,
  type TcLink,
  type TcQdisc,
  deviceListingScript,
  parseDeviceListing,
  parseLinks,
  parseQdiscs,
  rulesFromKernel,
  shapedDevices,
} from './readback.js';
import {
  type DesiredDevice,
  type KernelQos,
  type QosFeatures,
  type QosPiece,
  type QosPlan,
  desiredDevices,
  pieceKey,
  qosPieceSchema,
  renderQos,
  tcBatchScript,
} from './render.js';
import type { SyncOptions } from '../netfilter/backend.js';
import { RecordFile } from '../../state/recordFile.js';
import { eipUplinkOf, hasSecondaryUplinks, uplinkNames } from '../../model/uplinks.js';

/**
 * Makes the kernel hold exactly the QoS of the desired state (SPEC §2 QoS), and reads
 * natgw's QoS back from the kernel where the state file is gone (SPEC §3.4). Every sync
 * reads with tc what it plans against — a full sync every device natgw shapes, a partial one
 * the devices whose rules changed — renders a plan (pure, render.ts) and applies it with one
 * `tc -batch -`. Devices that do not exist are skipped while the rest is applied, then reported.
 */

/** `dryRun`: render, change nothing. `mode`: a partial sync reads only the devices whose rules changed since `from`. */
export type QosSyncOptions = SyncOptions;

export interface QosSyncResult {
  /** Commands run (or, in a dry run, that would run). 0 means the kernel already matched. */
  readonly changes: number;
  readonly notes: string[];
  /** The rendered commands: `ip …` lines, then the tc batch lines prefixed with `tc `. */
  readonly commands: string[];
}

const READ_TIMEOUT_MS = 10_000;
const APPLY_TIMEOUT_MS = 30_000;

/**
 * The QoS part's intent record (`qos-intent.json` in the state dir): the shared pieces
 * (QosPiece) a change is about to create, written durably BEFORE `ip`/`tc` run and cleared
 * only once a state that the kernel was synced to is persisted. `tc -batch` is not atomic and
 * a crash can stop it after any line: the next sync finds what the interrupted change created
 * in the record and removes what the persisted state does not need (classes and filters under
 * natgw's root need no record: a sync removes the stale ones on every device natgw shapes).
 */
export interface QosIntent {
  readonly pieces: readonly QosPiece[];
}

export class QosManager {
  private probe: Promise<ProbeResult> | undefined;
  private probed: ProbeResult | undefined;
  /** The durable intent record (see RecordFile for when it is read again). */
  private readonly intent: RecordFile<QosIntent> | undefined;
  /** The QoS the kernel was last synced to by this process (what settle compares with). */
  private syncedTo: QosOf | undefined;

  constructor(
    private readonly exec: Executor,
    private readonly log?: Logger,
    private readonly out?: (line: string) => void,
    /** Where the intent record lives; without one (unit tests) nothing is recorded. */
    intentFile?: string,
  ) {
    this.intent = intentFile
      ? new RecordFile(intentFile, parseIntent, (err) => log?.warn({ err, file: intentFile }, 'QoS intent record unreadable: ignored'))
      : undefined;
  }

  /** Whether a change's shared pieces are still unsettled (a full sync must run the QoS part). */
  async hasPending(): Promise<boolean> {
    return (await this.intentRecord()).pieces.length > 0;
  }

  /**
   * `state` is persisted: where the kernel was last synced to its QoS, whatever the record
   * lists is now either needed by an acknowledged rule (so left in place, SPEC) or was removed
   * by that sync, and the record is cleared.
   */
  async settle(state: DesiredState): Promise<void> {
    if (!this.syncedTo || !sameQos(this.syncedTo, qosOf(state))) return;
    if ((await this.intentRecord()).pieces.length === 0) return;
    await this.writeIntent({ pieces: [] });
  }

  /** `from`: what natgw applied before; a partial sync plans only the devices whose rules differ from it. */
  async sync(state: DesiredState, opts: QosSyncOptions = {}, from?: DesiredState): Promise<QosSyncResult> {
    const pending = (await this.intentRecord()).pieces;
    // What an interrupted change left (the record) may sit on any device: only a full sync sees it.
    const scope = opts.mode === 'partial' && from !== undefined && pending.length === 0 ? changedDevices(from, state) : undefined;
    if (scope?.size === 0) return { changes: 0, notes: [], commands: [] };
    const kernel = await this.readKernel(state, pending, scope);
    const all = this.layout(state, kernel);
    const desired = scope ? new Map([...all].filter(([dev]) => scope.has(dev))) : all;
    const notes: string[] = [];
    // Any class at all, not only in scope: a command prints the probe's line whichever sync carries it.
    const needs = [...all.values()].some((d) => d.classes.length > 0);
    const features = needs ? await this.features(notes, opts.dryRun === true) : { fqCodel: false, matchall: false };
    const plan = renderQos(desired, kernel, features, pending);
    notes.push(...plan.notes);
    for (const n of plan.notes) this.log?.info({ note: n }, 'qos');

    const ipAfter = plan.ipAfter ?? [];
    const commands = [...plan.ip.map((a) => `ip ${a.join(' ')}`), ...plan.tc.map((l) => `tc ${l}`), ...ipAfter.map((a) => `ip ${a.join(' ')}`)];
    const changes = plan.ip.length + plan.tc.length + ipAfter.length;
    if (!opts.dryRun) {
      this.syncedTo = undefined;
      // Intent first: what this change creates joins what earlier unsettled changes did.
      const creates = plan.creates ?? [];
      if (creates.length > 0) await this.writeIntent({ pieces: mergePieces((await this.intentRecord()).pieces, creates) });
      await this.apply(plan);
      if (plan.missing.length === 0) this.syncedTo = qosOf(state);
    }
    if (changes > 0) this.log?.info({ changes, dryRun: opts.dryRun === true, partial: scope !== undefined }, 'qos sync');
    if (plan.missing.length > 0) {
      const msg = `Error: QoS device${plan.missing.length > 1 ? 's' : ''} not found: ${plan.missing.join(', ')}`;
      if (!opts.dryRun) throw new SystemError(msg);
      notes.push(msg);
    }
    return { changes, notes, commands };
  }

  /** The intent record; a missing one owes nothing, an unreadable one cannot be acted on (logged, then replaced). */
  private async intentRecord(): Promise<QosIntent> {
    return (await this.intent?.read()) ?? { pieces: [] };
  }

  /** Durable before the kernel changes, and re-read by the next process after a crash. */
  private async writeIntent(rec: QosIntent): Promise<void> {
    await this.intent?.write(rec);
  }

  /**
   * The classes and filters each device must hold. Rules without ids (a state written through
   * the API, or adopted) first take the ids the kernel already uses for them.
   */
  private layout(state: DesiredState, kernel: KernelQos): Map<string, DesiredDevice> {
    const ext = state.interfaces.ext;
    const missingIds = [...state.eipQos, ...state.qos].some((q) => q.classId === undefined || q.handle === undefined);
    const hints = missingIds ? rulesFromKernel(ext, [...new Set([ext, ...state.qos.map((q) => q.dev)])], kernel.devices, uplinkNames(state.interfaces)) : {};
    const allocated = allocateQos(state, hints);
    return desiredDevices(eipUplinkOf(state), allocated.eipQos, allocated.qos);
  }

  /**
   * What a plan for `scope` needs: per device one tc batch (readDevices) of the devices in scope
   * (without one: those the rules name and those carrying natgw's layout), the ingress filters of
   * the devices their IFBs serve and of those an interrupted change left pieces on, and the links
   * where an IFB's state or such pieces matter. A partial sync reads all of it at once; a full one
   * lists every qdisc alongside, then reads the devices that shows carrying natgw's layout.
   */
  private async readKernel(state: DesiredState, pending: readonly QosPiece[], scope: ReadonlySet<string> | undefined): Promise<KernelQos> {
    const extOf = eipUplinkOf(state);
    const served = (shaped: readonly string[]) => shaped.filter((d) => d.startsWith(IFB_PREFIX)).map((d) => d.slice(IFB_PREFIX.length));
    // An IFB is set up if it is down; only `ip` prints a link's state.
    const links = (shaped: readonly string[]) => pending.length > 0 || shaped.some((d) => d.startsWith(IFB_PREFIX));
    if (scope) return this.readDevices([...scope], served([...scope]), links([...scope]));
    const known = [
      ...new Set([
        ...state.eipQos.map((q) => eipQosDevice(q, extOf(q.ip))),
        ...state.qos.map((q) => gwQosDevice(q)),
        ...pending.flatMap((p) => (p.kind === 'root' ? [p.dev] : [])),
      ]),
    ];
    // The other pieces need only whether their device exists and its qdiscs and ingress filters.
    const others = pending.flatMap((p) => (p.kind === 'root' ? [] : [p.dev]));
    const [all, first] = await Promise.all([this.readQdiscs(), this.readDevices(known, [...served(known), ...others], links(known))]);
    const more = shapedDevices(all).flatMap((s) => (known.includes(s.dev) ? [] : [s.dev]));
    if (more.length === 0) return withQdiscsOf(first, all);
    const rest = await this.readDevices(more, served(more), links(more));
    return withQdiscsOf(mergeReads(first, rest), all);
  }

  /**
   * natgw's QoS rules as the kernel holds them, with their class ids and handles: EIP
   * rules from EXT and ifb-EXT, gateway rules from `devs`, EXT and every device that
   * carries natgw's layout (root htb 1: with default class 0x9999).
   */
  async readBack(extIf: string, devs: string[]): Promise<{ eipQos: EipQos[]; qos: GwQos[] }> {
    const discovered = shapedDevices(await this.readQdiscs()).map((s) => s.servesIngressOf ?? s.dev);
    const gwDevs = [...new Set([extIf, ...devs, ...discovered])];
    const { devices } = await this.readDevices([...gwDevs, ...gwDevs.map(ifbName)], [], false);
    return rulesFromKernel(extIf, gwDevs, devices);
  }

  /**
   * Probe once per manager. What was found goes into every sync's notes (so a command prints
   * the same lines whether a long-lived daemon or a one-shot run carries it out), into the log
   * once, and never to stderr.
   */
  private async features(notes: string[], dryRun: boolean): Promise<QosFeatures> {
    if (!this.probed && dryRun && !this.probe) {
      // A probe makes a throwaway device; a dry run changes nothing, so it assumes a production kernel.
      const assumed = { fqCodel: true, matchall: true };
      notes.push(`INFO: QoS kernel features not probed in a dry run; assuming ${describe(assumed)}`);
      return assumed;
    }
    if (!this.probed) {
      this.probe ??= (async () => {
        const name = probeDeviceName();
        // A kill while the throwaway device exists must not leave it behind: it is intent too.
        await this.writeIntent({ pieces: mergePieces((await this.intentRecord()).pieces, [{ kind: 'ifb', dev: name }]) });
        return probeQosFeatures(this.exec, name);
      })();
      let r: ProbeResult;
      try {
        r = await this.probe;
      } catch (e) {
        // The record could not be written (a full state dir): the next sync tries again.
        this.probe = undefined;
        throw e;
      }
      if (!this.probed) {
        this.probed = r;
        this.out?.(r.summary);
        this.log?.info({ fqCodel: r.features.fqCodel, matchall: r.features.matchall, probed: r.probed }, 'qos kernel probe');
      }
    }
    notes.push(this.probed.summary);
    return this.probed.features;
  }

  private async apply(plan: QosPlan): Promise<void> {
    await this.runIp(plan.ip);
    const script = tcBatchScript(plan);
    if (script !== '') {
      const r = await this.exec.run({ file: 'tc', args: ['-batch', '-'], input: script, timeoutMs: APPLY_TIMEOUT_MS });
      if (r.exitCode !== 0) {
        this.log?.warn({ script, stderr: r.stderr }, 'qos apply failed');
        throw new ExecError({ ...r, stderr: errorText(r) }, 'the QoS change', script);
      }
    }
    await this.runIp(plan.ipAfter ?? []);
  }

  /** Device changes one `ip` run each, in order; the first that fails stops the rest. */
  private async runIp(commands: readonly (readonly string[])[]): Promise<void> {
    for (const args of commands) {
      const r = await this.exec.run({ file: 'ip', args, timeoutMs: APPLY_TIMEOUT_MS });
      if (r.exitCode !== 0) throw new ExecError({ ...r, stderr: errorText(r) }, 'the QoS device change');
    }
  }

  /** Every qdisc of the namespace, each naming its device. Strict: reading "no qdiscs" by mistake would make natgw replace roots it owns. */
  private async readQdiscs(): Promise<TcQdisc[]> {
    const text = await this.readStrict('tc', ['qdisc', 'show']);
    try {
      return parseQdiscs(text);
    } catch (e) {
      throw new SystemError(`Error: tc qdisc show printed what natgw cannot read (${e instanceof Error ? e.message : String(e)})`);
    }
  }

  /**
   * One `tc -d -raw -batch -` per device (deviceListingScript): classes and root filters of
   * `shaped`, ingress filters of `ingressOf`, the qdiscs of both. A device whose batch succeeds
   * exists. One that fails is looked up with `ip` (tc's complaint is not read): one that is gone
   * reads as missing, one that is there is an error (planning from a failed read would replace
   * what natgw owns). `links`: read the links with `ip` anyway (an IFB's state).
   */
  private async readDevices(shaped: readonly string[], ingressOf: readonly string[], links: boolean): Promise<KernelQos> {
    const want = new Map<string, { classes: boolean; ingress: boolean }>();
    for (const dev of shaped) want.set(dev, { classes: true, ingress: false });
    for (const dev of ingressOf) want.set(dev, { classes: want.get(dev)?.classes ?? false, ingress: true });
    const listLinks = () => this.readStrict('ip', ['-j', 'link', 'show']).then(parseLinks);
    const [reads, linkList] = await Promise.all([
      Promise.all(
        [...want].map(async ([dev, w]) => ({
          dev,
          w,
          r: await this.exec.run({ file: 'tc', args: ['-d', '-raw', '-batch', '-'], input: deviceListingScript(dev, w), timeoutMs: READ_TIMEOUT_MS }),
        })),
      ),
      links ? listLinks() : undefined,
    ]);
    const failed = reads.filter((x) => x.r.exitCode !== 0);
    const known = linkList ?? (failed.length > 0 ? await listLinks() : undefined);
    const exists = new Set(known?.map((l) => l.name));
    for (const { dev, r } of failed) {
      if (exists.has(dev)) throw new ExecError({ ...r, stderr: errorText(r) }, `the QoS listing of ${dev}`);
    }
    const devices = new Map<string, DeviceTc>();
    const ingress = new Map<string, readonly TcFilter[]>();
    const qdiscs: TcQdisc[] = [];
    for (const { dev, w, r } of reads) {
      if (r.exitCode !== 0) continue;
      let listing: DeviceListing;
      try {
        listing = parseDeviceListing(dev, r.stdout);
      } catch (e) {
        throw new SystemError(`Error: tc printed a QoS listing of ${dev} that natgw cannot read (${e instanceof Error ? e.message : String(e)})`);
      }
      qdiscs.push(...listing.qdiscs);
      if (w.classes) devices.set(dev, { classes: listing.classes, filters: listing.filters });
      if (w.ingress) ingress.set(dev, listing.ingress);
    }
    const listed = reads.filter((x) => x.r.exitCode === 0).map((x): TcLink => ({ name: x.dev }));
    return { links: known ?? listed, qdiscs, devices, ingress };
  }

  private async readStrict(file: string, args: string[]): Promise<string> {
    const r = await this.exec.run({ file, args, timeoutMs: READ_TIMEOUT_MS });
    if (r.exitCode !== 0) throw new ExecError({ ...r, stderr: errorText(r) }, 'the QoS listing');
    return r.stdout;
  }
}

/** Two device reads as one (the later one's devices win). */
function mergeReads(a: KernelQos, b: KernelQos): KernelQos {
  const byName = new Map([...a.links, ...b.links].map((l) => [l.name, l]));
  const read = new Set([...b.devices.keys(), ...b.ingress.keys()]);
  return {
    links: [...byName.values()],
    qdiscs: [...a.qdiscs.filter((q) => !read.has(q.dev)), ...b.qdiscs],
    devices: new Map([...a.devices, ...b.devices]),
    ingress: new Map([...a.ingress, ...b.ingress]),
  };
}

/** A full sync's read: the qdiscs of the devices it did not read come from the listing of every qdisc. */
function withQdiscsOf(k: KernelQos, all: readonly TcQdisc[]): KernelQos {
  const read = new Set([...k.devices.keys(), ...k.ingress.keys()]);
  return { ...k, qdiscs: [...k.qdiscs, ...all.filter((q) => !read.has(q.dev))] };
}

/** The tool's complaint without the `Warning:` lines tc adds (e.g. htb quantum advice). */
function errorText(r: ExecResult): string {
  const lines = `${r.stderr}\n${r.stdout}`
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('Warning:'));
  return lines.slice(0, 3).join('; ') || `exit ${r.exitCode}`;
}

/** What of a state the QoS part renders (settle compares these). */
interface QosOf {
  readonly ext: string;
  readonly eipQos: DesiredState['eipQos'];
  readonly qos: DesiredState['qos'];
}

const qosOf = (s: DesiredState): QosOf => ({ ext: qosUplinksKey(s), eipQos: s.eipQos, qos: s.qos });

/** What decides the EIP rules' devices: the primary, and with several uplinks each EIP's. */
function qosUplinksKey(s: DesiredState): string {
  if (!hasSecondaryUplinks(s.interfaces)) return s.interfaces.ext;
  const of = eipUplinkOf(s);
  return JSON.stringify([uplinkNames(s.interfaces), s.eipQos.map((q) => of(q.ip))]);
}

const sameQos = (a: QosOf, b: QosOf): boolean =>
  a.ext === b.ext &&
  (a.eipQos === b.eipQos || JSON.stringify(a.eipQos) === JSON.stringify(b.eipQos)) &&
  (a.qos === b.qos || JSON.stringify(a.qos) === JSON.stringify(b.qos));

const mergePieces = (a: readonly QosPiece[], b: readonly QosPiece[]): QosPiece[] => [...new Map([...a, ...b].map((p) => [pieceKey(p), p])).values()];

/** The record on disk; an entry that is not one natgw writes (an edited file) is dropped, never acted on. */
const intentSchema = z.object({ pieces: z.array(z.unknown()) });

function parseIntent(raw: unknown): QosIntent {
  return {
    pieces: intentSchema.parse(raw).pieces.flatMap((p) => {
      const piece = qosPieceSchema.safeParse(p);
      return piece.success ? [piece.data] : [];
    }),
  };
}

/**
 * PURE: the devices whose classes and filters differ between two states' rules. Undefined
 * where EXT itself changed (every EIP rule moves): a partial sync then reads every device.
 */
export function changedDevices(from: DesiredState, want: DesiredState): Set<string> | undefined {
  if (qosUplinksKey(from) !== qosUplinksKey(want)) return undefined;
  const rules = (s: DesiredState) => {
    const extOf = eipUplinkOf(s);
    return new Map<string, { dev: string; text: string }>([
      ...s.eipQos.map((q) => [`eip ${eipQosKey(q)}`, { dev: eipQosDevice(q, extOf(q.ip)), text: JSON.stringify(q) }] as const),
      ...s.qos.map((q) => [`gw ${gwQosKey(q)}`, { dev: gwQosDevice(q), text: JSON.stringify(q) }] as const),
    ]);
  };
  const [a, b] = [rules(from), rules(want)];
  const devs = new Set<string>();
  for (const [x, y] of [
    [a, b],
    [b, a],
  ] as const) {
    for (const [key, r] of x) if (y.get(key)?.text !== r.text) devs.add(r.dev);
  }
  return devs;
}
