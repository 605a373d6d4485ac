import type { Engine } from './engine.js';
import type { Output, CommandOutput } from './output.js';
import { InterfaceMissingError, ValidationError } from '../model/errors.js';
import { parseInitArgs } from '../model/legacy.js';
import { isInterfaceName } from '../model/net.js';
import { readEnvFile, updateEnvFile } from '../config/envFile.js';
import { readNetworkStatus } from '../config/networkStatus.js';
import { failure } from './failure.js';

/**
 * `init [vpcIf,extIf]` (SPEC §2, §3.1–3.2): pick the interface names, wait for late
 * interfaces, record the names, and bring the skeleton into place — repairing whatever
 * a half-finished earlier init left. Safe to run again at any time.
 */
export async function runInit(engine: Engine, args: readonly string[], out: Output): Promise<CommandOutput> {
  const log = engine.log.child({ command: 'init' });
  try {
    const names = parseInitArgs(args) ?? (await storedNames(engine));
    for (const n of [names.vpc, names.ext]) {
      if (!isInterfaceName(n)) throw new ValidationError(`Error: invalid interface name '${n}'`, undefined, 'stderr');
    }
    out.line(`using VPC interface: ${names.vpc}`);
    out.line(`using External interface: ${names.ext}`);

    const missing = await engine.link.waitFor([names.vpc, names.ext], engine.config.interfaceWaitMs, (m) => {
      out.line(`INFO: waiting for interface(s) ${m.join(', ')} (up to ${engine.config.interfaceWaitMs} ms)`);
      log.info({ missing: m }, 'waiting for interfaces');
    });
    if (missing.includes(names.vpc)) throw new InterfaceMissingError('VPC', names.vpc);
    if (missing.includes(names.ext)) throw new InterfaceMissingError('External', names.ext);

    await updateEnvFile(engine.config.envFile, { VPC_INTERFACE: names.vpc, EXTERNAL_INTERFACE: names.ext });
    await engine.link.ensureUp(names.vpc);
    await engine.link.ensureUp(names.ext);
    await engine.link.promoteSecondaries(names.ext);

    await engine.transact(
      ({ state }) => ({
        state: { ...state, initialized: true, interfaces: { vpc: names.vpc, ext: names.ext } },
        effects: [],
      }),
      { qos: true, mode: 'full' },
    );

    await loadIfb(engine, out);
    const v4 = (await engine.link.addresses(names.ext)).filter((a) => a.family === 4 && a.scope === 'global');
    if (v4.length === 0) out.line(`INFO: no IPv4 address on ${names.ext}; skipping gratuitous ARP`);
    const ips = v4.map((a) => a.address);
    if (engine.role.mayAnnounce('init', ips)) for (const ip of ips) engine.link.announce(names.ext, ip);
    else if (ips.length > 0) out.line(`INFO: standby replica: no gratuitous ARP (a takeover announces)`);
    log.info({ vpc: names.vpc, ext: names.ext }, 'initialized');
    return out.result(0);
  } catch (e) {
    return failure(out, e, log);
  }
}

/**
 * No argument: the names in the env file, then the pod's Multus network-status (where the
 * downward API provides it), then the saved state or what natgw owns in the kernel, then the
 * configured names.
 */
async function storedNames(engine: Engine): Promise<{ vpc: string; ext: string }> {
  const file = await readEnvFile(engine.config.envFile);
  const multus = await readNetworkStatus(engine.config.networkStatusFile);
  const { interfaces } = await engine.loadState();
  return {
    vpc: file.VPC_INTERFACE ?? multus.vpc ?? interfaces.vpc,
    ext: file.EXTERNAL_INTERFACE ?? multus.ext ?? interfaces.ext,
  };
}

/** IFB backs ingress QoS. Many containers have no modprobe; every outcome is informational. */
async function loadIfb(engine: Engine, out: Output): Promise<void> {
  const r = await engine.deps.exec.run({ file: 'modprobe', args: ['ifb'] });
  if (r.failedToStart) out.line('INFO: modprobe not available; assuming ifb is built in or loaded');
  else if (r.exitCode !== 0) out.line('INFO: could not load the ifb module; ingress QoS may be unavailable');
}
