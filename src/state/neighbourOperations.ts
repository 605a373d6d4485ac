import { type Neighbour, neighbourKey } from '../model/neighbour.js';
import type { DesiredState } from './state.js';
import { put, remove, unchanged, type OpResult } from './operations.js';

/**
 * Pure operations on static neighbour entries. An add is create-or-update by identity
 * (device, address), like `ip neigh replace`; a delete of an absent entry succeeds.
 */
export function addNeighbour(s: DesiredState, n: Neighbour): OpResult {
  const k = neighbourKey(n);
  if (s.neighbours.some((x) => neighbourKey(x) === k && x.mac === n.mac)) return unchanged(s);
  return put(s, 'neighbours', n, (x) => neighbourKey(x) === k);
}

export function delNeighbour(s: DesiredState, id: Pick<Neighbour, 'address' | 'dev'>): OpResult {
  const k = neighbourKey(id);
  return remove(s, 'neighbours', (x) => neighbourKey(x) === k);
}
