import type { Engine } from './engine.js';
import { Output, type CommandOutput } from './output.js';
import { NatgwError } from '../model/errors.js';
import * as P from '../model/legacy.js';
import * as Q from '../model/qosLegacy.js';
import * as Ops from '../state/operations.js';
import * as QOps from '../state/qosOperations.js';
import type { DesiredState } from '../state/state.js';
import type { OpResult } from '../state/operations.js';
import type { Config } from '../config/config.js';
import { shareDnatChainName } from '../model/shareDnatName.js';
import { runInit } from './init.js';

/**
 * The script's command line (SPEC §1–2), as operations on the desired state. Every rule of a
 * command is parsed before anything runs, and all its operations form one transaction: a bad
 * rule or a conflict anywhere changes nothing.
 */
interface MutatingCommand {
  readonly guarded: boolean;
  readonly qos?: boolean;
  /** Parse one rule and return the operation it stands for (throws ValidationError). */
  readonly parse: (rule: string, cfg: Config) => (s: DesiredState, out: Output) => OpResult;
}

const mutating: Record<string, MutatingCommand> = {
  'subnet-route-add': { guarded: true, parse: (r) => { const v = P.parseRouteAdd(r); return (s) => Ops.addRoute(s, v); } },
  'subnet-route-del': { guarded: true, parse: (r) => { const v = P.parseRouteDel(r); return (s) => Ops.delRoute(s, v); } },
  'eip-add': {
    guarded: true,
    parse: (r, cfg) => {
      const v = P.parseEip(r);
      return (s) => Ops.addEip(s, v, { v4: cfg.gatewayV4, v6: cfg.gatewayV6 });
    },
  },
  'eip-del': { guarded: true, parse: (r) => { const v = P.parseEip(r); return (s) => Ops.delEip(s, v.address); } },
  'floating-ip-add': { guarded: true, parse: (r) => { const v = P.parseFipAdd(r); return (s) => Ops.addFip(s, v); } },
  'floating-ip-del': { guarded: true, parse: (r) => { const v = P.parseFipDel(r); return (s) => Ops.delFip(s, v); } },
  'dnat-add': { guarded: true, parse: (r) => { const v = P.parseDnatAdd(r); return (s) => Ops.addDnat(s, v); } },
  'dnat-del': { guarded: true, parse: (r) => { const v = P.parseDnatDel(r); return (s) => Ops.delDnat(s, v); } },
  'snat-add': { guarded: true, parse: (r) => { const v = P.parseSnatAdd(r); return (s) => Ops.addSnat(s, v); } },
  'snat-del': { guarded: true, parse: (r) => { const v = P.parseSnatDel(r); return (s) => Ops.delSnat(s, v); } },
  'nft-dnat-map-add': {
    guarded: true,
    parse: (r) => {
      const v = P.parseShareDnatAdd(r);
      return (s, out) => {
        out.line(`Updated nft share dnat: ${v.eip}:${v.port} (${v.protocolText}) -> ${v.backends.map((b) => `${b.ip}:${b.port}`).join('@')} (chain=${shareDnatChainName(v)})`);
        return Ops.addShareDnat(s, v);
      };
    },
  },
  'nft-dnat-map-del': {
    guarded: true,
    parse: (r) => {
      const v = P.parseShareDnatDel(r);
      return (s, out) => {
        out.line(`Deleted nft share dnat: ${v.eip}:${v.port} (${v.protocolText})`);
        return Ops.delShareDnat(s, v);
      };
    },
  },
  'eip-ingress-qos-add': { guarded: false, qos: true, parse: (r) => { const v = Q.parseEipQosAdd(r, 'ingress'); return (s) => QOps.addEipQos(s, v); } },
  'eip-egress-qos-add': { guarded: false, qos: true, parse: (r) => { const v = Q.parseEipQosAdd(r, 'egress'); return (s) => QOps.addEipQos(s, v); } },
  'eip-ingress-qos-del': { guarded: false, qos: true, parse: (r) => { const v = Q.parseEipQosDel(r, 'ingress'); return (s) => QOps.delEipQos(s, 'ingress', v); } },
  'eip-egress-qos-del': { guarded: false, qos: true, parse: (r) => { const v = Q.parseEipQosDel(r, 'egress'); return (s) => QOps.delEipQos(s, 'egress', v); } },
  'qos-add': { guarded: false, qos: true, parse: (r) => { const v = Q.parseGwQos(r); return (s) => QOps.addGwQos(s, v); } },
  'qos-del': { guarded: false, qos: true, parse: (r) => { const v = Q.parseGwQosDel(r); return (s) => QOps.delGwQos(s, v); } },
};

export const LEGACY_COMMANDS = ['init', 'get-iptables-version', ...Object.keys(mutating)] as const;

export const HELP = `Usage: nat-gateway.sh <command> [rule ...]

Commands:
  init [vpcIf,extIf]                      prepare the gateway (waits for late interfaces)
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

export async function runLegacy(engine: Engine, command: string | undefined, args: readonly string[]): Promise<CommandOutput> {
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
      out.line(await (await engine.peekBackend()).versionLine());
      return out.result(0);
    }
    const ops = rules.map((r) => spec.parse(r, engine.config));
    const { report } = await engine.transact(
      ({ state }) => {
        let acc: OpResult = { state, effects: [] };
        for (const op of ops) {
          const r = op(acc.state, out);
          acc = { state: r.state, effects: [...acc.effects, ...r.effects] };
        }
        return acc;
      },
      { guarded: spec.guarded, qos: spec.qos ?? false },
    );
    for (const n of report.notes) out.line(n);
    log.info({ rules, ms: Date.now() - started, changes: report.netfilterChanges + report.linkChanges + report.shareDnatChanges + report.qosChanges }, 'command done');
    return out.result(0);
  } catch (e) {
    return failure(out, e, log, rules);
  }
}

export function failure(out: Output, e: unknown, log: Engine['log'], rules?: readonly string[]): CommandOutput {
  if (e instanceof NatgwError) {
    if (e.stream === 'stdout') out.line(e.message);
    else out.error(e.message);
    log.info({ rules, kind: e.kind, reason: e.message }, 'command refused');
  } else {
    const msg = e instanceof Error ? e.message : String(e);
    out.error(msg.startsWith('Error:') ? msg : `Error: ${msg}`);
    log.error({ rules, err: e }, 'command failed');
  }
  return out.result(1);
}
