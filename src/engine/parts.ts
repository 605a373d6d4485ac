import type { DesiredState } from '../state/state.js';
import { touches, type Collection, type Scalar, type StateChange } from '../state/change.js';
import { natTablesOf, type NetfilterBackend, type SyncMode } from '../dataplane/netfilter/backend.js';
import type { ShareDnatTable } from '../dataplane/netfilter/shareDnat.js';
import type { LinkManager } from '../dataplane/link.js';
import type { QosManager } from '../dataplane/qos/manager.js';
import type { EipCounters } from '../dataplane/eipCounters.js';
import type { NeighbourManager } from '../dataplane/neighbours.js';
import type { CtTarget, CtTimeouts } from '../dataplane/ctTimeouts.js';
import { IptablesBackend } from '../dataplane/netfilter/iptables/backend.js';
import type { UplinkRoutes } from '../dataplane/linkUplinks.js';
import { hasSecondaryUplinks } from '../model/uplinks.js';

/**
 * The one contract every part of the dataplane answers (DESIGN.md): given the state to reach
 * and the state natgw applied before, in a full or a partial sync, make the kernel hold it
 * (reading back only in a full sync) and say what changed. The engine's reconcile is a loop
 * over these, in order; a part knows nothing of the others.
 */
export type PartName = 'netfilter' | 'shareDnat' | 'ctTimeouts' | 'link' | 'uplinks' | 'qos' | 'neighbours';

interface PartResult {
  readonly changes: number;
  /** What was (or, in a dry run, would be) applied, as the tool's own script text. */
  readonly script: string;
  /** Warnings for the change's output; absent when there are none. */
  readonly notes?: readonly string[];
}

interface PartSync {
  readonly mode: SyncMode;
  readonly dryRun?: boolean;
  /** What the change did to the desired state (undefined: nothing applied before). */
  readonly change?: StateChange | undefined;
}

export interface Part {
  readonly name: PartName;
  /**
   * Whether this sync runs the part at all. A full sync runs every part that may own something
   * in the kernel (what a crash left in its objects is found only by reading them back); a
   * partial sync runs a part only where it has something to hold for `want` or to remove given
   * `from`, and the change touched something of its own (see `changed`).
   */
  runs(want: DesiredState, from: DesiredState | undefined, mode: SyncMode, change: StateChange | undefined): boolean;
  /** Make the kernel hold `want`; `from` is what natgw applied before (what it may remove). */
  sync(want: DesiredState, from: DesiredState | undefined, opts: PartSync): Promise<PartResult>;
}

/** Whether the change touched any of `fields` (always, with nothing applied before). */
const changed =
  (...fields: (Collection | Scalar)[]) =>
  (from: DesiredState | undefined, change: StateChange | undefined): boolean =>
    !from || !change || touches(change, ...fields);

const nothing: PartResult = { changes: 0, script: '' };

/** What the connection-timeout and uplink parts write into: the netfilter backend in use. */
const ctTargetOf = (backend: NetfilterBackend): CtTarget =>
  backend instanceof IptablesBackend ? { kind: 'iptables', variant: backend.variant } : { kind: 'nftables' };

const natChanged = changed('eips', 'snats', 'dnats', 'fips', 'interfaces');

/** NAT rules, and the per-EIP accounting (EipCounters: it never fails a change). */
export function netfilterPart(backend: NetfilterBackend, counters: EipCounters): Part {
  return {
    name: 'netfilter',
    // A full sync of a gateway not yet initialised only looks (observe), so that the first
    // change after it (a bulk PUT /v1/state into an empty gateway) need not read back.
    runs: (want, from, mode, change) => mode === 'full' || (want.initialized && natChanged(from, change)),
    async sync(want, from, opts) {
      if (!want.initialized) {
        if (opts.mode === 'full' && !opts.dryRun) await backend.observe?.();
        return nothing;
      }
      const eips = want.eips.map((e) => e.address);
      // A full sync repairs the accounting table too; a partial one touches it only for new or gone EIPs.
      const counting = !opts.dryRun && (opts.mode === 'full' || changed('eips')(from, opts.change));
      // nftables carries it in the NAT transaction (one `nft` per change); otherwise it is a
      // transaction of its own on another table, beside the NAT one.
      const carried = counting && backend.kind === 'nftables';
      const beside = counting && !carried ? counters.sync(eips) : undefined;
      const r = await backend
        .sync(natTablesOf(want), {
          mode: opts.mode,
          dryRun: opts.dryRun,
          ...(carried ? { append: counters.change(eips) } : {}),
          ...(opts.change ? { change: opts.change } : {}),
        })
        .finally(() => beside);
      // A refused transaction is retried without it: it is then synced on its own.
      if (carried && !r.appended) await counters.sync(eips);
      return { changes: r.changes, script: r.script };
    },
  };
}

export function shareDnatPart(table: ShareDnatTable): Part {
  return {
    name: 'shareDnat',
    runs: (want, from, mode, change) =>
      mode === 'full' || ((want.shareDnats.length > 0 || (from?.shareDnats.length ?? 0) > 0) && changed('shareDnats')(from, change)),
    sync: (want, _from, opts) => table.sync(want.shareDnats, opts),
  };
}

const translatedChanged = changed('snats', 'dnats', 'fips', 'shareDnats', 'interfaces', 'initialized');

/**
 * Timeouts of the connections natgw translates, for the backend in use. Without a policy
 * configured it runs only in a full sync (once per process: what an earlier configuration left).
 */
export function ctTimeoutsPart(ct: CtTimeouts, backend: NetfilterBackend): Part {
  return {
    name: 'ctTimeouts',
    runs: (_want, from, mode, change) => mode === 'full' || (ct.configured && translatedChanged(from, change)),
    async sync(want, _from, opts) {
      // Nothing is translated before init; leftovers of an earlier configuration go at once.
      if (!want.initialized && ct.configured) return nothing;
      return ct.sync(want, ctTargetOf(backend), opts);
    },
  };
}

const linkChanged = changed('eips', 'routes', 'defaultRoutes', 'interfaces');

export function linkPart(link: LinkManager): Part {
  return {
    name: 'link',
    // An address or route released by the change (a delete of an unlisted object) is work of
    // its own, beyond the state's fields.
    runs: (_want, from, mode, change) => mode === 'full' || link.hasReleases() || linkChanged(from, change),
    sync: (want, from, opts) => link.sync(want, from, opts),
  };
}

const uplinksChanged = changed('eips', 'snats', 'fips', 'interfaces', 'initialized');

/**
 * Policy routing of secondary uplinks (linkUplinks.ts). A full sync always runs it: without
 * secondary uplinks it only looks for its marker file, spawning nothing.
 */
export function uplinksPart(uplinks: UplinkRoutes, backend: NetfilterBackend): Part {
  return {
    name: 'uplinks',
    runs: (want, from, mode, change) =>
      mode === 'full' || ((hasSecondaryUplinks(want.interfaces) || hasSecondaryUplinks(from?.interfaces)) && uplinksChanged(from, change)),
    sync: (want, _from, opts) => uplinks.sync(want, ctTargetOf(backend), opts),
  };
}

export function qosPart(qos: QosManager): Part {
  const has = (s: DesiredState | undefined) => (s?.eipQos.length ?? 0) > 0 || (s?.qos.length ?? 0) > 0;
  return {
    name: 'qos',
    // In a full sync too without rules: an interrupted change's shared pieces (its intent
    // record) may be there with no rule listing them.
    // With several uplinks an EIP's rules follow the EIP to its interface.
    runs: (want, from, mode, change) =>
      mode === 'full' ||
      ((has(want) || has(from)) &&
        (changed('eipQos', 'qos', 'interfaces')(from, change) || (hasSecondaryUplinks(want.interfaces) && changed('eips')(from, change)))),
    async sync(want, from, opts) {
      // Without rules either side the kernel is read only when an unsettled change may have left something.
      if (!has(want) && !has(from) && !(await qos.hasPending())) return nothing;
      const r = await qos.sync(want, opts);
      return { changes: r.changes, script: r.commands.map((c) => `${c}\n`).join(''), ...(r.notes ? { notes: r.notes } : {}) };
    },
  };
}

/** Static neighbour entries; they need neither init nor the NAT interfaces. */
export function neighboursPart(neighbours: NeighbourManager): Part {
  return {
    name: 'neighbours',
    runs: (want, from, mode, change) =>
      (want.neighbours.length > 0 || (from?.neighbours.length ?? 0) > 0) && (mode === 'full' || changed('neighbours')(from, change)),
    sync: (want, from, opts) => neighbours.sync(want.neighbours, from?.neighbours ?? [], opts),
  };
}
