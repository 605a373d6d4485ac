import { z } from 'zod';
import { isIpv4 } from '../model/net.js';
import type { Dnat, LinkView, NatView, RouteView } from './plan.js';
import { NFT_DNAT_MAP, NFT_MASQ_SET, NFT_TABLE } from './render.js';
import { ROUTE_TABLE } from './plan.js';

/**
 * What the kernel holds, from the tools' listings: pure parsers. Reads use the tools' machine
 * formats (JSON) where they have one; iptables has only `iptables-save`, whose rule lines are
 * its documented, stable input format.
 */

const IP = String.raw`(\d{1,3}(?:\.\d{1,3}){3})`;
const DNAT_LINE = new RegExp(String.raw`^-A PREROUTING -d ${IP}/32 -p (tcp|udp|sctp) -m \2 --dport (\d{1,5}) -j DNAT --to-destination ${IP}:(\d{1,5})$`);
const MASQ_LINE = new RegExp(`^-A POSTROUTING -d ${IP}/32 -j MASQUERADE$`);

/**
 * The DNATs and MASQUERADEs of the script's form in `iptables-save -t nat` output. Those are
 * natgw's (or the script's, which natgw adopts); any other rule is left alone.
 */
export function parseIptablesNat(save: string): NatView {
  const dnats: Dnat[] = [];
  const masquerades: string[] = [];
  for (const line of save.split('\n')) {
    const d = DNAT_LINE.exec(line);
    if (d) {
      const [, eip = '', protocol, port, internalIp = '', internalPort] = d;
      if (isIpv4(eip) && isIpv4(internalIp)) {
        dnats.push({ eip, protocol: protocol as Dnat['protocol'], port: Number(port), internalIp, internalPort: Number(internalPort) });
      }
      continue;
    }
    const m = MASQ_LINE.exec(line);
    if (m?.[1] && isIpv4(m[1])) masquerades.push(m[1]);
  }
  return { dnats, masquerades };
}

const concat = z.object({ concat: z.array(z.union([z.string(), z.number()])) });
const nftListing = z.object({ nftables: z.array(z.record(z.string(), z.unknown())) });
const nftMap = z.object({ name: z.string(), elem: z.array(z.tuple([concat, concat])).optional() });
const nftSet = z.object({ name: z.string(), elem: z.array(z.string()).optional() });
const nftChain = z.object({ name: z.string(), hook: z.string().optional() });
const nftRule = z.object({ chain: z.string() });

export interface NftView extends NatView {
  /** The map, the set, both base chains and one rule in each: else the next transaction redeclares them. */
  readonly intact: boolean;
}

/** `nft -j list table ip natgw_lbsvc`. */
export function parseNftTable(json: string): NftView {
  const parsed = nftListing.safeParse(JSON.parse(json));
  if (!parsed.success) throw new Error(`unexpected nft listing of table ${NFT_TABLE}: ${parsed.error.issues[0]?.message ?? ''}`);
  const dnats: Dnat[] = [];
  const masquerades: string[] = [];
  const found = new Set<string>();
  const rules = new Map<string, number>();
  for (const o of parsed.data.nftables) {
    const map = nftMap.safeParse(o.map);
    const set = nftSet.safeParse(o.set);
    const chain = nftChain.safeParse(o.chain);
    const rule = nftRule.safeParse(o.rule);
    if (map.success && map.data.name === NFT_DNAT_MAP) {
      found.add('map');
      for (const [key, value] of map.data.elem ?? []) {
        const [eip, protocol, port] = key.concat;
        const [internalIp, internalPort] = value.concat;
        if (typeof eip === 'string' && (protocol === 'tcp' || protocol === 'udp' || protocol === 'sctp') && typeof internalIp === 'string') {
          dnats.push({ eip, protocol, port: Number(port), internalIp, internalPort: Number(internalPort) });
        }
      }
    } else if (set.success && set.data.name === NFT_MASQ_SET) {
      found.add('set');
      masquerades.push(...(set.data.elem ?? []));
    } else if (chain.success && chain.data.hook !== undefined) {
      found.add(`chain ${chain.data.name}`);
    } else if (rule.success) {
      rules.set(rule.data.chain, (rules.get(rule.data.chain) ?? 0) + 1);
    }
  }
  const intact =
    found.has('map') &&
    found.has('set') &&
    found.has('chain prerouting') &&
    found.has('chain postrouting') &&
    rules.get('prerouting') === 1 &&
    rules.get('postrouting') === 1;
  return { dnats, masquerades, intact };
}

/** Whether `nft -j list tables ip` names natgw's LB-service table. */
export function listsNftTable(json: string): boolean {
  const r = z.object({ nftables: z.array(z.record(z.string(), z.unknown())) }).safeParse(JSON.parse(json));
  return r.success && r.data.nftables.some((o) => (o.table as { name?: unknown } | undefined)?.name === NFT_TABLE);
}

const routes = z.array(z.object({ dst: z.string(), gateway: z.string().optional(), table: z.string().optional() }).loose());

/** Host routes of table 100 from `ip -4 -j route show table all`. */
export function parseRoutes(json: string): RouteView {
  const out = new Map<string, string>();
  for (const r of routes.parse(JSON.parse(json || '[]'))) {
    if (r.table === String(ROUTE_TABLE) && r.gateway !== undefined && isIpv4(r.dst)) out.set(r.dst, r.gateway);
  }
  return out;
}

const links = z.array(
  z
    .object({
      flags: z.array(z.string()).default([]),
      addr_info: z.array(z.object({ family: z.string() }).loose()).default([]),
    })
    .loose(),
);

/** `ip -j address show dev EXT`; undefined when the listing holds no link. */
export function parseLink(json: string): LinkView | undefined {
  const l = links.parse(JSON.parse(json || '[]'))[0];
  if (l === undefined) return undefined;
  return { up: l.flags.includes('UP'), arp: !l.flags.includes('NOARP'), hasIpv4: l.addr_info.some((a) => a.family === 'inet') };
}

const ipRules = z.array(z.object({ iif: z.string().optional(), table: z.string().optional() }).loose());

/** The interfaces that already have `iif <dev> lookup 100`, from `ip -j rule show`. */
export function parseRulesFrom(json: string): Set<string> {
  const out = new Set<string>();
  for (const r of ipRules.parse(JSON.parse(json || '[]'))) if (r.iif !== undefined && r.table === String(ROUTE_TABLE)) out.add(r.iif);
  return out;
}
