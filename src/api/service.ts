import type { DrainingStatus } from '../dataplane/draining.js';
import type { ChangeRequest, ChangeResult } from '../engine/queue.js';
import type { CommandOutput } from '../engine/output.js';
import type { DesiredState } from '../state/state.js';
import type { EipPortUsage } from '../observe/portUsage.js';
import type { UplinkNetwork } from '../model/uplinks.js';
import type { DriftCheck, Readiness, ReplaceResult, ResendBody, StateDocument, SyncInfo, TakeoverBody } from './bodies.js';

/**
 * What the HTTP layer needs from the agent. The daemon's Agent implements it over the engine
 * and its queue; the API knows nothing of processes, locks or the kernel.
 */
export interface AgentService {
  /** Run a script command exactly as the shim would (SPEC §4.2 POST /v1/legacy). */
  legacy(command: string, rules: readonly string[]): Promise<CommandOutput>;
  /** One change to the desired state, applied and persisted before it resolves. */
  change(req: ChangeRequest): Promise<ChangeResult>;
  /** The desired state (persisted, or adopted from the kernel where no file survived). */
  desired(): Promise<DesiredState>;
  /** GET /v1/state. */
  stateDocument(): Promise<StateDocument>;
  /** PUT /v1/state: replace the desired state in one transaction, or plan it (dryRun). */
  replaceState(next: DesiredState, opts: { dryRun: boolean; ifMatch?: string }): Promise<ReplaceResult>;
  readiness(): Readiness;
  /** Resolved once ready, or after `timeoutMs` (GET /readyz?waitMs=). */
  whenReady(timeoutMs: number): Promise<void>;
  metrics(): Promise<{ contentType: string; body: string }>;
  /** The last apply's kind and duration (GET /v1/status). */
  lastSyncInfo(): SyncInfo | null;
  /** A full read-back of the kernel that repairs nothing: what a resync would change now (GET /v1/status?check=true). */
  checkDrift(): Promise<DriftCheck>;
  /** SNAT source ports in use per EIP, with the busiest destinations (GET /v1/status); undefined while connections are not followed. */
  portUsage(): readonly EipPortUsage[] | undefined;
  /** EIPs draining out of SNAT pools in `state`, with the connections still translated to each (GET /v1/status). */
  draining(state: DesiredState): Promise<readonly DrainingStatus[]>;
  /** Several external interfaces: their networks, where a new EIP's interface is found (as eip-add does); none with one. */
  uplinkNetworks(): Promise<UplinkNetwork[]>;
  /** GATEWAY_V4 / GATEWAY_V6: eip creation installs the default routes, as eip-add does. */
  readonly gateways: { readonly v4?: string; readonly v6?: string };
}

/** Replica sync and takeover (src/ha), as the API sees it: GET /v1/ha, POST /v1/ha/takeover, the `ha` part of /readyz. */
export interface HaService {
  status(): Promise<{ readonly digest: string }>;
  takeover(reason: string): Promise<TakeoverBody>;
  /** An active-active peer (re)joined: resend the whole kernel table to it (POST /v1/ha/resend). */
  resend?(): Promise<ResendBody>;
  health(): { readonly enabled: boolean; readonly healthy: boolean; readonly reasons: readonly string[] };
}

/** EIPs announced by BGP (src/routing), as the API sees it: GET /v1/bgp. */
export interface RoutingService {
  status(): Promise<Record<string, unknown>>;
}
