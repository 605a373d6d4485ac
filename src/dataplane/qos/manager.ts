import { z } from 'zod';
import type { Logger } from 'pino';
import { SystemError } from '../../model/errors.js';
import { type EipQos, type GwQos, IFB_PREFIX, ifbName, qosDevice } from '../../model/qos.js';
import { isInterfaceName } from '../../model/net.js';
import { ExecError, type Executor, type ExecRequest, type ExecResult } from '../../system/exec.js';
import { allocateQos } from '../../state/qosOperations.js';
import type { DesiredState } from '../../state/state.js';
import { type ProbeResult, describe, probeDeviceName, probeQosFeatures } from './probe.js';
import { deviceListingScript, parseDeviceListing, parseLinks, parseQdiscs, rulesFromKernel, shapedDevices } from './readback.js';
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
} from './render.js';
import type { SyncOptions } from '../netfilter/backend.js';
import { RecordFile } from '../../state/recordFile.js';
import { eipUplinkOf, hasSecondaryUplinks, uplinkNames } from '../../model/uplinks.js';

/**
 * Makes the kernel hold exactly the QoS of the desired state (SPEC §2 QoS), and reads
 * natgw's QoS back from the kernel where the state file is gone (SPEC §3.4). Every sync, full
 * or partial, reads with tc what it plans against (the devices its rules name and every device
 * natgw shapes), renders a plan (pure, render.ts) and applies it with one `tc -batch -`. Devices
 * that do not exist are skipped while the rest is applied, then reported.
 */

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
interface QosIntent {
  readonly pieces: readonly QosPiece[];
}

export class QosManager {
  private probe: Promise<ProbeResult> | undefined;
  /** The durable intent record (see RecordFile for when it is read again). */
  private readonly intent: RecordFile<QosIntent> | undefined;
  /** The QoS the kernel was last synced to by this process (what settle compares with). */
  private syncedTo: string | undefined;

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
    if (this.syncedTo === qosOf(state) && (await this.hasPending())) await this.intent?.write({ pieces: [] });
  }

  /** `opts.mode` is only logged: QoS reads the kernel in a partial sync as in a full one. */
  async sync(state: DesiredState, opts: SyncOptions = {}): Promise<QosSyncResult> {
    const pending = (await this.intentRecord()).pieces;
    const extOf = eipUplinkOf(state);
    // The devices of the rules, those whose ingress they shape, and those an interrupted change left pieces on.
    const kernel = await this.readKernel([
      ...state.eipQos.flatMap((q) => [qosDevice(q.direction, extOf(q.ip)), extOf(q.ip)]),
      ...state.qos.flatMap((q) => [qosDevice(q.direction, q.dev), q.dev]),
      ...pending.map((p) => p.dev),
    ]);
    const desired = this.layout(state, kernel);
    const notes: string[] = [];
    const features = desired.size > 0 ? await this.features(notes, opts.dryRun === true) : { fqCodel: false, matchall: false };
    const plan = renderQos(desired, kernel, features, pending);
    notes.push(...plan.notes);
    for (const n of plan.notes) this.log?.info({ note: n }, 'qos');

    const commands = [...plan.ip.map((a) => `ip ${a.join(' ')}`), ...plan.tc.map((l) => `tc ${l}`), ...plan.ipAfter.map((a) => `ip ${a.join(' ')}`)];
    const changes = commands.length;
    if (!opts.dryRun) {
      this.syncedTo = undefined;
      // Intent first: what this change creates joins what earlier unsettled changes did.
      if (plan.creates.length > 0) await this.intent?.write({ pieces: mergePieces((await this.intentRecord()).pieces, plan.creates) });
      await this.apply(plan);
      if (plan.missing.length === 0) this.syncedTo = qosOf(state);
    }
    if (changes > 0) this.log?.info({ changes, dryRun: opts.dryRun === true, partial: opts.mode === 'partial' }, 'qos sync');
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

  /**
   * The classes and filters each device must hold. Rules without ids (a state written without
   * them) first take the ids the kernel already uses for them (the rest keep their own).
   */
  private layout(state: DesiredState, kernel: KernelQos): Map<string, DesiredDevice> {
    const allocated = allocateQos(
      state,
      rulesFromKernel(
        uplinkNames(state.interfaces),
        state.qos.map((q) => q.dev),
        kernel.devices,
      ),
    );
    return desiredDevices(eipUplinkOf(state), allocated.eipQos, allocated.qos);
  }

  /**
   * natgw's QoS rules as the kernel holds them, with their class ids and handles: EIP
   * rules from EXT and ifb-EXT, gateway rules from `devs`, EXT and every device that
   * carries natgw's layout (root htb 1: with default class 0x9999).
   */
  async readBack(extIf: string, devs: string[]): Promise<{ eipQos: EipQos[]; qos: GwQos[] }> {
    const named = [extIf, ...devs];
    const kernel = await this.readKernel([...named, ...named.map(ifbName)]);
    // An IFB natgw shapes names the device whose ingress it serves.
    const served = (dev: string): string => (dev.startsWith(IFB_PREFIX) && isInterfaceName(dev.slice(IFB_PREFIX.length)) ? dev.slice(IFB_PREFIX.length) : dev);
    const discovered = shapedDevices(kernel.qdiscs).map(served);
    return rulesFromKernel([extIf], [...named, ...discovered], kernel.devices);
  }

  /**
   * Probe once per manager. What was found goes into every sync's notes (so a command prints
   * the same lines whether a long-lived daemon or a one-shot run carries it out), into the log
   * once, and never to stderr.
   */
  private async features(notes: string[], dryRun: boolean): Promise<QosFeatures> {
    if (dryRun && !this.probe) {
      // A probe makes a throwaway device; a dry run changes nothing, so it assumes a production kernel.
      const assumed = { fqCodel: true, matchall: true };
      notes.push(`INFO: QoS kernel features not probed in a dry run; assuming ${describe(assumed)}`);
      return assumed;
    }
    this.probe ??= this.runProbe().catch((e: unknown) => {
      // The record could not be written (a full state dir): the next sync tries again.
      this.probe = undefined;
      throw e;
    });
    const r = await this.probe;
    notes.push(r.summary);
    return r.features;
  }

  private async runProbe(): Promise<ProbeResult> {
    const name = probeDeviceName();
    // A kill while the throwaway device exists must not leave it behind: it is intent too.
    await this.intent?.write({ pieces: mergePieces((await this.intentRecord()).pieces, [{ kind: 'ifb', dev: name }]) });
    const r = await probeQosFeatures(this.exec, name);
    this.out?.(r.summary);
    this.log?.info({ ...r.features, summary: r.summary }, 'qos kernel probe');
    return r;
  }

  /** The IFB devices, then the tc script, then the IFB devices no rule needs; the first refusal stops the rest. */
  private async apply(plan: QosPlan): Promise<void> {
    const ip = (args: readonly string[]) => this.run({ file: 'ip', args, timeoutMs: APPLY_TIMEOUT_MS }, 'the QoS device change');
    for (const args of plan.ip) await ip(args);
    if (plan.tc.length > 0)
      await this.run({ file: 'tc', args: ['-batch', '-'], input: `${plan.tc.join('\n')}\n`, timeoutMs: APPLY_TIMEOUT_MS }, 'the QoS change');
    for (const args of plan.ipAfter) await ip(args);
  }

  /**
   * What a plan needs: every link (which devices exist, an IFB's state), every qdisc, and one
   * `tc -d -raw -batch -` (deviceListingScript) per existing device among `devices` and those
   * that carry natgw's layout. Strict: planning from a failed read (say, "no qdiscs" by
   * mistake) would replace what natgw owns.
   */
  private async readKernel(devices: readonly string[]): Promise<KernelQos> {
    const [links, qdiscs] = await Promise.all([
      this.run({ file: 'ip', args: ['-j', 'link', 'show'], timeoutMs: READ_TIMEOUT_MS }, 'the QoS listing').then(parseLinks),
      this.run({ file: 'tc', args: ['qdisc', 'show'], timeoutMs: READ_TIMEOUT_MS }, 'the QoS listing').then(parseQdiscs),
    ]);
    const withIngress = new Set(qdiscs.filter((q) => q.handle === 'ffff:').map((q) => q.dev));
    const read = [...new Set([...devices, ...shapedDevices(qdiscs)])].filter((dev) => links.has(dev));
    const listings = await Promise.all(
      read.map(async (dev) => {
        const listing = { file: 'tc', args: ['-d', '-raw', '-batch', '-'], input: deviceListingScript(dev, withIngress.has(dev)), timeoutMs: READ_TIMEOUT_MS };
        return [dev, parseDeviceListing(await this.run(listing, `the QoS listing of ${dev}`))] as const;
      }),
    );
    return { links, qdiscs, devices: new Map(listings) };
  }

  /** One tool run; a refusal is an ExecError with the tool's complaint, its script kept for the log. */
  private async run(req: ExecRequest, action: string): Promise<string> {
    const r = await this.exec.run(req);
    if (r.exitCode === 0) return r.stdout;
    this.log?.warn({ command: r.command, script: req.input, stderr: r.stderr }, `qos: ${action} refused`);
    throw new ExecError({ ...r, stderr: errorText(r) }, action, req.input);
  }
}

/** The tool's complaint without the `Warning:` lines tc adds (e.g. htb quantum advice). */
function errorText(r: ExecResult): string {
  const lines = `${r.stderr}\n${r.stdout}`
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('Warning:'));
  return lines.slice(0, 3).join('; ') || `exit ${r.exitCode}`;
}

/** What of a state the QoS part renders (settle compares these): the rules and each EIP's uplink. */
function qosOf(s: DesiredState): string {
  const of = eipUplinkOf(s);
  return JSON.stringify([s.interfaces.ext, s.eipQos, s.qos, hasSecondaryUplinks(s.interfaces) ? s.eipQos.map((q) => of(q.ip)) : []]);
}

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
