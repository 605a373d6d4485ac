import { z } from 'zod';
import type { Logger } from 'pino';
import { SystemError } from '../../model/errors.js';
import { type EipQos, type GwQos, eipQosDevice, gwQosDevice, ifbName } from '../../model/qos.js';
import { ExecError, type Executor, type ExecResult } from '../../system/exec.js';
import { allocateQos } from '../../state/qosOperations.js';
import type { DesiredState } from '../../state/state.js';
import { type ProbeResult, describe, probeDeviceName, probeQosFeatures } from './probe.js';
import {
  type DeviceTc,
  type FilterMatch,
  type TcClass,
  type TcFilter,
  type TcLink,
  type TcQdisc,
  expectedTicks,
  matchKey,
  parseClasses,
  parseFilters,
  parseLinks,
  parseQdiscs,
  rateBytesOf,
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
  ingressDevicesOf,
  pieceKey,
  qosPieceSchema,
  renderQos,
  tcBatchScript,
} from './render.js';
import type { SyncOptions } from '../netfilter/backend.js';
import { RecordFile } from '../../state/recordFile.js';

/**
 * Makes the kernel hold exactly the QoS of the desired state (SPEC §2 QoS), and reads
 * natgw's QoS back from the kernel where the state file is gone (SPEC §3.4). Reads with
 * tc/ip, renders a plan (pure, render.ts) and applies it with one `tc -batch -`.
 * Devices that do not exist are skipped while the rest is applied, then reported.
 */

/** `dryRun`: render, change nothing. `mode`: see SyncOptions (partial trusts the view of the last apply). */
export type QosSyncOptions = SyncOptions;

/**
 * What natgw trusts the kernel to hold: the read-back form (KernelQos) as of the last read or
 * successful apply, plus what a read-back does not show but a plan needs (see qosViewAfter).
 */
export interface QosView {
  readonly kernel: KernelQos;
  /**
   * Per device, the id the kernel's cyclic allocator tries next for a new u32 priority's hash
   * table (its `fh 8xx:`). Known only from a block natgw saw start empty.
   */
  readonly htidCursors: ReadonlyMap<string, number>;
}

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
  private trusted: QosView | undefined;
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

  async sync(state: DesiredState, opts: QosSyncOptions = {}): Promise<QosSyncResult> {
    const ext = state.interfaces.ext;
    const pending = (await this.intentRecord()).pieces;
    // Which devices the rules name (ids not needed for that), plus those natgw shaped before.
    const ruleDevices = new Set<string>([...state.eipQos.map((q) => eipQosDevice(q, ext)), ...state.qos.map((q) => gwQosDevice(q))]);
    const ingressOf = new Set<string>([
      ...state.eipQos.filter((q) => q.direction === 'ingress').map(() => ext),
      ...state.qos.filter((q) => q.direction === 'ingress').map((q) => q.dev),
    ]);
    // The redirects an interrupted change may have left are read too, to be removed.
    for (const dev of ingressDevicesOf(pending)) ingressOf.add(dev);
    const kept =
      opts.mode === 'partial' && pending.length === 0 && this.trusted && covers(this.trusted.kernel, ruleDevices, ingressOf) ? this.trusted : undefined;
    let view = kept ?? { kernel: await this.readKernel(ruleDevices, ingressOf), htidCursors: new Map<string, number>() };

    let desired = this.layout(state, view.kernel);
    const notes: string[] = [];
    const needs = [...desired.values()].some((d) => d.classes.length > 0);
    const features = needs ? await this.features(notes, opts.dryRun === true) : { fqCodel: false, matchall: false };
    let plan = renderQos(desired, view.kernel, features, pending);
    if (kept && plan.tc.some(namesUnknownTable)) {
      // The plan must name a u32 table whose id the kernel chose after the view was read.
      this.log?.debug('qos view lacks a u32 table id; reading back');
      view = { kernel: await this.readKernel(ruleDevices, ingressOf), htidCursors: new Map<string, number>() };
      desired = this.layout(state, view.kernel);
      plan = renderQos(desired, view.kernel, features, pending);
    }
    notes.push(...plan.notes);
    for (const n of plan.notes) this.log?.info({ note: n }, 'qos');

    const ipAfter = plan.ipAfter ?? [];
    const commands = [...plan.ip.map((a) => `ip ${a.join(' ')}`), ...plan.tc.map((l) => `tc ${l}`), ...ipAfter.map((a) => `ip ${a.join(' ')}`)];
    const changes = plan.ip.length + plan.tc.length + ipAfter.length;
    if (!opts.dryRun) {
      this.syncedTo = undefined;
      try {
        // Intent first: what this change creates joins what earlier unsettled changes did.
        const creates = plan.creates ?? [];
        if (creates.length > 0) await this.writeIntent({ pieces: mergePieces((await this.intentRecord()).pieces, creates) });
        await this.apply(plan);
      } catch (err) {
        this.forget();
        throw err;
      }
      if (plan.missing.length === 0) this.syncedTo = qosOf(state);
      // A device asked for but missing may appear any moment: read again rather than trust its absence.
      this.trusted = plan.missing.length === 0 ? qosViewAfter(view, plan) : undefined;
    }
    if (changes > 0) this.log?.info({ changes, dryRun: opts.dryRun === true, partial: kept !== undefined }, 'qos sync');
    if (plan.missing.length > 0) {
      const msg = `Error: QoS device${plan.missing.length > 1 ? 's' : ''} not found: ${plan.missing.join(', ')}`;
      if (!opts.dryRun) throw new SystemError(msg);
      notes.push(msg);
    }
    return { changes, notes, commands };
  }

  /** Stop trusting the kept view (a link event, a failure elsewhere): the next sync reads. */
  forget(): void {
    this.trusted = undefined;
  }

  /** The intent record; a missing one owes nothing, an unreadable one cannot be acted on (logged, then replaced). */
  private async intentRecord(): Promise<QosIntent> {
    return (await this.intent?.read()) ?? { pieces: [] };
  }

  /** Durable before the kernel changes, and re-read by the next process after a crash. */
  private async writeIntent(rec: QosIntent): Promise<void> {
    await this.intent?.write(rec);
  }

  /** Rules without ids (a state written through the API, or adopted) first take the ids the kernel already uses for them. */
  private layout(state: DesiredState, kernel: KernelQos): Map<string, DesiredDevice> {
    const ext = state.interfaces.ext;
    const missingIds = [...state.eipQos, ...state.qos].some((q) => q.classId === undefined || q.handle === undefined);
    const hints = missingIds ? rulesFromKernel(ext, [...new Set([ext, ...state.qos.map((q) => q.dev)])], kernel.devices) : {};
    const allocated = allocateQos(state, hints);
    return desiredDevices(ext, allocated.eipQos, allocated.qos);
  }

  private async readKernel(ruleDevices: ReadonlySet<string>, ingressOf: ReadonlySet<string>): Promise<KernelQos> {
    const base = await this.readBase();
    return this.readDevices(base, [...ruleDevices, ...shapedDevices(base.qdiscs).map((s) => s.dev)], [...ingressOf]);
  }

  /**
   * natgw's QoS rules as the kernel holds them, with their class ids and handles: EIP
   * rules from EXT and ifb-EXT, gateway rules from `devs`, EXT and every device that
   * carries natgw's layout (root htb 1: with default class 0x9999).
   */
  async readBack(extIf: string, devs: string[]): Promise<{ eipQos: EipQos[]; qos: GwQos[] }> {
    const base = await this.readBase();
    const discovered = shapedDevices(base.qdiscs).map((s) => s.servesIngressOf ?? s.dev);
    const gwDevs = [...new Set([extIf, ...devs, ...discovered])];
    const kernel = await this.readDevices(base, [...gwDevs, ...gwDevs.map(ifbName)], []);
    return rulesFromKernel(extIf, gwDevs, kernel.devices);
  }

  // ---------------------------------------------------------------------------------

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

  private async readBase(): Promise<Pick<KernelQos, 'links' | 'qdiscs'>> {
    // Strict: reading "no qdiscs" by mistake would make natgw replace roots it already owns.
    const [links, qdiscs] = await Promise.all([this.readStrict('ip', ['-j', 'link', 'show']), this.readStrict('tc', ['qdisc', 'show'])]);
    return { links: parseLinks(links), qdiscs: parseQdiscs(qdiscs) };
  }

  private async readDevices(base: Pick<KernelQos, 'links' | 'qdiscs'>, shaped: string[], ingressOf: string[]): Promise<KernelQos> {
    const exists = new Set(base.links.map((l) => l.name));
    const devices = new Map<string, DeviceTc>();
    const ingress = new Map<string, readonly TcFilter[]>();
    await Promise.all([
      ...[...new Set(shaped)]
        .filter((d) => exists.has(d))
        .map(async (dev) => {
          const [classes, filters] = await Promise.all([
            this.read('tc', ['-d', '-raw', 'class', 'show', 'dev', dev]),
            this.read('tc', ['filter', 'show', 'dev', dev, 'parent', '1:']),
          ]);
          devices.set(dev, { classes: parseClasses(classes), filters: parseFilters(filters) });
        }),
      ...[...new Set(ingressOf)]
        .filter((d) => base.qdiscs.some((q) => q.dev === d && q.handle === 'ffff:'))
        .map(async (dev) => {
          ingress.set(dev, parseFilters(await this.read('tc', ['filter', 'show', 'dev', dev, 'parent', 'ffff:'])));
        }),
    ]);
    return { ...base, devices, ingress };
  }

  private async readStrict(file: string, args: string[]): Promise<string> {
    const r = await this.exec.run({ file, args, timeoutMs: READ_TIMEOUT_MS });
    if (r.exitCode !== 0) throw new ExecError({ ...r, stderr: errorText(r) }, 'the QoS listing');
    return r.stdout;
  }

  /** A read that fails (a device gone meanwhile, no such parent) reads as empty. */
  private async read(file: string, args: string[]): Promise<string> {
    const r = await this.exec.run({ file, args, timeoutMs: READ_TIMEOUT_MS });
    if (r.exitCode !== 0) {
      this.log?.debug({ cmd: r.command, exitCode: r.exitCode, stderr: r.stderr }, 'qos read failed');
      return '';
    }
    return r.stdout;
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

/** What of a state the QoS part renders (settle compares these). */
interface QosOf {
  readonly ext: string;
  readonly eipQos: DesiredState['eipQos'];
  readonly qos: DesiredState['qos'];
}

const qosOf = (s: DesiredState): QosOf => ({ ext: s.interfaces.ext, eipQos: s.eipQos, qos: s.qos });

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

// ---------------------------------------------------------------------------------
// The view after a plan (PURE)
// ---------------------------------------------------------------------------------

/**
 * u32's first table on a qdisc is 800:; every later one takes 800 + the next free id of a
 * cyclic allocator (1..0x7fe) that lives as long as the qdisc has u32 priorities. Where that
 * allocator's position is not known, a new table's id is not either: UNKNOWN_HTID, which
 * renders as `?` in a handle, so a plan that needs it is rendered again from a read-back.
 */
const FIRST_HTID = 0x800;
const LAST_HTID_ID = 0x7fe;
const UNKNOWN_HTID = -1;

const namesUnknownTable = (line: string): boolean => / handle \?/.test(line);

/** Whether a partial sync can plan from `kernel`: every device a full sync would read was read. */
function covers(kernel: KernelQos, ruleDevices: ReadonlySet<string>, ingressOf: ReadonlySet<string>): boolean {
  const exists = new Set(kernel.links.map((l) => l.name));
  const shaped = new Set([...ruleDevices, ...shapedDevices(kernel.qdiscs).map((s) => s.dev)]);
  // renderQos reads a device's classes and filters only under a root htb 1:.
  const htbRoot = (dev: string) => kernel.qdiscs.some((q) => q.dev === dev && q.parent === 'root' && q.kind === 'htb' && q.handle === '1:');
  for (const dev of shaped) if (exists.has(dev) && htbRoot(dev) && !kernel.devices.has(dev)) return false;
  for (const dev of ingressOf) if (kernel.qdiscs.some((q) => q.dev === dev && q.handle === 'ffff:') && !kernel.ingress.has(dev)) return false;
  return true;
}

/**
 * htb lists its classes bucket by bucket of a hash of the class id, newest first within a
 * bucket; the table starts with 4 buckets and doubles (re-inserting bucket by bucket) once more
 * than 3/4 full, never shrinking. The plan deletes stale classes in listing order, so the view
 * keeps that order.
 */
const classHash = (minor: number, size: number): number => {
  let id = 0x10000 | minor;
  id ^= id >>> 8;
  id ^= id >>> 4;
  return id & (size - 1);
};

interface ClassTable {
  size: number;
  count: number;
  buckets: TcClass[][];
}

const isOurClass = (c: TcClass): boolean => c.major === 1;

/**
 * The table behind a listing: the smallest size that holds this many classes and lists them in
 * this order (a larger table left by classes since deleted may list them the same way; then
 * only the order of later deletes can differ from the kernel's).
 */
function classTableOf(classes: readonly TcClass[]): ClassTable {
  const ours = classes.filter(isOurClass);
  let size = 4;
  while (ours.length * 4 > size * 3) size *= 2;
  const ordered = (n: number) => ours.every((c, i) => i === 0 || classHash(ours[i - 1]!.minor, n) <= classHash(c.minor, n));
  for (let n = size; n <= 0x10000; n *= 2) {
    if (ordered(n)) {
      size = n;
      break;
    }
  }
  const buckets: TcClass[][] = Array.from({ length: size }, () => []);
  for (const c of ours) buckets[classHash(c.minor, size)]!.push(c);
  return { size, count: ours.length, buckets };
}

function insertClass(t: ClassTable, c: TcClass): void {
  t.buckets[classHash(c.minor, t.size)]!.unshift(c);
  t.count++;
  if (t.count * 4 <= t.size * 3) return;
  const size = t.size * 2;
  const buckets: TcClass[][] = Array.from({ length: size }, () => []);
  for (const b of t.buckets) for (const x of b) buckets[classHash(x.minor, size)]!.unshift(x);
  t.size = size;
  t.buckets = buckets;
}

interface DeviceModel {
  filters: TcFilter[];
  /** Classes natgw does not write (another major), listed after its own. */
  others: TcClass[];
  classes: ClassTable;
}

interface Model {
  links: TcLink[];
  qdiscs: TcQdisc[];
  devices: Map<string, DeviceModel>;
  ingress: Map<string, TcFilter[]>;
  cursors: Map<string, number>;
}

const freshDevice = (): DeviceModel => ({ filters: [], others: [], classes: { size: 4, count: 0, buckets: [[], [], [], []] } });

/**
 * PURE: what a read-back would find once `plan` ran on what `view` holds, in read-back form and
 * listing order (so a plan against it equals one against a fresh read). Undefined for a command
 * it does not model: the caller then trusts nothing.
 */
export function qosViewAfter(view: QosView, plan: QosPlan): QosView | undefined {
  // Removing a shared piece is rare (after an interrupted change): the next sync reads instead.
  if ((plan.ipAfter?.length ?? 0) > 0) return undefined;
  const k = view.kernel;
  const m: Model = {
    links: [...k.links],
    qdiscs: [...k.qdiscs],
    devices: new Map(
      [...k.devices].map(([d, t]) => [d, { filters: [...t.filters], others: t.classes.filter((c) => !isOurClass(c)), classes: classTableOf(t.classes) }]),
    ),
    ingress: new Map([...k.ingress].map(([d, f]) => [d, [...f]])),
    cursors: new Map(view.htidCursors),
  };
  for (const args of plan.ip) if (!applyIp(m, args)) return undefined;
  for (const line of plan.tc) if (!applyTc(m, line.split(' '))) return undefined;
  const devices = new Map<string, DeviceTc>([...m.devices].map(([d, t]) => [d, { classes: [...t.classes.buckets.flat(), ...t.others], filters: t.filters }]));
  return { kernel: { links: m.links, qdiscs: m.qdiscs, devices, ingress: m.ingress }, htidCursors: m.cursors };
}

function applyIp(m: Model, args: readonly string[]): boolean {
  const [obj, verb] = args;
  if (obj === 'link' && verb === 'add' && args[2] !== undefined) {
    m.links.push({ name: args[2], up: false });
    return true;
  }
  if (obj === 'link' && verb === 'set' && args.at(-1) === 'up') {
    const dev = valueAfter(args, 'dev');
    m.links = m.links.map((l) => (l.name === dev ? { ...l, up: true } : l));
    return true;
  }
  return false;
}

const valueAfter = (t: readonly string[], key: string): string | undefined => {
  const i = t.indexOf(key);
  return i < 0 ? undefined : t[i + 1];
};

/** `1:0x1d3a` → 0x1d3a. */
const minorOf = (classid: string | undefined): number => Number(classid?.split(':')[1] ?? NaN);

function applyTc(m: Model, t: readonly string[]): boolean {
  const dev = valueAfter(t, 'dev');
  if (dev === undefined) return false;
  const device = (): DeviceModel => {
    let d = m.devices.get(dev);
    if (!d) m.devices.set(dev, (d = freshDevice()));
    return d;
  };
  switch (`${t[0]} ${t[1]}`) {
    case 'qdisc replace':
      if (t.includes('root')) {
        // The old root takes its classes, leaves and filters with it; the ingress qdisc stays.
        m.qdiscs = [...m.qdiscs.filter((q) => q.dev !== dev || q.handle === 'ffff:'), htbRoot(dev, t)];
        m.devices.set(dev, freshDevice());
        m.cursors.delete(dev);
        return true;
      }
      if (t.at(-1) === 'fq_codel') {
        const parent = `1:${minorOf(valueAfter(t, 'parent')).toString(16)}`;
        m.qdiscs = [...m.qdiscs.filter((q) => q.dev !== dev || q.parent !== parent), { dev, kind: 'fq_codel', handle: '0:', parent }];
        return true;
      }
      return false;
    case 'qdisc change':
      m.qdiscs = m.qdiscs.map((q) => (q.dev === dev && q.parent === 'root' ? htbRoot(dev, t) : q));
      return true;
    case 'qdisc add':
      if (t.at(-1) !== 'ingress') return false;
      m.qdiscs.push({ dev, kind: 'ingress', handle: 'ffff:', parent: 'ffff:fff1' });
      m.ingress.set(dev, []);
      return true;
    case 'class add': {
      const table = device().classes;
      if (table.buckets.flat().some((c) => c.minor === minorOf(valueAfter(t, 'classid')))) return false;
      insertClass(table, htbClass(t));
      return true;
    }
    case 'class change': {
      const c = htbClass(t);
      const table = device().classes;
      table.buckets = table.buckets.map((b) => b.map((x) => (x.minor === c.minor ? c : x)));
      return true;
    }
    case 'class del': {
      const minor = minorOf(valueAfter(t, 'classid'));
      const table = device().classes;
      table.buckets = table.buckets.map((b) => b.filter((x) => x.minor !== minor));
      table.count = table.buckets.flat().length;
      m.qdiscs = m.qdiscs.filter((q) => q.dev !== dev || q.parent !== `1:${minor.toString(16)}`);
      return true;
    }
    case 'filter add':
      if (valueAfter(t, 'parent') === 'ffff:') return addRedirect(m, dev, t);
      return addFilter(m, dev, device(), t);
    case 'filter replace': {
      const d = device();
      const fh = valueAfter(t, 'handle');
      const pref = Number(valueAfter(t, 'prio'));
      const flowid = { major: 1, minor: minorOf(valueAfter(t, 'flowid')) };
      d.filters = d.filters.map((f) => (f.pref === pref && f.fh === fh && !f.isTable ? { ...f, flowid } : f));
      return true;
    }
    case 'filter del':
      return delFilter(m, dev, device(), t);
    default:
      return false;
  }
}

function htbRoot(dev: string, t: readonly string[]): TcQdisc {
  return { dev, kind: 'htb', handle: '1:', parent: 'root', defaultMinor: Number(valueAfter(t, 'default')) };
}

/** The class as `tc -d -raw class show` reads back: rates in bits, bursts as tc programs them. */
function htbClass(t: readonly string[]): TcClass {
  const mbit = (valueAfter(t, 'rate') ?? '').replace(/mbit$/, '');
  const rateBytes = rateBytesOf(mbit);
  const burst = valueAfter(t, 'burst');
  const bytes = burst === undefined ? undefined : Number(burst);
  const ticks = bytes === undefined ? undefined : expectedTicks(rateBytes, bytes);
  return {
    kind: 'htb',
    major: 1,
    minor: minorOf(valueAfter(t, 'classid')),
    parent: 'root',
    rateBits: rateBytes * 8,
    ceilBits: rateBytes * 8,
    ...(bytes !== undefined && ticks !== undefined ? { burstBytes: bytes, cburstBytes: bytes, bufferTicks: ticks, cbufferTicks: ticks } : {}),
  };
}

const isU32Table = (f: TcFilter): boolean => f.kind === 'u32' && f.isTable === true;
const htidText = (htid: number): string => (htid === UNKNOWN_HTID ? '?' : htid.toString(16));

/** The id the kernel gives the table of a new u32 priority on `dev`. */
function newHtid(m: Model, dev: string, filters: readonly TcFilter[]): number {
  const tables = filters.filter(isU32Table);
  if (tables.length === 0) {
    m.cursors.set(dev, 1);
    return FIRST_HTID;
  }
  const cursor = m.cursors.get(dev);
  if (cursor === undefined || tables.some((f) => f.htid === UNKNOWN_HTID)) return UNKNOWN_HTID;
  const used = new Set(tables.map((f) => (f.htid ?? 0) - FIRST_HTID));
  const free = (from: number): number | undefined => {
    for (let id = from; id <= LAST_HTID_ID; id++) if (!used.has(id)) return id;
    return undefined;
  };
  const id = free(Math.max(cursor, 1)) ?? free(1);
  if (id === undefined) {
    m.cursors.delete(dev);
    return UNKNOWN_HTID;
  }
  m.cursors.set(dev, id + 1);
  return FIRST_HTID + id;
}

/** tc's listing order: by priority; in a priority its header, its table, then nodes by id (u32 keeps a bucket sorted). */
const listingOrder = (fs: TcFilter[]): TcFilter[] => {
  const rank = (f: TcFilter): number => (f.fh === undefined ? -2 : f.isTable ? -1 : (f.node ?? 0));
  return fs.sort((a, b) => a.pref - b.pref || rank(a) - rank(b));
};

function addFilter(m: Model, dev: string, d: DeviceModel, t: readonly string[]): boolean {
  const pref = Number(valueAfter(t, 'prio'));
  const protocol = valueAfter(t, 'protocol') ?? 'ip';
  const handle = valueAfter(t, 'handle') ?? '';
  const kind = t[t.indexOf('handle') + 2];
  const flowid = { major: 1, minor: minorOf(valueAfter(t, 'flowid')) };
  const header: TcFilter = { protocol, pref, kind: kind ?? '', keys: [] };
  const prio = d.filters.filter((f) => f.pref === pref);
  if (kind === 'matchall') {
    if (prio.length > 0) return false;
    d.filters = listingOrder([...d.filters, header, { protocol, pref, kind, fh: handle, node: Number(handle), flowid, keys: [] }]);
    return true;
  }
  if (kind !== 'u32' || !handle.startsWith('::')) return false;
  const match = matchOf(t);
  if (!match) return false;
  const added: TcFilter[] = [];
  let htid = prio.find(isU32Table)?.htid;
  if (htid === undefined) {
    if (prio.length > 0) return false;
    htid = newHtid(m, dev, d.filters);
    added.push(header, { protocol, pref, kind, fh: `${htidText(htid)}:`, htid, isTable: true, keys: [] });
  }
  const node = Number(handle.slice(2));
  added.push({ protocol, pref, kind, fh: `${htidText(htid)}::${node.toString(16)}`, htid, node, flowid, keys: [matchKey(match)] });
  d.filters = listingOrder([...d.filters, ...added]);
  return true;
}

function matchOf(t: readonly string[]): FilterMatch | undefined {
  const i = t.indexOf('match');
  if (t[i + 1] === 'u32' && t[i + 2] === '0' && t[i + 3] === '0') return { kind: 'all' };
  const dir = t[i + 2];
  const cidr = t[i + 3];
  if (t[i + 1] !== 'ip' || (dir !== 'src' && dir !== 'dst') || cidr === undefined) return undefined;
  return { kind: 'ip', dir, cidr };
}

/**
 * A whole priority (`prio P`), or one node (`… handle FH kind`). Deleting the last node of the
 * only u32 priority on a qdisc takes the priority with it (u32's `last`): the next table is 800: again.
 */
function delFilter(m: Model, dev: string, d: DeviceModel, t: readonly string[]): boolean {
  const pref = Number(valueAfter(t, 'prio'));
  const fh = valueAfter(t, 'handle');
  if (fh === undefined) {
    d.filters = d.filters.filter((f) => f.pref !== pref);
  } else {
    const kind = t.at(-1);
    d.filters = d.filters.filter((f) => !(f.pref === pref && f.fh === fh && !f.isTable));
    const u32Prios = new Set(d.filters.filter(isU32Table).map((f) => f.pref));
    const u32Nodes = d.filters.filter((f) => f.kind === 'u32' && f.fh !== undefined && !f.isTable).length;
    if (kind === 'matchall' || (kind === 'u32' && u32Prios.size === 1 && u32Prios.has(pref) && u32Nodes === 0)) {
      d.filters = d.filters.filter((f) => f.pref !== pref);
    }
  }
  if (!d.filters.some(isU32Table)) m.cursors.delete(dev);
  return true;
}

/** The ingress redirect into the IFB, as read back under `parent ffff:`. */
function addRedirect(m: Model, dev: string, t: readonly string[]): boolean {
  const ifb = t.at(-1);
  const pref = Number(valueAfter(t, 'prio'));
  if (ifb === undefined || t.includes('handle')) return false;
  const protocol = valueAfter(t, 'protocol') ?? 'all';
  const have = m.ingress.get(dev) ?? [];
  const table = have.find((f) => f.pref === pref && isU32Table(f));
  const fresh = !have.some(isU32Table);
  const htid = table?.htid ?? (fresh ? FIRST_HTID : UNKNOWN_HTID);
  const added: TcFilter[] = table
    ? []
    : [
        { protocol, pref, kind: 'u32', keys: [] },
        { protocol, pref, kind: 'u32', fh: `${htidText(htid)}:`, htid, isTable: true, keys: [] },
      ];
  // The kernel numbers the node (800 in a new table); nothing natgw renders names it.
  const node = table ? '?' : '800';
  added.push({
    protocol,
    pref,
    kind: 'u32',
    fh: `${htidText(htid)}::${node}`,
    htid,
    ...(table ? {} : { node: 0x800 }),
    keys: [matchKey({ kind: 'all' })],
    redirectTo: ifb,
  });
  m.ingress.set(dev, listingOrder([...have, ...added]));
  return true;
}
