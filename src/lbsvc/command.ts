import type { CommandOutput } from '../engine/output.js';
import { ExecError, type Executor } from '../system/exec.js';
import { announce, applyNat, chooseBackend, ipBatch, type LbBackend, type NatRead, readLink, readNat, readRoutes, readRulesFrom } from './apply.js';
import { COMMANDS, type DnatAdd, type DnatDel, type EipAdd, isCommandName, LbSvcInputError, parseCommand } from './parse.js';
import { delRouteBatch, eipAddBatch, emptyChange, initBatch, planDnatAdd, planDnatDel, routeBatch, undoRouteBatch } from './plan.js';

/**
 * `natgw lb-svc <command> [rule ...]`: Kube-OVN's LoadBalancer-service pod commands
 * (`bash /kube-ovn/lb-svc.sh …`, image/lb-svc.sh). Like the script: the command line first on
 * stdout, status 0 with an empty stderr on success. Every rule is validated before anything
 * runs (errors on stdout, status 1); a refused tool reports on stderr with the tool's status.
 * No daemon and no state file: the kernel is the state, read at each command.
 */

export interface LbSvcEnv {
  readonly exec: Executor;
  readonly ext: string;
  readonly vpc: string;
  readonly mode: 'auto' | 'nftables' | 'iptables';
  readonly iptablesVariant: 'auto' | 'legacy' | 'nft';
}

const USAGE = `Usage: lb-svc.sh [${COMMANDS.join('|')}] ...`;

export async function runLbSvc(argv: readonly string[], env: () => Promise<LbSvcEnv>): Promise<CommandOutput> {
  const [name, ...args] = argv;
  if (!isCommandName(name)) return { status: 1, stdout: `${USAGE}\n`, stderr: '' };
  const header = `${name} ${args.join(' ')}\n`;
  let command: ReturnType<typeof parseCommand>;
  try {
    command = parseCommand(name, args);
  } catch (e) {
    if (e instanceof LbSvcInputError) return { status: 1, stdout: `${header}${e.message}\n`, stderr: '' };
    throw e;
  }
  try {
    const e = await env();
    switch (command.name) {
      case 'init':
        await init(e);
        break;
      case 'eip-add':
        await eipAdd(e, command.rules);
        break;
      case 'dnat-add':
        await dnatAdd(e, command.rules);
        break;
      case 'dnat-del':
        await dnatDel(e, command.rules);
        break;
    }
    return { status: 0, stdout: header, stderr: '' };
  } catch (e) {
    // The script exits with the failed tool's status.
    if (e instanceof ExecError) return { status: e.exitCode > 0 && e.exitCode < 256 ? e.exitCode : 1, stdout: header, stderr: `${e.message}\n` };
    if (e instanceof LbSvcInputError) return { status: 1, stdout: `${header}${e.message}\n`, stderr: '' };
    return { status: 1, stdout: header, stderr: `Error: ${e instanceof Error ? e.message : String(e)}\n` };
  }
}

async function init(e: LbSvcEnv): Promise<void> {
  const [link, rulesFrom, backend] = await Promise.all([readLink(e.exec, e.ext), readRulesFrom(e.exec), chooseBackend(e.exec, e.mode, e.iptablesVariant)]);
  if (link === undefined) throw new LbSvcInputError([`Error: External interface '${e.ext}' not found`]);
  await ipBatch(e.exec, 'init', initBatch(e.ext, e.vpc, link, rulesFrom));
  // nftables: the table and its chains from the start (repaired if damaged); iptables' chains are built in.
  if (backend.kind === 'nftables') {
    const nat = await readNat(e.exec, backend);
    if (!nat.intact) await applyNat(e.exec, backend, { delDnat: [], addDnat: [], delMasq: [], addMasq: [] });
  }
}

async function eipAdd(e: LbSvcEnv, rules: readonly EipAdd[]): Promise<void> {
  if (rules.length === 0) return;
  // A missing EXT is `ip`'s own first refusal (`Cannot find device`): nothing is applied.
  await ipBatch(e.exec, 'eip-add', eipAddBatch(e.ext, rules));
  await Promise.all(rules.map((r) => announce(e.exec, e.ext, r.eip.address, r.gateway)));
}

async function dnatAdd(e: LbSvcEnv, rules: readonly DnatAdd[]): Promise<void> {
  if (rules.length === 0) return;
  const [{ backend, nat }, routes] = await Promise.all([readBackend(e), readRoutes(e.exec)]);
  const plan = planDnatAdd(nat, routes, rules);
  // The path first: a refused route (a gateway off-link) leaves nothing behind.
  await ipBatch(e.exec, 'dnat-add routes', routeBatch(plan.routes));
  if (!emptyChange(plan.nat) || !nat.intact) {
    try {
      await applyNat(e.exec, backend, plan.nat);
    } catch (err) {
      // Put table 100 back as it was: nothing half-applied.
      await ipBatch(e.exec, 'dnat-add route rollback', undoRouteBatch(routes, plan.routes)).catch(() => undefined);
      throw err;
    }
  }
  await ipBatch(e.exec, 'dnat-add routes', delRouteBatch(plan.delRoutes));
}

async function dnatDel(e: LbSvcEnv, rules: readonly DnatDel[]): Promise<void> {
  if (rules.length === 0) return;
  const [{ backend, nat }, routes] = await Promise.all([readBackend(e), readRoutes(e.exec)]);
  const plan = planDnatDel(nat, routes, rules);
  if (!emptyChange(plan.nat)) await applyNat(e.exec, backend, plan.nat);
  // Routes no DNAT needs any more, after the DNATs that used them are gone.
  await ipBatch(e.exec, 'dnat-del routes', delRouteBatch(plan.delRoutes));
}

async function readBackend(e: LbSvcEnv): Promise<{ backend: LbBackend; nat: NatRead }> {
  const backend = await chooseBackend(e.exec, e.mode, e.iptablesVariant);
  return { backend, nat: await readNat(e.exec, backend) };
}
