import type { Logger } from 'pino';
import type { Config } from '../config/config.js';
import type { Executor } from '../system/exec.js';
import type { StateStore } from '../state/store.js';
import type { DesiredState } from '../state/state.js';
import { natTablesOf, type NetfilterBackend } from '../dataplane/netfilter/backend.js';
import type { NftClient } from '../dataplane/netfilter/nft/client.js';
import { BackendProbe, decideBackend, instantiate, ownedElsewhere, replicaRulesOf, sameChoice, type BackendChoice } from './backendSelect.js';

export interface BackendSwitchDeps {
  readonly config: Config;
  readonly exec: Executor;
  readonly log: Logger;
  readonly store: StateStore;
  /** nftables itself (the fake in tests); by default `nft` through `exec`. */
  readonly nft?: NftClient;
  /** What natgw owns in a backend's objects (adoption when no state file survived). */
  readonly adopt: (backend: NetfilterBackend) => Promise<DesiredState | undefined>;
}

/**
 * Which netfilter backend natgw uses in this network namespace, and the switch from one to
 * another (SPEC §4.3): record the choice; fill the new backend before cleaning the old; a
 * cleanup that fails stays recorded as pending and is retried by the next full sync, so two
 * backends never stay mixed. One backend object per choice, kept for the process's life:
 * each holds the view its partial syncs plan against.
 */
export class BackendSwitch {
  private readonly probe: BackendProbe;
  private readonly backends = new Map<string, NetfilterBackend>();

  constructor(private readonly deps: BackendSwitchDeps) {
    this.probe = new BackendProbe(deps.exec, deps.nft);
  }

  backendFor(choice: BackendChoice): NetfilterBackend {
    const key = `${choice.kind}/${choice.variant ?? ''}`;
    let b = this.backends.get(key);
    if (!b) {
      b = instantiate(choice, this.deps.exec, this.deps.log, this.deps.nft, replicaRulesOf(this.deps.config));
      this.backends.set(key, b);
    }
    return b;
  }

  /** The backend as it stands, without the lock, a switch or a record (a dry run, get-iptables-version). */
  async choose(): Promise<NetfilterBackend> {
    return this.backendFor(await decideBackend(this.deps.config, await this.deps.store.loadBackend(), this.probe));
  }

  /** Every backend drops its view: the next sync of each reads the kernel back. */
  forgetAll(): void {
    for (const b of this.backends.values()) b.forget();
  }

  /**
   * Resolve the backend under the lock: record the choice, and carry out a switch (prepare
   * and fill the new backend, then remove the old one's objects; a failed removal stays
   * recorded as pendingCleanup and is retried by the next full sync).
   *
   * The backend switched from is the recorded one, or, with no record (the state dir was lost
   * with the container, or the script ran here before), whichever other backend holds natgw's
   * objects. Without a state file the new backend is filled with what the old one holds, and
   * that adopted state is returned for the transaction to build on.
   */
  async resolve(state: DesiredState | undefined): Promise<{ backend: NetfilterBackend; adopted?: DesiredState }> {
    const { store } = this.deps;
    const record = await store.loadBackend();
    const choice = await decideBackend(this.deps.config, record, this.probe);
    const backend = this.backendFor(choice);
    const previous: BackendChoice | undefined = record ? { kind: record.kind, variant: record.variant } : await ownedElsewhere(this.probe, choice);
    let pending: BackendChoice | undefined = record?.pendingCleanup;
    let adopted: DesiredState | undefined;
    if (previous && !sameChoice(previous, choice)) {
      this.deps.log.info({ from: previous, to: choice }, 'switching netfilter backend');
      if (!state) {
        adopted = await this.deps.adopt(this.backendFor(previous));
        if (adopted) this.deps.log.info('no state file: adopted the rules natgw owns from the backend switched from');
      }
      const fill = state ?? adopted;
      if (fill?.initialized) await backend.sync(natTablesOf(fill));
      // An earlier switch's cleanup that is still pending is not forgotten: it is tried now,
      // and whatever it leaves is found again by the read-back after the next cleanup.
      if (pending && !sameChoice(pending, choice) && !sameChoice(pending, previous)) {
        await this.remove(pending);
      }
      pending = previous;
      await store.saveBackend({ ...choice, pendingCleanup: pending });
    } else if (!record) {
      await store.saveBackend(choice);
    }
    if (pending && !sameChoice(pending, choice)) {
      if (await this.remove(pending)) {
        // Anything natgw still owns outside the chosen backend (a cleanup an earlier switch
        // could not finish) becomes the next pending cleanup: two backends never stay mixed.
        const left = await ownedElsewhere(this.probe, choice);
        await store.saveBackend(left ? { ...choice, pendingCleanup: left } : choice);
      }
    } else if (pending) {
      await store.saveBackend(choice);
    }
    return { backend, ...(adopted ? { adopted } : {}) };
  }

  /** Remove an old backend's objects; false (logged, retried later) when that fails. */
  private async remove(old: BackendChoice): Promise<boolean> {
    try {
      await this.backendFor(old).removeAll();
      this.deps.log.info({ removed: old }, 'old netfilter backend cleaned');
      return true;
    } catch (e) {
      this.deps.log.warn({ err: e, pending: old }, 'old backend not cleaned yet; will retry');
      return false;
    }
  }
}
