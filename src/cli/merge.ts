import { HttpError } from '../api/errors.js';
import { RESOURCES, idOf } from '../api/resources.js';
import { normaliseDesired } from '../api/stateDoc.js';
import { sameValue } from '../state/change.js';
import type { DesiredState } from '../state/state.js';
import { CliError } from './client.js';
import { kindName, sameObject } from './render.js';
import type { ParsedStateFile } from './stateFile.js';

/**
 * `natgw apply`'s merge, as kubectl apply does it: the file's objects are created or updated
 * by identity; objects the file does not list stay, unless --prune asks to remove them. A
 * kind the file leaves out is untouched (with --prune: emptied); the gateway's fields
 * (initialized, interfaces, defaultRoutes) change only where the file sets them.
 */
type Action = 'created' | 'configured' | 'unchanged' | 'pruned';

export interface ObjectResult {
  /** The kind in the singular (dnat, share-dnat), or `gateway` for its own fields. */
  readonly kind: string;
  readonly id: string;
  readonly action: Action;
}

export interface Merged {
  readonly next: DesiredState;
  readonly results: readonly ObjectResult[];
}

const GATEWAY_FIELDS = ['initialized', 'interfaces', 'defaultRoutes'] as const;

export function mergeState(current: DesiredState, file: ParsedStateFile, prune: boolean): Merged {
  const results: ObjectResult[] = [];
  const next: Record<string, unknown> = { ...current };
  const setFields = GATEWAY_FIELDS.filter((f) => file.present.has(f) && file.data[f] !== undefined);
  if (setFields.length) {
    const changed = setFields.filter((f) => !sameValue(file.data[f], current[f]));
    for (const f of setFields) next[f] = file.data[f];
    results.push({ kind: 'gateway', id: '', action: changed.length ? 'configured' : 'unchanged' });
  }
  for (const def of RESOURCES) {
    if (!prune && !file.present.has(def.stateKey)) continue;
    const before: readonly unknown[] = current[def.stateKey];
    const given: readonly unknown[] = file.present.has(def.stateKey) ? file.data[def.stateKey] : [];
    const index = new Map(before.map((x, i) => [def.key(x), i] as const));
    const out: unknown[] = prune ? [] : [...before];
    const listed = new Set<string>();
    const kind = kindName(def);
    for (const f of given) {
      const k = def.key(f);
      listed.add(k);
      const at = index.get(k);
      const old = at === undefined ? undefined : before[at];
      // Allocated fields (QoS class ids) the file leaves out keep their values.
      const kept = old === undefined ? [] : def.readOnly.filter((r) => (old as Record<string, unknown>)[r] !== undefined);
      const carried = { ...Object.fromEntries(kept.map((r) => [r, (old as Record<string, unknown>)[r]])), ...(f as object) };
      const action: Action = old === undefined ? 'created' : sameObject(def, old, f) ? 'unchanged' : 'configured';
      const item = action === 'unchanged' ? old : carried;
      if (prune || at === undefined) out.push(item);
      else out[at] = item;
      results.push({ kind, id: idOf(def, item), action });
    }
    if (prune) for (const x of before) if (!listed.has(def.key(x))) results.push({ kind, id: idOf(def, x), action: 'pruned' });
    next[def.stateKey] = out;
  }
  try {
    return { next: normaliseDesired(next as DesiredState), results };
  } catch (e) {
    if (e instanceof HttpError) throw new CliError(`the file and the daemon's desired state together are not a valid state: ${e.message}`);
    throw e;
  }
}

/**
 * kubectl's lines: `dnat/172.20.0.10,8080,tcp created`, in file order per kind, at most
 * `maxPerAction` of each action per kind (the rest counted), pruned objects last.
 */
export function renderResults(results: readonly ObjectResult[], dryRun: boolean, maxPerAction = Infinity): string {
  const out: string[] = [];
  const shown = new Map<string, number>();
  const hidden = new Map<string, number>();
  const suffix = dryRun ? ' (dry run)' : '';
  const order = [...results.filter((r) => r.action !== 'pruned'), ...results.filter((r) => r.action === 'pruned')];
  for (const r of order) {
    const group = `${r.kind}\0${r.action}`;
    const n = shown.get(group) ?? 0;
    if (n >= maxPerAction) {
      hidden.set(group, (hidden.get(group) ?? 0) + 1);
      continue;
    }
    shown.set(group, n + 1);
    out.push(`${r.kind}${r.id ? `/${r.id}` : ''} ${r.action}${suffix}`);
  }
  for (const [group, n] of hidden) {
    const [kind, action] = group.split('\0');
    out.push(`${kind}: … and ${n} more ${action}${suffix}`);
  }
  return out.length ? `${out.join('\n')}\n` : '';
}
