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
  readonly config: Pick<Config, 'vpcInterface' | 'extInterface' | 'secondaryExtInterfaces' | 'uplinkGateways'>;
  readonly shareDnat: Pick<ShareDnatTable, 'readBack'>;
  readonly link: Pick<LinkManager, 'addresses' | 'view' | 'ownedRecord'>;
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
  // Several external interfaces (EXTERNAL_INTERFACE=net1,net2): a SNAT rule or an EIP on a
  // secondary one does not make it the primary.
  const secondary = cfg.secondaryExtInterfaces ?? [];
  const primaryOnly = (dev: string | undefined) => (dev !== undefined && isInterfaceName(dev) && !secondary.includes(dev) ? dev : undefined);
  const ext = primaryOnly(nat?.extIf) ?? primaryOnly(await findExtByEips(engine, hairpinEips)) ?? cfg.extInterface;

  const addrs = await engine.link.addresses(ext);
  // Which addresses and routes are natgw's: those its ownership record lists (the state dir
  // survived, the state file did not), and the addresses a hairpin rule names (every eip-add,
  // the script's too, writes one; the evidence lives in the kernel beside the address). The
  // interface's other addresses — the pod's own, from its network attachment — are not EIPs.
  const record = await engine.link.ownedRecord();
  const recorded = record && record.ext === ext && record.vpc === vpc ? record : undefined;
  const ownedAddresses = new Set([...hairpinEips, ...(recorded?.addresses ?? [])]);
  const eipsOn = (list: readonly { address: string; prefixLength: number; scope: string }[], dev?: string) =>
    list
      .filter((a) => a.scope === 'global' && ownedAddresses.has(a.address))
      .map((a) => ({ address: a.address, prefixLength: a.prefixLength, ...(dev ? { interface: dev } : {}) }));
  const eips = [
    ...eipsOn(addrs, secondary.length > 0 ? ext : undefined),
    ...(await Promise.all(secondary.map(async (dev) => eipsOn(await engine.link.addresses(dev), dev)))).flat(),
  ];
  const gateways = cfg.uplinkGateways ?? {};
  const interfaces = {
    vpc,
    ext,
    ...(secondary.length > 0 ? { secondary: secondary.map((name) => (gateways[name] ? { name, gateway: gateways[name] } : { name })) } : {}),
  };

  const probe = desiredStateSchema.parse({ interfaces: { vpc, ext } });
  const view = await engine.link.view(probe);
  const cidrOf = (dst: string): string => (dst.includes('/') ? dst : `${dst}/${dst.includes(':') ? 128 : 32}`);
  // Routes: the record's; without a record, the gateway routes `ip route replace` makes
  // (protocol boot) — not the kernel's, a routing daemon's or a static configuration's.
  const recordedRoutes = recorded ? new Set(recorded.routes) : undefined;
  const routes = view.vpcRoutes
    .filter((r) => r.gateway !== undefined && r.dst !== 'default')
    .filter((r) => (recordedRoutes ? recordedRoutes.has(cidrOf(r.dst)) : r.protocol === undefined || r.protocol === 'boot'))
    .map((r) => ({ cidr: cidrOf(r.dst), nexthop: r.gateway ?? '' }));
  const v4 = view.extDefaults.find((d) => d.gateway && !d.gateway.includes(':'))?.gateway;
  const v6 = view.extDefaults.find((d) => d.gateway?.includes(':'))?.gateway;
  const qos = await engine.qos.readBack(ext, [ext, vpc]);

  return desiredStateSchema.parse({
    initialized: nat !== null && (await backend.isInitialized()),
    interfaces,
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
