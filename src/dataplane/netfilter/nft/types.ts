/**
 * The shapes the nft renderer and the read-back both speak: natgw's rules, a table as `nft -j`
 * lists it, and that table with its rules recognised. The read-back calls the renderer (it
 * recognises a rule by rendering its JSON), and the renderer diffs against what the read-back
 * returns; with these shapes here, neither module imports the other both ways.
 */
import type { BaseHook } from '../tables/model.js';

export type NftFamily = 'ip' | 'ip6';

/** A SNAT source-port range (a replica's slice). */
export interface SnatPorts {
  readonly lo: number;
  readonly hi: number;
}

export type NatgwRule =
  | { readonly kind: 'vpc-mark'; readonly vpcIf: string }
  | { readonly kind: 'fip-dnat' }
  | { readonly kind: 'port-dnat' }
  | { readonly kind: 'fip-snat' }
  | { readonly kind: 'snat-jump'; readonly extIf: string }
  | { readonly kind: 'hairpin'; readonly vpcIf: string; readonly ports?: SnatPorts }
  | {
      readonly kind: 'snat';
      readonly cidr: string;
      readonly eip: string;
      readonly randomFully: boolean;
      /** A pool (its first address is eip): new connections take its EIPs in turn. */
      readonly pool?: readonly string[];
      /** TCP and UDP only, into these source ports (a replica's slice); the rule without them follows for the rest. */
      readonly ports?: SnatPorts;
    }
  /** One of shared_snat's three dispatch rules for a prefix length (snatLayout.ts): to CIDR chains, or to the EIP a data map holds. */
  | { readonly kind: 'snat-dispatch'; readonly len: number; readonly via: 'chain' | 'eip' | 'eip-fr'; readonly ports?: SnatPorts }
  /** An active-active replica's rules in forward and input (render.ts dropInvalidChains says why). */
  | { readonly kind: 'drop-invalid' }
  | { readonly kind: 'hand-off'; readonly packets: 'invalid' | 'new-udp'; readonly ifs: readonly string[]; readonly peer: string; readonly rate: number }
  | { readonly kind: 'invalid-own-socket' }
  | { readonly kind: 'new-udp-own-socket' }
  | { readonly kind: 'drop-new-udp' }
  /** A port-range DNAT: each port of port-portEnd maps onto the same port of internalIp. */
  | {
      readonly kind: 'range-dnat';
      readonly eip: string;
      readonly protocol: 'tcp' | 'udp';
      readonly port: number;
      readonly portEnd: number;
      readonly internalIp: string;
    };

export type SnatRule = Extract<NatgwRule, { kind: 'snat' }>;

export interface NftRuleDump {
  readonly handle: number;
  readonly expr: readonly unknown[];
}

export interface NftChainDump {
  readonly name: string;
  readonly handle: number;
  /** Absent for a regular chain. */
  readonly base?: BaseHook;
  readonly rules: NftRuleDump[];
}

export interface NftElementDump {
  /** Canonical text as natgw renders it: `1.2.3.4 . tcp . 80`. */
  readonly key: string;
  /** For maps: `10.0.1.6 . 8080`, `goto dnat-…`; undefined for a plain set. */
  readonly value?: string;
  /** In a set declared with `counter` (per-EIP accounting). */
  readonly counter?: { readonly packets: number; readonly bytes: number };
}

export interface NftSetDump {
  readonly name: string;
  readonly handle: number;
  readonly kind: 'set' | 'map';
  /** Key type, concatenations joined with ` . `. */
  readonly type: string;
  /** Data type of a map. */
  readonly map?: string;
  readonly flags: readonly string[];
  /** Declared with `counter` (nft lists it as a statement, not a flag). */
  readonly counter?: boolean;
  readonly elements: readonly NftElementDump[];
}

export interface NftTableDump {
  readonly family: string;
  readonly name: string;
  /** The kernel's handle of the table (a new one each time it is created); absent where unknown. */
  readonly handle?: number;
  /** In listing order. */
  readonly chains: ReadonlyMap<string, NftChainDump>;
  readonly sets: ReadonlyMap<string, NftSetDump>;
}

/** A rule in a natgw chain as the renderer sees it: recognised (or null) with its handle. */
export interface OwnedRule {
  readonly handle: number;
  readonly rule: NatgwRule | null;
}

/** A natgw table as read back, with every chain's rules recognised (or not) as natgw's. */
export interface OwnedTable extends NftTableDump {
  readonly owned: ReadonlyMap<string, readonly OwnedRule[]>;
}

/** The kernel side natgw diffs against: one table per family, null when it is absent. */
export interface NatgwKernel {
  readonly ip: OwnedTable | null;
  readonly ip6: OwnedTable | null;
}
