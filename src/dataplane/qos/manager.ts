import type { Logger } from 'pino';
import { SystemError } from '../../model/errors.js';
import { type EipQos, type GwQos, eipQosDevice, gwQosDevice, ifbName } from '../../model/qos.js';
import type { Executor, ExecResult } from '../../system/exec.js';
import { allocateQos } from '../../state/qosOperations.js';
import type { DesiredState } from '../../state/state.js';
import { type ProbeResult, describe, probeQosFeatures } from './probe.js';
import {
  type DeviceTc, type TcFilter, parseClasses, parseFilters, parseLinks, parseQdiscs, rulesFromKernel, shapedDevices,
} from './readback.js';
import { type KernelQos, type QosFeatures, type QosPlan, desiredDevices, renderQos, tcBatchScript } from './render.js';

/**
 * Makes the kernel hold exactly the QoS of the desired state (SPEC §2 QoS), and reads
 * natgw's QoS back from the kernel where the state file is gone (SPEC §3.4). Reads with
 * tc/ip, renders a plan (pure, render.ts) and applies it with one `tc -batch -`.
 * Devices that do not exist are skipped while the rest is applied, then reported.
 */

export interface QosSyncOptions {
  /** Read the kernel and render, but change nothing. */
  readonly dryRun?: boolean;
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

export class QosManager {
  private probe: Promise<ProbeResult> | undefined;
  private probed: ProbeResult | undefined;

  constructor(
    private readonly exec: Executor,
    private readonly log?: Logger,
    private readonly out?: (line: string) => void,
  ) {}

  async sync(state: DesiredState, opts: QosSyncOptions = {}): Promise<QosSyncResult> {
    const ext = state.interfaces.ext;
    const base = await this.readBase();

    // Which devices the rules name (ids not needed for that), plus those natgw shaped before.
    const ruleDevices = new Set<string>([
      ...state.eipQos.map((q) => eipQosDevice(q, ext)),
      ...state.qos.map((q) => gwQosDevice(q)),
    ]);
    const ingressOf = new Set<string>([
      ...state.eipQos.filter((q) => q.direction === 'ingress').map(() => ext),
      ...state.qos.filter((q) => q.direction === 'ingress').map((q) => q.dev),
    ]);
    const kernel = await this.readDevices(base, [...ruleDevices, ...shapedDevices(base.qdiscs).map((s) => s.dev)], [...ingressOf]);

    // Rules without ids (a state written through the API, or adopted) first take the ids the kernel already uses for them.
    const missingIds = [...state.eipQos, ...state.qos].some((q) => q.classId === undefined || q.handle === undefined);
    const hints = missingIds ? rulesFromKernel(ext, [...new Set([ext, ...state.qos.map((q) => q.dev)])], kernel.devices) : {};
    const allocated = allocateQos(state, hints);
    const desired = desiredDevices(ext, allocated.eipQos, allocated.qos);

    const notes: string[] = [];
    const needs = [...desired.values()].some((d) => d.classes.length > 0);
    const features = needs ? await this.features(notes, opts.dryRun === true) : { fqCodel: false, matchall: false };
    const plan = renderQos(desired, kernel, features);
    notes.push(...plan.notes);
    for (const n of plan.notes) this.log?.info({ note: n }, 'qos');

    const commands = [...plan.ip.map((a) => `ip ${a.join(' ')}`), ...plan.tc.map((l) => `tc ${l}`)];
    const changes = plan.ip.length + plan.tc.length;
    if (!opts.dryRun) await this.apply(plan);
    if (changes > 0) this.log?.info({ changes, dryRun: opts.dryRun === true }, 'qos sync');
    if (plan.missing.length > 0) {
      const msg = `Error: QoS device${plan.missing.length > 1 ? 's' : ''} not found: ${plan.missing.join(', ')}`;
      if (!opts.dryRun) throw new SystemError(msg);
      notes.push(msg);
    }
    return { changes, notes, commands };
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
      this.probe ??= probeQosFeatures(this.exec);
      const r = await this.probe;
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
    for (const args of plan.ip) {
      const r = await this.exec.run({ file: 'ip', args, timeoutMs: APPLY_TIMEOUT_MS });
      if (r.exitCode !== 0) throw new SystemError(`Error: QoS: ip ${args.join(' ')} failed: ${errorText(r)}`);
    }
    const script = tcBatchScript(plan);
    if (script === '') return;
    const r = await this.exec.run({ file: 'tc', args: ['-batch', '-'], input: script, timeoutMs: APPLY_TIMEOUT_MS });
    if (r.exitCode !== 0) {
      this.log?.warn({ script, stderr: r.stderr }, 'qos apply failed');
      throw new SystemError(`Error: QoS: tc failed: ${errorText(r)}`);
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
      ...[...new Set(shaped)].filter((d) => exists.has(d)).map(async (dev) => {
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
    if (r.exitCode !== 0) throw new SystemError(`Error: QoS: ${file} ${args.join(' ')} failed: ${errorText(r)}`);
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
  const lines = `${r.stderr}\n${r.stdout}`.split('\n').map((l) => l.trim()).filter((l) => l !== '' && !l.startsWith('Warning:'));
  return lines.slice(0, 3).join('; ') || `exit ${r.exitCode}`;
}
