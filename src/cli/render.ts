import { canonicalJson } from '../model/canonical.js';
import { RESOURCES, idOf, type ResourceDef } from '../api/resources.js';
import type { StatusDocument } from '../api/bodies.js';
import { diffStates as changeOf, sameValue, split } from '../state/change.js';
import type { DesiredState } from '../state/state.js';

/**
 * Pure text renderers of the agent commands (tested without a daemon): tables, the status
 * summary, the plan as a diff.
 */

/** Left-aligned columns, two spaces apart; no trailing blanks. */
export function renderTable(headers: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: readonly string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
      .join('  ')
      .trimEnd();
  return `${[line(headers), ...rows.map(line)].join('\n')}\n`;
}

/** A field's value as one cell: share-DNAT backends as ip:port, ip:port. */
function cellOf(v: unknown): string {
  if (v === undefined || v === null) return '';
  if (Array.isArray(v))
    return v.map((x) => (x && typeof x === 'object' && 'ip' in x && 'port' in x ? `${String(x.ip)}:${String(x.port)}` : cellOf(x))).join(', ');
  if (typeof v === 'object') return canonicalJson(v);
  return String(v);
}

/** kubectl's column names: `internalIp` → `INTERNAL-IP`. */
export function headerOf(field: string): string {
  return field.replace(/([a-z0-9])([A-Z])/g, '$1-$2').toUpperCase();
}

/** A kind's name in the singular, as `natgw get` prints objects: dnat, share-dnat, eip-qos, neighbour. */
export function kindName(def: ResourceDef): string {
  return def.path.endsWith('qos') ? def.path : def.path.replace(/s$/, '');
}

/**
 * The columns of `natgw get <kind>` after ID: what tells one object from another at a glance.
 * `-o wide` shows every field the objects carry (allocated QoS ids, share-DNAT protocol text, pools).
 */
const TABLE_COLUMNS: Readonly<Record<string, readonly string[]>> = {
  eips: ['prefixLength'],
  snats: ['randomFully'],
  dnats: ['internalIp', 'internalPort'],
  fips: ['internalIp'],
  'share-dnats': ['backends'],
  routes: ['nexthop'],
  'eip-qos': ['priority', 'rate', 'burst'],
  qos: ['rate', 'burst'],
  neighbours: ['mac'],
};

/** `natgw get <kind>`: the identity first, then the kind's columns (wide: every other field, in first-seen order). */
export function renderItems(def: ResourceDef, items: readonly Record<string, unknown>[], wide = false): string {
  if (items.length === 0) return `No ${def.title} objects.\n`;
  let cols: string[] = [];
  if (wide) {
    for (const it of items) for (const k of Object.keys(it)) if (k !== 'id' && !def.idFields.includes(k) && !cols.includes(k)) cols.push(k);
  } else {
    cols = [...(TABLE_COLUMNS[def.path] ?? [])];
  }
  const rows = items.map((it) => [String(it.id ?? idOf(def, it)), ...cols.map((c) => cellOf(it[c]))]);
  return renderTable(['ID', ...cols.map(headerOf)], rows);
}

const ACRONYMS: Readonly<Record<string, string>> = { ip: 'IP', eip: 'EIP', eips: 'EIPs', id: 'ID', cidr: 'CIDR', mac: 'MAC', dev: 'Device' };

/** `internalIp` → `Internal IP`. */
export function labelOf(field: string): string {
  return field
    .replace(/([a-z0-9])([A-Z])/g, '$1 $2')
    .split(' ')
    .map((w, i) => ACRONYMS[w.toLowerCase()] ?? (i === 0 ? w.charAt(0).toUpperCase() + w.slice(1) : w.toLowerCase()))
    .join(' ');
}

/** `natgw describe <kind> <id>`: one labelled line per field, then whether the daemon applied it. */
export function renderDescribe(def: ResourceDef, item: Record<string, unknown>, applied: boolean | null): string {
  const rows: [string, string][] = [
    ['Kind', def.title],
    ['ID', String(item.id ?? idOf(def, item))],
  ];
  for (const [k, v] of Object.entries(item)) if (k !== 'id') rows.push([labelOf(k), cellOf(v)]);
  rows.push([
    'Applied',
    applied === null ? 'nothing applied by this daemon yet' : applied ? 'yes (as the daemon last applied it)' : 'no (desired; not yet applied as it stands)',
  ]);
  const width = Math.max(...rows.map(([l]) => l.length)) + 3;
  return `${rows.map(([l, v]) => `${`${l}:`.padEnd(width)}${v}`.trimEnd()).join('\n')}\n`;
}

function ago(at: string, now: Date): string {
  const s = Math.round((now.getTime() - new Date(at).getTime()) / 1000);
  if (!Number.isFinite(s)) return at;
  if (s < 0) return at;
  if (s < 120) return `${at} (${s}s ago)`;
  if (s < 7200) return `${at} (${Math.round(s / 60)}m ago)`;
  return `${at} (${Math.round(s / 3600)}h ago)`;
}

const sumChanges = (c: { netfilter: number; shareDnat: number; link: number; qos: number }): number => c.netfilter + c.shareDnat + c.link + c.qos;

function changesText(c: { netfilter: number; shareDnat: number; link: number; qos: number }): string {
  const parts = (Object.entries(c) as [string, number][]).filter(([, n]) => n > 0).map(([k, n]) => `${k} ${n}`);
  return parts.length ? parts.join(', ') : 'none';
}

/** `natgw status`: a few labelled lines, then desired against applied per kind. */
export function renderStatus(s: StatusDocument, now = new Date()): string {
  const out: string[] = [];
  const kv = (k: string, v: string) => out.push(`${`${k}:`.padEnd(12)} ${v}`);
  kv('Ready', s.ready ? 'yes' : `no (${s.reasons.join('; ')})`);
  const b = s.backend;
  kv('Backend', b ? `${b.kind}${b.variant ? ` (${b.variant})` : ''}, mode ${s.mode}` : `none chosen yet, mode ${s.mode}`);
  if (!s.interfaces.present && s.interfaces.missing.length) kv('Interfaces', `missing ${s.interfaces.missing.join(', ')}`);
  kv('Generation', String(s.generation));
  kv(
    'Applied',
    s.appliedDigest === null ? 'nothing applied by this daemon yet' : s.inSync ? 'the desired state (digests equal)' : 'differs from the desired state',
  );
  kv('Digest', s.digest);
  const ls = s.lastSync;
  if (!ls) kv('Last sync', 'none yet');
  else {
    const what = [ls.kind, ls.ok ? 'ok' : 'FAILED', ls.ms !== undefined ? `${ls.ms} ms` : undefined].filter(Boolean).join(', ');
    kv('Last sync', `${what}, ${ago(ls.at, now)}${ls.error ? `: ${ls.error}` : ''}`);
  }
  const d = s.drift;
  const last = d.last
    ? `last read-back ${ago(d.last.at, now)} (${d.last.reason}): ${d.last.repaired ? `repaired ${changesText(d.last.changes)}` : 'no drift'}`
    : 'no read-back yet';
  kv('Drift', `${d.repairs} repair${d.repairs === 1 ? '' : 's'}; ${last}`);
  if (d.lastRepair && d.lastRepair !== d.last && d.lastRepair.at !== d.last?.at) {
    kv('', `last repair ${ago(d.lastRepair.at, now)} (${d.lastRepair.reason}): ${changesText(d.lastRepair.changes)}`);
  }
  if (d.check) {
    kv(
      'Drift now',
      d.check.drifted
        ? `YES: ${sumChanges(d.check.changes)} change(s) to repair (${changesText(d.check.changes)}); the next resync repairs them`
        : 'none (the kernel holds the desired state)',
    );
  }
  for (const [i, w] of s.warnings.entries()) kv(i === 0 ? 'Warnings' : '', w);
  for (const [i, x] of (s.draining ?? []).entries()) {
    const left = x.connections === null ? 'connections unknown (conntrack unreadable)' : `${x.connections} connection${x.connections === 1 ? '' : 's'} left`;
    kv(i === 0 ? 'Draining' : '', `${x.eip} out of snat ${x.snat.eip},${x.snat.cidr}: ${left}`);
  }
  // Per EIP the busiest SNAT destination's share of the port range, then its busiest few.
  for (const [i, u] of (s.snatPorts ?? []).entries()) {
    const pct = (x: number) => `${(x * 100).toFixed(x > 0 && x < 0.001 ? 3 : 1)} %`;
    const top = u.top.map((t) => `${t.ip}:${t.port}/${t.protocol} ${t.ports} (${pct(t.share)})`).join(', ');
    kv(i === 0 ? 'SNAT ports' : '', `${u.eip}: busiest ${pct(u.maxShare)} of the range, ${u.destinations} destination(s)${top ? `; ${top}` : ''}`);
  }
  out.push('');
  const rows = Object.entries(s.objects).map(([kind, c]) => [
    kind,
    String(c.desired),
    c.applied === null ? '-' : String(c.applied),
    c.applied !== null && c.applied !== c.desired ? '*' : '',
  ]);
  out.push(renderTable(['KIND', 'DESIRED', 'APPLIED', ''], rows).trimEnd());
  return `${out.join('\n')}\n`;
}

// ---- the plan as a diff ----

interface KindDiff {
  readonly kind: string;
  readonly added: readonly string[];
  readonly removed: readonly string[];
  /** id and what changed, field by field. */
  readonly changed: readonly { readonly id: string; readonly fields: readonly string[] }[];
}

export interface StateDiff {
  readonly kinds: readonly KindDiff[];
  /** initialized, interfaces, default routes. */
  readonly gateway: readonly string[];
}

/** Fields natgw allocates (QoS class ids) are not a change when the new object leaves them out. */
function comparable(def: ResourceDef, x: unknown): Record<string, unknown> {
  const o = { ...(x as Record<string, unknown>) };
  for (const f of def.readOnly) delete o[f];
  return o;
}

function describeObject(def: ResourceDef, x: unknown): string {
  const o = comparable(def, x);
  const rest = Object.keys(o)
    .filter((k) => !def.idFields.includes(k))
    .map((k) => `${k}=${cellOf(o[k])}`);
  return rest.length ? `${idOf(def, x)}  ${rest.join(' ')}` : idOf(def, x);
}

/**
 * Object by object, what `next` adds, removes and changes relative to `current`: the state's own
 * change by identity (state/change.ts), worded field by field.
 */
export function diffStates(current: DesiredState, next: DesiredState): StateDiff {
  const change = changeOf(current, next);
  const kinds = RESOURCES.map((def): KindDiff => {
    const { added, removed, updated } = split(change, def.stateKey);
    const changed: { id: string; fields: string[] }[] = [];
    for (const { before, after } of updated) {
      const ob = comparable(def, before);
      const ov = comparable(def, after);
      const fields = [...new Set([...Object.keys(ob), ...Object.keys(ov)])]
        .filter((f) => !sameValue(ob[f], ov[f]))
        .map((f) => `${f}: ${cellOf(ob[f]) || '(none)'} -> ${cellOf(ov[f]) || '(none)'}`);
      if (fields.length) changed.push({ id: idOf(def, after), fields });
    }
    return { kind: def.path, added: added.map((x) => describeObject(def, x)), removed: removed.map((x) => describeObject(def, x)), changed };
  });
  const gateway: string[] = [];
  const set = change.scalars;
  if ('initialized' in set) gateway.push(`initialized: ${current.initialized} -> ${next.initialized}`);
  if ('interfaces' in set) gateway.push(`interfaces: ${current.interfaces.vpc},${current.interfaces.ext} -> ${next.interfaces.vpc},${next.interfaces.ext}`);
  if ('defaultRoutes' in set) gateway.push(`defaultRoutes: ${canonicalJson(current.defaultRoutes)} -> ${canonicalJson(next.defaultRoutes)}`);
  return { kinds, gateway };
}

export const diffIsEmpty = (d: StateDiff): boolean => d.gateway.length === 0 && d.kinds.every((k) => !k.added.length && !k.removed.length && !k.changed.length);

/**
 * `+`, `-`, `~` lines per kind, then a one-line summary. At most `maxPerKind` lines of each
 * sign per kind (a state of thousands of objects stays readable); the rest is counted.
 */
export function renderDiff(d: StateDiff, maxPerKind = Infinity): string {
  const out: string[] = [];
  const capped = (lines: readonly string[], sign: string) => {
    for (const l of lines.slice(0, maxPerKind)) out.push(`  ${sign} ${l}`);
    if (lines.length > maxPerKind) out.push(`  ${sign} … and ${lines.length - maxPerKind} more`);
  };
  if (d.gateway.length) {
    out.push('gateway:');
    capped(d.gateway, '~');
  }
  for (const k of d.kinds) {
    if (!k.added.length && !k.removed.length && !k.changed.length) continue;
    out.push(`${k.kind}:`);
    capped(k.removed, '-');
    capped(k.added, '+');
    capped(
      k.changed.map((c) => `${c.id}  ${c.fields.join(', ')}`),
      '~',
    );
  }
  const n = (f: (k: KindDiff) => number) => d.kinds.reduce((a, k) => a + f(k), 0);
  const summary = `${n((k) => k.added.length)} to add, ${n((k) => k.removed.length)} to remove, ${n((k) => k.changed.length) + (d.gateway.length ? 1 : 0)} to change`;
  if (out.length === 0) return 'No changes: the file is the desired state.\n';
  return `${out.join('\n')}\nPlan: ${summary}.\n`;
}

/** The same object for apply's purposes: equal fields, natgw's allocated ones (QoS ids) aside. */
export const sameObject = (def: ResourceDef, a: unknown, b: unknown): boolean => sameValue(comparable(def, a), comparable(def, b));
