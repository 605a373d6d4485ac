import type { Engine } from './engine.js';
import type { Output, CommandOutput } from './output.js';
import { InterfaceMissingError, ValidationError } from '../model/errors.js';
import { parseInitArgs } from '../model/legacy.js';
import { isInterfaceName } from '../model/net.js';
import { readEnvFile, updateEnvFile } from '../config/envFile.js';
import { readNetworkStatus } from '../config/networkStatus.js';
import type { DesiredState } from '../state/state.js';

/**
 * `init [vpcIf,extIf[,extIf2...]]` (SPEC §2, §3.1–3.2; further external interfaces are
 * secondary uplinks, Kube-OVN PR #7238): pick the interface names, wait for late interfaces,
 * record the names, and bring the skeleton into place — repairing whatever a half-finished
 * earlier init left. Safe to run again at any time.
 */
export async function runInit(engine: Engine, args: readonly string[], out: Output): Promise<CommandOutput> {
  const log = engine.log.child({ command: 'init' });
  try {
    const names = parseInitArgs(args) ?? (await storedNames(engine));
    const secondary = names.secondary ?? [];
    const uplinks = [names.ext, ...secondary];
    for (const n of [names.vpc, ...uplinks]) {
      if (!isInterfaceName(n)) throw new ValidationError(`Error: invalid interface name '${n}'`, undefined, 'stderr');
    }
    out.line(`using VPC interface: ${names.vpc}`);
    out.line(`using External interface: ${uplinks.join(',')}`);

    const missing = await engine.link.waitFor([names.vpc, ...uplinks], engine.config.interfaceWaitMs, (m) => {
      out.line(`INFO: waiting for interface(s) ${m.join(', ')} (up to ${engine.config.interfaceWaitMs} ms)`);
      log.info({ missing: m }, 'waiting for interfaces');
    });
    if (missing.includes(names.vpc)) throw new InterfaceMissingError('VPC', names.vpc);
    for (const ext of uplinks) if (missing.includes(ext)) throw new InterfaceMissingError('External', ext);

    await updateEnvFile(engine.config.envFile, { VPC_INTERFACE: names.vpc, EXTERNAL_INTERFACE: uplinks.join(',') });
    await engine.link.ensureUp(names.vpc);
    for (const ext of uplinks) await engine.link.ensureUp(ext);
    for (const ext of uplinks) await engine.link.promoteSecondaries(ext);

    const gateways = engine.config.uplinkGateways ?? {};
    const interfaces: DesiredState['interfaces'] = {
      vpc: names.vpc,
      ext: names.ext,
      ...(secondary.length > 0 ? { secondary: secondary.map((name) => (gateways[name] ? { name, gateway: gateways[name] } : { name })) } : {}),
    };
    for (const u of interfaces.secondary ?? []) {
      if (!u.gateway) out.line(`INFO: no gateway for ${u.name} in NATGW_UPLINK_GATEWAYS: its EIPs reach only their own network through it`);
    }
    await engine.transact(({ state }) => ({ state: { ...state, initialized: true, interfaces }, effects: [] }), { qos: true, mode: 'full' });

    await loadIfb(engine, out);
    for (const ext of uplinks) {
      const v4 = (await engine.link.addresses(ext)).filter((a) => a.family === 4 && a.scope === 'global');
      if (v4.length === 0) out.line(`INFO: no IPv4 address on ${ext}; skipping gratuitous ARP`);
      const ips = v4.map((a) => a.address);
      if (engine.role.mayAnnounce('init', ips)) for (const ip of ips) engine.link.announce(ext, ip);
      else if (ips.length > 0) out.line(`INFO: standby replica: no gratuitous ARP (a takeover announces)`);
    }
    log.info({ vpc: names.vpc, ext: names.ext, secondary }, 'initialized');
    return out.result(0);
  } catch (e) {
    return out.failure(e, log);
  }
}

/**
 * No argument: the names in the env file, then the pod's Multus network-status (where the
 * downward API provides it), then the saved state or what natgw owns in the kernel, then the
 * configured names. The env file's EXTERNAL_INTERFACE may list several uplinks (`net1,net2`).
 */
async function storedNames(engine: Engine): Promise<{ vpc: string; ext: string; secondary?: string[] }> {
  const file = await readEnvFile(engine.config.envFile);
  const multus = await readNetworkStatus(engine.config.networkStatusFile);
  const { interfaces } = await engine.loadState();
  const listed = file.EXTERNAL_INTERFACE?.split(',').map((n) => n.trim());
  const [ext = '', ...secondary] = listed ?? (multus.ext ? [multus.ext] : [interfaces.ext, ...(interfaces.secondary ?? []).map((u) => u.name)]);
  return { vpc: file.VPC_INTERFACE ?? multus.vpc ?? interfaces.vpc, ext, ...(secondary.length > 0 ? { secondary } : {}) };
}

/** IFB backs ingress QoS. Many containers have no modprobe; every outcome is informational. */
async function loadIfb(engine: Engine, out: Output): Promise<void> {
  const r = await engine.deps.exec.run({ file: 'modprobe', args: ['ifb'] });
  if (r.failedToStart) out.line('INFO: modprobe not available; assuming ifb is built in or loaded');
  else if (r.exitCode !== 0) out.line('INFO: could not load the ifb module; ingress QoS may be unavailable');
}
