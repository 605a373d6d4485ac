import { z } from 'zod';
import { ifnameSchema } from '../../model/rules.js';
import {
  type EipQos,
  type GwQos,
  DEFAULT_CLASS,
  DEFAULT_RATE_MBIT,
  REDIRECT_PRIO,
  burstBytes,
  hex,
  ifbName,
  qosDevice,
  rateBytesPerSecond,
  tcPrio,
} from '../../model/qos.js';
import {
  type DeviceListing,
  type DeviceTc,
  type FilterMatch,
  type FilterSpec,
  type TcClass,
  type TcFilter,
  type TcQdisc,
  MAX_BUFFER_USEC,
  TICKS_PER_USEC,
  classifyingFilters,
  expectedTicks,
  filterSpec,
  programmedBurstBytes,
  shapedDevices,
} from './readback.js';

/**
 * PURE: desired QoS + what the kernel holds → the commands that make the kernel hold
 * exactly the desired QoS (SPEC §2 QoS). Layout per shaped device D:
 *
 *   root htb 1: default 0x9999 ── class 1:0x9999 10000mbit (shared, never removed)
 *                              └─ class 1:0x<id> rate=ceil, burst=cburst [fq_codel leaf]
 *   filters under 1:, protocol ip, prio = the rule's priority, natgw's own u32 node ids
 *
 * and for ingress on X: `ingress` qdisc on X + u32 catch-all mirred redirect (prio 65535)
 * to `ifb-X`, which carries the layout above. Commands are ordered so traffic never sees
 * a gap: shared pieces, then classes, then new filters, and only then stale filters and
 * stale classes (a class can only go once no filter points at it).
 */

export interface QosFeatures {
  /** fq_codel leaf qdiscs are available. */
  readonly fqCodel: boolean;
  /** The matchall classifier is available; otherwise a u32 `match u32 0 0` stands in. */
  readonly matchall: boolean;
}

export interface KernelQos {
  /** Every link, by name: whether it is up. */
  readonly links: ReadonlyMap<string, boolean>;
  /** Every qdisc of the namespace (`tc qdisc show`). */
  readonly qdiscs: readonly TcQdisc[];
  /** What each device that was read holds (its ingress filters only where it has an ingress qdisc). */
  readonly devices: ReadonlyMap<string, DeviceListing>;
}

export interface QosPlan {
  /** `ip` argument arrays, run before the tc script (IFB devices). */
  readonly ip: readonly (readonly string[])[];
  /** Lines for `tc -batch -`. */
  readonly tc: readonly string[];
  readonly notes: readonly string[];
  /** Devices rules were given for that do not exist; nothing was rendered for them. */
  readonly missing: readonly string[];
  /** The shared pieces this plan creates (what the intent record lists before it runs). */
  readonly creates: readonly QosPiece[];
  /** `ip` argument arrays run after the tc script: IFB devices natgw created and no rule needs. */
  readonly ipAfter: readonly (readonly string[])[];
}

/**
 * A shared piece of natgw's layout that a plan creates where it was not there before: an htb
 * root that replaced another root, an IFB device, an ingress qdisc, the redirect from `dev`
 * into its IFB.
 * Classes and filters need no such name: under natgw's root every class and filter is natgw's,
 * and a sync removes the stale ones. A shared piece stays once a rule that needed it is
 * acknowledged (SPEC: left in place on delete), but one created by a change that never took
 * effect (failed, or a crash) is removed by the next sync of the state that was persisted.
 */
export const qosPieceSchema = z.object({ kind: z.enum(['root', 'ifb', 'ingress', 'redirect']), dev: ifnameSchema }).readonly();
export type QosPiece = z.infer<typeof qosPieceSchema>;

export const pieceKey = (p: QosPiece): string => `${p.kind} ${p.dev}`;

/** One rule as its device holds it: a class, and the filter that sends the rule's traffic there. */
interface DesiredRule {
  readonly prio: number;
  readonly handle: number;
  readonly minor: number;
  readonly rate: string;
  readonly burst: string;
  /** `all` for a matchall rule (matchall where the priority holds nothing else and the kernel has it). */
  readonly match: FilterMatch;
  /** A matchall rule in words, for its notes. */
  readonly what: string;
}

export interface DesiredDevice {
  readonly dev: string;
  /** For an IFB: the device whose ingress it shapes. */
  readonly ingressOf?: string;
  readonly rules: DesiredRule[];
}

/** Rules (with ids allocated) → the classes and filters each device must hold; `extOf` names each EIP's uplink. */
export function desiredDevices(extOf: (ip: string) => string, eipQos: readonly EipQos[], qos: readonly GwQos[]): Map<string, DesiredDevice> {
  const out = new Map<string, DesiredDevice>();
  const add = (q: EipQos | GwQos, dev: string, match: FilterMatch, what = ''): void => {
    if (q.classId === undefined || q.handle === undefined) throw new Error('QoS rule without allocated ids (run allocateQos first)');
    const at = qosDevice(q.direction, dev);
    let d = out.get(at);
    if (!d) out.set(at, (d = { dev: at, ...(q.direction === 'ingress' ? { ingressOf: dev } : {}), rules: [] }));
    d.rules.push({ prio: tcPrio(q.priority), handle: q.handle, minor: q.classId, rate: q.rate, burst: q.burst, match, what });
  };
  for (const q of eipQos) add(q, extOf(q.ip), { kind: 'ip', dir: q.direction === 'egress' ? 'src' : 'dst', cidr: `${q.ip}/32` });
  for (const q of qos) {
    if (q.classifier === 'matchall') add(q, q.dev, { kind: 'all' }, `qos ${q.direction} ${q.dev} priority ${q.priority} matchall`);
    else add(q, q.dev, { kind: 'ip', dir: q.matchDirection === 'dst' ? 'dst' : 'src', cidr: q.cidr });
  }
  return out;
}

// ---------------------------------------------------------------------------------
// Comparison with what the kernel holds
// ---------------------------------------------------------------------------------

/** tc prints rates with at least three significant digits; anything closer is the same rate. */
function rateMatches(actualBits: number | undefined, mbit: string): boolean {
  const want = rateBytesPerSecond(mbit) * 8;
  return actualBits !== undefined && Math.abs(actualBits - want) <= Math.max(8, want * 1e-3);
}

/** Buffers compare raw, in ticks (`-raw`): tc truncates a buffer to whole µs, so bursts within one µs are one buffer. */
function classMatches(c: TcClass, want: DesiredRule): boolean {
  const ticks = expectedTicks(rateBytesPerSecond(want.rate), programmedBurstBytes(want.rate, want.burst));
  const buffer = (t: number | undefined): boolean => t !== undefined && Math.abs(t - ticks) <= Math.max(TICKS_PER_USEC + 1, ticks * 1e-4);
  return c.parent === 'root' && rateMatches(c.rateBits, want.rate) && rateMatches(c.ceilBits, want.rate) && buffer(c.bufferTicks) && buffer(c.cbufferTicks);
}

const classSpec = (dev: string, minor: number, rate: string, burst?: string): string => {
  const bytes = burst === undefined ? 0 : programmedBurstBytes(rate, burst);
  const b = burst === undefined ? '' : ` burst ${bytes} cburst ${bytes}`;
  return `dev ${dev} parent 1: classid 1:${hex(minor)} htb rate ${rate}mbit ceil ${rate}mbit${b}`;
};

const matchText = (m: FilterMatch): string => (m.kind === 'all' ? 'match u32 0 0' : `match ip ${m.dir} ${m.cidr}`);

/**
 * A filter under `1:` in natgw's words (what follows `prio P`): how a filter is written, and
 * how one read back (filterSpec) is compared with what natgw wants.
 */
function filterWords(f: FilterSpec): string {
  if (f.kind === 'matchall') return `handle ${hex(f.handle)} matchall flowid 1:${hex(f.minor)}`;
  // `::<node>`: the node goes into this priority's own hash table, whatever id the kernel gave it.
  return `handle ::${hex(f.handle)} u32 ${matchText(f.match)} flowid 1:${hex(f.minor)}`;
}

const addFilter = (dev: string, f: DesiredRule, kind: FilterSpec['kind']): string =>
  `filter add dev ${dev} parent 1: protocol ip prio ${f.prio} ${filterWords({ ...f, kind })}`;

/** Re-points an existing node at another class (the kernel keeps its keys). */
const replaceFilter = (dev: string, fh: string, f: DesiredRule): string =>
  `filter replace dev ${dev} parent 1: protocol ip prio ${f.prio} handle ${fh} u32 ${matchText(f.match)} flowid 1:${hex(f.minor)}`;

const delFilter = (dev: string, f: TcFilter): string => `filter del dev ${dev} parent 1: protocol ${f.protocol} prio ${f.pref} handle ${f.fh ?? ''} ${f.kind}`;

const delPrio = (dev: string, prio: number): string => `filter del dev ${dev} parent 1: prio ${prio}`;

/** Phases of the tc script, in the order they run. */
interface Phases {
  shared: string[];
  classes: string[];
  filtersFirst: string[];
  filters: string[];
  redirects: string[];
  staleFilters: string[];
  staleClasses: string[];
}

const EMPTY_DEVICE: DeviceTc = { classes: [], filters: [] };

/**
 * `owned`: shared pieces natgw created that no acknowledged rule may need yet (the intent
 * record of a change that did not take effect); those `desired` does not need are removed.
 */
export function renderQos(desired: ReadonlyMap<string, DesiredDevice>, kernel: KernelQos, features: QosFeatures, owned: readonly QosPiece[] = []): QosPlan {
  const ip: string[][] = [];
  const notes: string[] = [];
  const missing: string[] = [];
  const creates: QosPiece[] = [];
  const p: Phases = { shared: [], classes: [], filtersFirst: [], filters: [], redirects: [], staleFilters: [], staleClasses: [] };
  const removal = renderRemovals(desired, kernel, owned);

  // Devices natgw shapes but no longer has rules for still get their stale classes removed.
  const all = new Map(desired);
  for (const dev of shapedDevices(kernel.qdiscs)) if (!all.has(dev) && kernel.devices.has(dev)) all.set(dev, { dev, rules: [] });

  for (const d of [...all.values()].sort((a, b) => a.dev.localeCompare(b.dev))) {
    if (d.rules.length === 0) {
      // A root (or IFB) that goes takes its classes and filters with it.
      if (kernel.links.has(d.dev) && !removal.gone.has(d.dev)) renderDevice(d, kernel, features, p, notes, creates);
      continue;
    }
    const shaped = d.ingressOf ?? d.dev;
    if (!kernel.links.has(shaped)) {
      missing.push(shaped);
      continue;
    }
    if (d.ingressOf !== undefined) renderIfb(d.ingressOf, kernel, ip, p, creates);
    renderDevice(d, kernel, features, p, notes, creates);
  }

  const tc = [...p.shared, ...p.classes, ...p.filtersFirst, ...p.filters, ...p.redirects, ...p.staleFilters, ...p.staleClasses, ...removal.tc];
  return { ip, tc, notes, missing: [...new Set(missing)], creates, ipAfter: removal.ipAfter };
}

/**
 * PURE: the commands that remove the shared pieces in `owned` that `desired` does not need and
 * the kernel holds: the redirect, then the ingress qdisc, then the root (the tc script), and the
 * IFB last (after the script, so nothing in it names a device already gone).
 */
function renderRemovals(
  desired: ReadonlyMap<string, DesiredDevice>,
  kernel: KernelQos,
  owned: readonly QosPiece[],
): { tc: string[]; ipAfter: string[][]; gone: Set<string> } {
  const needsIngress = new Set([...desired.values()].flatMap((d) => (d.ingressOf !== undefined ? [d.ingressOf] : [])));
  const unneeded = (pc: QosPiece): boolean => (pc.kind === 'root' || pc.kind === 'ifb' ? !desired.has(pc.dev) : !needsIngress.has(pc.dev));
  // Once each: an edited record may list a piece twice.
  const drop = [...new Map(owned.filter((pc) => unneeded(pc) && kernel.links.has(pc.dev)).map((pc) => [pieceKey(pc), pc])).values()];
  const devs = (kind: QosPiece['kind']): string[] => drop.filter((pc) => pc.kind === kind).map((pc) => pc.dev);
  // Only the qdisc natgw added: a clsact someone put in its place stays; a redirect goes with its ingress qdisc.
  const ours = (dev: string): boolean => ingressQdisc(kernel, dev)?.kind === 'ingress';
  const ingressGoes = devs('ingress').filter(ours);
  const gone = new Set(devs('ifb'));
  const roots = devs('root').filter((dev) => !gone.has(dev) && htbRoot(kernel, dev));
  const tc = [
    ...devs('redirect')
      .filter((dev) => ours(dev) && !ingressGoes.includes(dev) && redirects(kernel, dev))
      .map((dev) => `filter del dev ${dev} parent ffff: prio ${REDIRECT_PRIO}`),
    ...ingressGoes.map((dev) => `qdisc del dev ${dev} ingress`),
    ...roots.map((dev) => `qdisc del dev ${dev} root`),
  ];
  return { tc, ipAfter: [...gone].map((dev) => ['link', 'del', dev]), gone: new Set([...gone, ...roots]) };
}

/** The device's root qdisc where it is natgw's htb `1:`. */
const htbRoot = (kernel: KernelQos, dev: string): TcQdisc | undefined =>
  kernel.qdiscs.find((q) => q.dev === dev && q.parent === 'root' && q.kind === 'htb' && q.handle === '1:');

/** The device's `ffff:` qdisc (ingress, or a clsact, which serves as one). */
const ingressQdisc = (kernel: KernelQos, dev: string): TcQdisc | undefined =>
  kernel.qdiscs.find((q) => q.dev === dev && q.handle === 'ffff:' && (q.kind === 'ingress' || q.kind === 'clsact'));

/** Whether the device's ingress filters hold the redirect into its IFB. */
const redirects = (kernel: KernelQos, dev: string): boolean =>
  (kernel.devices.get(dev)?.ingress ?? []).some((f) => f.pref === REDIRECT_PRIO && f.redirectTo === ifbName(dev));

/** The IFB of `dev` up, an ingress qdisc on `dev`, and the redirect into the IFB. */
function renderIfb(dev: string, kernel: KernelQos, ip: string[][], p: Phases, creates: QosPiece[]): void {
  const ifb = ifbName(dev);
  const up = kernel.links.get(ifb);
  if (up === undefined) {
    ip.push(['link', 'add', ifb, 'type', 'ifb']);
    creates.push({ kind: 'ifb', dev: ifb });
  }
  // The script's lesson: an IFB's default queue of 32 packets drops bursts, so give it 1000.
  if (!up) ip.push(['link', 'set', 'dev', ifb, 'txqueuelen', '1000', 'up']);
  const hasIngress = ingressQdisc(kernel, dev) !== undefined;
  if (!hasIngress) {
    p.shared.push(`qdisc add dev ${dev} ingress`);
    creates.push({ kind: 'ingress', dev });
  }
  if (!redirects(kernel, dev) || !hasIngress) {
    p.redirects.push(`filter add dev ${dev} parent ffff: protocol all prio ${REDIRECT_PRIO} u32 match u32 0 0 action mirred egress redirect dev ${ifb}`);
    creates.push({ kind: 'redirect', dev });
  }
}

function renderDevice(d: DesiredDevice, kernel: KernelQos, features: QosFeatures, p: Phases, notes: string[], creates: QosPiece[]): void {
  const dev = d.dev;
  const root = htbRoot(kernel, dev);

  // A root that is not htb 1: takes its classes and filters with it when replaced.
  const tc = (root && kernel.devices.get(dev)) || EMPTY_DEVICE;
  if (!root) {
    p.shared.push(`qdisc replace dev ${dev} root handle 1: htb default ${hex(DEFAULT_CLASS)}`);
    creates.push({ kind: 'root', dev });
  } else if (root.defaultMinor !== DEFAULT_CLASS) p.shared.push(`qdisc change dev ${dev} root handle 1: htb default ${hex(DEFAULT_CLASS)}`);

  const classes = new Map(tc.classes.filter((c) => c.major === 1).map((c) => [c.minor, c]));
  const def = classes.get(DEFAULT_CLASS);
  if (!def) p.shared.push(`class add ${classSpec(dev, DEFAULT_CLASS, DEFAULT_RATE_MBIT)}`);
  else if (!rateMatches(def.rateBits, DEFAULT_RATE_MBIT) || !rateMatches(def.ceilBits, DEFAULT_RATE_MBIT)) {
    p.shared.push(`class change ${classSpec(dev, DEFAULT_CLASS, DEFAULT_RATE_MBIT)}`);
  }

  for (const r of d.rules) {
    const have = classes.get(r.minor);
    const write = !have ? 'add' : !classMatches(have, r) ? 'change' : undefined;
    if (write) {
      p.classes.push(`class ${write} ${classSpec(dev, r.minor, r.rate, r.burst)}`);
      const bytes = programmedBurstBytes(r.rate, r.burst);
      if (bytes < burstBytes(r.burst)) {
        notes.push(
          `INFO: QoS: a burst of ${r.burst} MB at ${r.rate} Mbit/s is more than the kernel can hold (${MAX_BUFFER_USEC / 1e6} s of the rate); class 1:${hex(r.minor)} on ${dev} gets ${bytes} bytes`,
        );
      }
    }
    if (features.fqCodel) {
      const leaf = have ? kernel.qdiscs.find((q) => q.dev === dev && q.parent === `1:${r.minor.toString(16)}`) : undefined;
      if (leaf?.kind !== 'fq_codel') p.classes.push(`qdisc replace dev ${dev} parent 1:${hex(r.minor)} fq_codel`);
    }
  }

  renderFilters(dev, d.rules, tc.filters, features, p, notes);

  const keep = new Set(d.rules.map((r) => r.minor));
  const stale = tc.classes.filter((c) => c.major === 1 && c.minor !== DEFAULT_CLASS && c.minor !== 0 && !keep.has(c.minor));
  // Inner classes before their parents: htb refuses to delete a class that has children.
  for (const c of [...stale].sort((a, b) => Number(a.parent === 'root') - Number(b.parent === 'root'))) {
    p.staleClasses.push(`class del dev ${dev} classid 1:${hex(c.minor)}`);
  }
}

function renderFilters(dev: string, want: readonly DesiredRule[], have: readonly TcFilter[], features: QosFeatures, p: Phases, notes: string[]): void {
  const prios = new Set([...want.map((f) => f.prio), ...have.map((f) => f.pref)]);
  for (const prio of [...prios].sort((a, b) => a - b)) {
    const w = want.filter((f) => f.prio === prio);
    const h = have.filter((f) => f.pref === prio);
    if (w.length === 0) {
      // Nothing natgw wants here any more: the whole priority goes, so no empty u32 table lingers.
      p.staleFilters.push(delPrio(dev, prio));
      continue;
    }
    const catchAlls = w.filter((f) => f.match.kind === 'all');
    const kind = w.length === 1 && catchAlls.length === 1 && features.matchall ? 'matchall' : 'u32';
    if (w.length > 1) {
      for (const f of catchAlls)
        notes.push(`${f.what}: shares priority ${prio} on ${dev} with u32 rules, so a u32 catch-all (match u32 0 0) stands in for matchall`);
    }
    const nodes = classifyingFilters(h);
    const same = (cur: TcFilter | undefined, f: DesiredRule): boolean => {
      const read = cur && filterSpec(cur);
      return read !== undefined && filterWords(read) === filterWords({ ...f, kind });
    };
    const tables = h.filter((f) => f.fh !== undefined && f.node === undefined).length;
    // Another kind or protocol holds this priority (or a u32 layout that is not natgw's), or a
    // matchall that is not natgw's (one per priority, never changed in place): start it afresh.
    const afresh =
      !h.every((f) => f.kind === kind && f.protocol === 'ip') ||
      (kind === 'u32' ? h.length > 0 && tables !== 1 : !(nodes.length === 1 && same(nodes[0], w[0]!)));
    if (afresh) {
      if (h.length > 0) p.filtersFirst.push(delPrio(dev, prio));
      for (const f of w) p.filters.push(addFilter(dev, f, kind));
      continue;
    }
    if (kind === 'matchall') continue;
    const byNode = new Map(nodes.map((f) => [f.node, f]));
    for (const f of w) {
      const cur = byNode.get(f.handle);
      if (same(cur, f)) continue;
      const read = cur && filterSpec(cur);
      if (cur && read && matchText(read.match) === matchText(f.match)) p.filters.push(replaceFilter(dev, cur.fh ?? '', f));
      else {
        // u32 keeps a node's keys on replace (only its class changes), so a new match means a new node.
        if (cur) p.filtersFirst.push(delFilter(dev, cur));
        p.filters.push(addFilter(dev, f, kind));
      }
    }
    const wanted = new Set(w.map((f) => f.handle));
    for (const f of nodes) if (!wanted.has(f.node ?? -1)) p.staleFilters.push(delFilter(dev, f));
  }
}
