import { type Neighbour, neighbourKey } from '../model/neighbour.js';
import type { DesiredState } from './state.js';
import { changedTo, unchanged, type OpResult } from './operations.js';

/**
 * Pure operations on static neighbour entries. An add is create-or-update by identity
 * (device, address), like `ip neigh replace`; a delete of an absent entry succeeds.
 */
export function addNeighbour(s: DesiredState, n: Neighbour): OpResult {
  const k = neighbourKey(n);
  const at = s.neighbours.findIndex((x) => neighbourKey(x) === k);
  const old = at === -1 ? undefined : s.neighbours[at];
  if (old && old.mac === n.mac) return unchanged(s);
  const neighbours = at === -1 ? [...s.neighbours, n] : s.neighbours.map((x, j) => (j === at ? n : x));
  return changedTo(s, { ...s, neighbours });
}

export function delNeighbour(s: DesiredState, id: Pick<Neighbour, 'address' | 'dev'>): OpResult {
  const k = neighbourKey(id);
  if (!s.neighbours.some((x) => neighbourKey(x) === k)) return unchanged(s);
  return changedTo(s, { ...s, neighbours: s.neighbours.filter((x) => neighbourKey(x) !== k) });
}
