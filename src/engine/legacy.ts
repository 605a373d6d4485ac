import { changesOf, type Engine, type Transact } from './engine.js';
import { Output, type CommandOutput } from './output.js';
import * as P from '../model/legacy.js';
import * as Q from '../model/qosLegacy.js';
import * as Ops from '../state/operations.js';
import * as QOps from '../state/qosOperations.js';
import type { DesiredState } from '../state/state.js';
import type { Eip } from '../model/rules.js';
import { chain, unchanged, type OpResult } from '../state/operations.js';
import type { Config } from '../config/config.js';
import { shareDnatChainName } from '../model/shareDnatName.js';
import { runInit } from './init.js';
import { hasSecondaryUplinks, uplinkNames, type UplinkNetwork } from '../model/uplinks.js';

/**
 * The script's command line (SPEC §1–2), as operations on the desired state. Every rule of a
 * command is parsed before anything runs, and all its operations form one transaction: a bad
 * rule or a conflict anywhere changes nothing.
 */
interface MutatingCommand<T = unknown> {
  readonly guarded: boolean;
  readonly qos?: boolean;
  /** Parse one rule (throws ValidationError). */
  readonly parse: (rule: string, cfg: Config) => T;
  /** All of the command's rules as one change of the state. */
  readonly apply: (s: DesiredState, items: readonly T[], out: Output) => OpResult;
  /** What the parsed rules need from the kernel before the change (read outside the transaction). */
  readonly prepare?: (engine: Engine, items: readonly T[]) => Promise<readonly T[]>;
}

/** Define a command; the generic ties its parser's output to its apply's input. */
const command = <T>(c: MutatingCommand<T>): MutatingCommand => c as MutatingCommand;

/** Apply a single-rule operation to each item in turn. */
const each =
  <T>(op: (s: DesiredState, item: T, out: Output) => OpResult) =>
  (s: DesiredState, items: readonly T[], out: Output): OpResult => {
    let r = unchanged(s);
    for (const item of items) r = chain(r, (state) => op(state, item, out));
    return r;
  };

const mutating: Record<string, MutatingCommand> = {
  'subnet-route-add': command({ guarded: true, parse: P.parseRouteAdd, apply: each(Ops.addRoute) }),
  'subnet-route-del': command({ guarded: true, parse: P.parseRouteDel, apply: each(Ops.delRoute) }),
  'eip-add': command<{ eip: Eip; gateways: { v4?: string; v6?: string }; networks?: readonly UplinkNetwork[] }>({
    guarded: true,
    parse: (r, cfg) => ({ eip: P.parseEip(r), gateways: { v4: cfg.gatewayV4, v6: cfg.gatewayV6 } }),
    // With several external interfaces, the EIP's is found in the uplinks' networks (model/uplinks.ts).
    prepare: async (engine, items) => {
      const ifs = (engine.lastApplied ?? (await engine.loadState())).interfaces;
      if (!hasSecondaryUplinks(ifs)) return items;
      const networks = await engine.link.uplinkNetworks(uplinkNames(ifs));
      return items.map((v) => ({ ...v, networks }));
    },
    apply: each((s, v) => Ops.addEip(s, v.eip, v.gateways, v.networks)),
  }),
  'eip-del': command({ guarded: true, parse: (r) => P.parseEip(r).address, apply: each(Ops.delEip) }),
  'floating-ip-add': command({ guarded: true, parse: P.parseFipAdd, apply: Ops.addFips }),
  'floating-ip-del': command({ guarded: true, parse: P.parseFipDel, apply: Ops.delFips }),
  'dnat-add': command({ guarded: true, parse: P.parseDnatAdd, apply: Ops.addDnats }),
  'dnat-del': command({ guarded: true, parse: P.parseDnatDel, apply: Ops.delDnats }),
  'snat-add': command({ guarded: true, parse: P.parseSnatAdd, apply: Ops.addSnats }),
  'snat-del': command({ guarded: true, parse: P.parseSnatDel, apply: Ops.delSnats }),
  'nft-dnat-map-add': command({
    guarded: true,
    parse: P.parseShareDnatAdd,
    apply: each((s, v, out) => {
      const backends = v.backends.map((b) => `${b.ip}:${b.port}`).join('@');
      out.line(`Updated nft share dnat: ${v.eip}:${v.port} (${v.protocolText}) -> ${backends} (chain=${shareDnatChainName(v)})`);
      return Ops.addShareDnat(s, v);
    }),
  }),
  'nft-dnat-map-del': command({
    guarded: true,
    parse: P.parseShareDnatDel,
    apply: each((s, v, out) => {
      out.line(`Deleted nft share dnat: ${v.eip}:${v.port} (${v.protocolText})`);
      return Ops.delShareDnat(s, v);
    }),
  }),
  'eip-ingress-qos-add': command({ guarded: false, qos: true, parse: (r) => Q.parseEipQosAdd(r, 'ingress'), apply: each(QOps.addEipQos) }),
  'eip-egress-qos-add': command({ guarded: false, qos: true, parse: (r) => Q.parseEipQosAdd(r, 'egress'), apply: each(QOps.addEipQos) }),
  'eip-ingress-qos-del': command<string>({
    guarded: false,
    qos: true,
    parse: (r) => Q.parseEipQosDel(r, 'ingress'),
    apply: each((s, ip) => QOps.delEipQos(s, 'ingress', ip)),
  }),
  'eip-egress-qos-del': command<string>({
    guarded: false,
    qos: true,
    parse: (r) => Q.parseEipQosDel(r, 'egress'),
    apply: each((s, ip) => QOps.delEipQos(s, 'egress', ip)),
  }),
  'qos-add': command({ guarded: false, qos: true, parse: Q.parseGwQos, apply: each(QOps.addGwQos) }),
  'qos-del': command({ guarded: false, qos: true, parse: Q.parseGwQosDel, apply: each(QOps.delGwQos) }),
};

export const LEGACY_COMMANDS = ['init', 'get-iptables-version', ...Object.keys(mutating)] as const;

export const HELP = `Usage: nat-gateway.sh <command> [rule ...]

Commands:
  init [vpcIf,extIf[,extIf...]]           prepare the gateway (waits for late interfaces)
  get-iptables-version                    print the iptables version in use
  subnet-route-add cidr,nexthop ...       route VPC subnets via the VPC interface
  subnet-route-del cidr ...               remove those routes
  eip-add ip/len ...                      add EIPs on the external interface
  eip-del ip/len ...                      remove EIPs
  floating-ip-add eip,internalIp ...      bind a floating IP (1:1 NAT)
  floating-ip-del eip ...                 unbind a floating IP
  dnat-add eip,port,protocol,ip,port ...  forward an EIP port to a VPC address
  dnat-del eip,port,protocol ...          remove a port forward
  snat-add eip,cidr[,--random-fully] ...  source-NAT a VPC CIDR behind an EIP
  snat-del eip,cidr ...                   remove a source NAT
  nft-dnat-map-add eip,port,protocol,ip:port@ip:port...   share DNAT (load balance)
  nft-dnat-map-del eip,port,protocol ...  remove a share DNAT
  eip-ingress-qos-add ip,priority,rate,burst ...   shape traffic to an EIP
  eip-egress-qos-add ip,priority,rate,burst ...    shape traffic from an EIP
  eip-ingress-qos-del ip ... / eip-egress-qos-del ip ...
  qos-add direction,dev,priority,classifier,matchType,matchDirection,cidr,rate,burst ...
  qos-del direction,dev,priority,classifier,matchType,matchDirection,cidr,rate,burst ...
  help                                    this text`;

/** The script word-split its arguments; a rule never contains white space. */
function rulesOf(args: readonly string[]): string[] {
  return args.flatMap((a) => a.split(/\s+/)).filter((a) => a !== '');
}

/**
 * Run one script command. Its change goes through `transact`: the engine's own (the shim, a
 * command of its own in the daemon's queue) or the daemon's batcher's, which merges it with
 * the commands that arrive meanwhile (ChangeBatcher.transact).
 */
export async function runLegacy(
  engine: Engine,
  command: string | undefined,
  args: readonly string[],
  transact: Transact = (fn, opts) => engine.transact(fn, opts),
): Promise<CommandOutput> {
  const out = new Output();
  const cmd = command ?? '';
  if (cmd === 'help' || cmd === '--help' || cmd === '-h') {
    out.line(HELP);
    return out.result(0);
  }
  if (cmd === 'init') return runInit(engine, args, out);
  const spec = mutating[cmd];
  if (cmd !== 'get-iptables-version' && !spec) {
    out.line(`Unknown command: ${cmd}`);
    out.line('');
    out.line(HELP);
    return out.result(1);
  }
  const rules = rulesOf(args);
  out.line(`${cmd} ${args.join(' ')}`);
  const log = engine.log.child({ command: cmd });
  const started = Date.now();
  try {
    if (!spec) {
      out.line(await (await engine.backends.choose()).versionLine());
      return out.result(0);
    }
    const parsed = rules.map((r) => spec.parse(r, engine.config));
    const items = spec.prepare ? await spec.prepare(engine, parsed) : parsed;
    const { report } = await transact(({ state }) => spec.apply(state, items, out), { guarded: spec.guarded, qos: spec.qos ?? false });
    for (const n of report.notes) out.line(n);
    log.info({ rules, ms: Date.now() - started, changes: changesOf(report) }, 'command done');
    return out.result(0);
  } catch (e) {
    return out.failure(e, log, rules);
  }
}
