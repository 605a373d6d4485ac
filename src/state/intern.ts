import type { DesiredState } from './state.js';
import { COLLECTIONS } from './delta.js';
import { canonicalJson } from '../model/canonical.js';

/**
 * PURE: `next` with every object that equals one of `current` replaced by that very object, and
 * every collection that ends up element-for-element the same replaced by `current`'s array.
 *
 * A declarative document (`PUT /v1/state`) arrives as new objects even where nothing changed;
 * the partial sync and the journal find changes by reference, so without this a state written
 * back unchanged would delete and re-add every rule.
 */
export function internState(current: DesiredState, next: DesiredState): DesiredState {
  const out: Record<string, unknown> = { ...next };
  for (const k of COLLECTIONS) {
    const have = current[k] as readonly object[];
    const want = next[k] as readonly object[];
    if (have === want) continue;
    // Nothing to intern against (a bulk PUT into an empty gateway): no text to build.
    if (have.length === 0) {
      if (want.length === 0) out[k] = have;
      continue;
    }
    const byText = new Map<string, object>();
    for (const o of have) byText.set(canonicalJson(o), o);
    const interned = want.map((o) => byText.get(canonicalJson(o)) ?? o);
    const same = interned.length === have.length && interned.every((o, i) => o === have[i]);
    out[k] = same ? have : interned;
  }
  for (const k of ['interfaces', 'defaultRoutes'] as const) {
    if (canonicalJson(current[k]) === canonicalJson(next[k])) out[k] = current[k];
  }
  return out as DesiredState;
}
