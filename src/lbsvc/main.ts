import type { CommandOutput } from '../engine/output.js';
import { runLbSvc } from './command.js';

/**
 * The CLI's `natgw lb-svc …`: configuration as natgw reads it (environment and env file:
 * interface names, GATEWAY_NETFILTER_MODE, NATGW_IPTABLES_VARIANT, the tool deadline), tools
 * through the system executor. Loaded only once the command line is valid.
 */
export function lbSvc(argv: readonly string[]): Promise<CommandOutput> {
  return runLbSvc(argv, async () => {
    const [{ loadConfig }, { SystemExecutor }] = await Promise.all([import('../config/config.js'), import('../system/exec.js')]);
    const config = await loadConfig();
    return {
      exec: new SystemExecutor(undefined, { deadlineMs: config.toolTimeoutMs }),
      ext: config.extInterface,
      vpc: config.vpcInterface,
      mode: config.mode,
      iptablesVariant: config.iptablesVariant,
    };
  });
}
