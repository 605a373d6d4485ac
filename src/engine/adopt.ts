import { desiredStateSchema, type DesiredState } from '../state/state.js';
import type { NetfilterBackend } from '../dataplane/netfilter/backend.js';
import type { Config } from '../config/config.js';
import type { ShareDnatTable } from '../dataplane/netfilter/shareDnat.js';
import type { LinkManager } from '../dataplane/link.js';
import type { QosManager } from '../dataplane/qos/manager.js';
import type { Executor } from '../system/exec.js';
import { isInterfaceName } from '../model/net.js';

/**
 * The parts of the engine adoption reads from. Named here rather than taken as `Engine` because
 * the engine calls adoptState: importing Engine back would close a cycle engine ↔ adopt.
 */
export interface AdoptSources {
  readonly config: Pick<Config, 'vpcInterface' | 'extInterface'>;
  readonly shareDnat: Pick<ShareDnatTable, 'readBack'>;
  readonly link: Pick<LinkManager, 'addresses' | 'view'>;
  readonly qos: Pick<QosManager, 'readBack'>;
  readonly deps: { readonly exec: Executor };
}

/**
 * Rebuild the desired state from what natgw owns in the kernel: a container restart loses
 * the state file but not the pod's network namespace, and an upgrade from the script finds
 * the script's chains. Returns undefined when natgw owns nothing here.
 */
export async function adoptState(engine: AdoptSources, backend: NetfilterBackend): Promise<DesiredState | undefined> {
  const nat = await backend.readBack();
  const shareDnats = await engine.shareDnat.readBack();
  if (!nat && shareDnats.length === 0) return undefined;
  const cfg = engine.config;
  const vpc = nat?.vpcIf && isInterfaceName(nat.vpcIf) ? nat.vpcIf : cfg.vpcInterface;
  const hairpinEips = new Set(nat?.eips ?? []);
  const ext = (nat?.extIf && isInterfaceName(nat.extIf) ? nat.extIf : undefined) ?? (await findExtByEips(engine, hairpinEips)) ?? cfg.extInterface;

  const addrs = await engine.link.addresses(ext);
  // The EIPs are natgw's addresses on the external interface (hairpin rules name them too).
  const eips = addrs
    .filter((a) => a.scope === 'global' && (a.family === 4 || hairpinEips.has(a.address)))
    .map((a) => ({ address: a.address, prefixLength: a.prefixLength }));

  const probe = desiredStateSchema.parse({ interfaces: { vpc, ext } });
  const view = await engine.link.view(probe);
  const routes = view.vpcRoutes
    .filter((r) => r.gateway !== undefined && r.dst !== 'default')
    .map((r) => ({ cidr: r.dst.includes('/') ? r.dst : `${r.dst}/${r.dst.includes(':') ? 128 : 32}`, nexthop: r.gateway ?? '' }));
  const v4 = view.extDefaults.find((d) => d.gateway && !d.gateway.includes(':'))?.gateway;
  const v6 = view.extDefaults.find((d) => d.gateway?.includes(':'))?.gateway;
  const qos = await engine.qos.readBack(ext, [ext, vpc]);

  return desiredStateSchema.parse({
    initialized: nat !== null && (await backend.isInitialized()),
    interfaces: { vpc, ext },
    defaultRoutes: { ...(v4 ? { v4 } : {}), ...(v6 ? { v6 } : {}) },
    eips,
    snats: nat?.snats ?? [],
    dnats: nat?.dnats ?? [],
    fips: nat?.fips ?? [],
    shareDnats,
    routes,
    eipQos: qos.eipQos,
    qos: qos.qos,
  });
}

async function findExtByEips(engine: AdoptSources, eips: ReadonlySet<string>): Promise<string | undefined> {
  if (eips.size === 0) return undefined;
  const r = await engine.deps.exec.run({ file: 'ip', args: ['-j', 'addr', 'show'] });
  if (r.exitCode !== 0) return undefined;
  const links = JSON.parse(r.stdout || '[]') as { ifname?: string; addr_info?: { local?: string }[] }[];
  return links.find((l) => l.addr_info?.some((a) => a.local !== undefined && eips.has(a.local)))?.ifname;
}
