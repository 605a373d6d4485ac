/**
 * What the gateway holds at a given size, and the identities the per-command series add and
 * remove. Everything is a pure function of the size, so a larger size is a superset of a
 * smaller one and ascending sizes fill by difference.
 *
 * The mix is the issue's: at 10,000 → 10,000 DNAT + 10,000 FIP + 1,000 SNAT, scaled
 * proportionally. DNAT and SNAT share a pool of EIPs (one per 50 objects, 1..1000); a FIP's
 * EIP is an address on net1 only with `fipEips` (the controller does eip-add it, but 10,000
 * addresses on one link measure the link code more than NAT).
 */
export interface Mix {
  readonly size: number;
  readonly dnats: number;
  readonly fips: number;
  readonly snats: number;
  readonly eips: number;
}

export interface StateDoc {
  readonly initialized: true;
  readonly interfaces: { readonly vpc: string; readonly ext: string };
  readonly eips: { address: string; prefixLength: number }[];
  readonly snats: { eip: string; cidr: string; randomFully: boolean }[];
  readonly dnats: { eip: string; port: number; protocol: 'tcp' | 'udp'; internalIp: string; internalPort: number }[];
  readonly fips: { eip: string; internalIp: string }[];
}

export function mixOf(size: number, fipEips: boolean): Mix {
  const pool = poolSize(size);
  return { size, dnats: size, fips: size, snats: Math.max(1, Math.round(size / 10)), eips: pool + 1 + (fipEips ? size : 0) };
}

const poolSize = (size: number): number => Math.min(1000, Math.max(1, Math.round(size / 50)));

/** n → a.b.c.d inside a /16 whose first two octets are given, skipping .0 and .255 hosts. */
export const in16 = (a: number, b: number, n: number): string => `${a}.${b}.${1 + Math.floor(n / 250)}.${1 + (n % 250)}`;

/** The DNAT/SNAT EIP pool: 172.20.2.10 upwards, clear of ext's hosts in 172.20.0.0/24 and the probes. */
export const poolEip = (i: number): string => `172.20.${2 + Math.floor(i / 200)}.${10 + (i % 200)}`;

/**
 * The probes of the per-connection figure: the first DNAT of the state (lowest EIP, port 1)
 * and one added last (highest EIP, highest port), so either ordering of a linear chain puts
 * one at each end. Both lead to vpc1:80.
 */
export const PROBE = {
  first: { eip: '172.20.1.9', port: 1 },
  last: { eip: '172.20.250.250', port: 65000 },
  target: { ip: '10.0.1.6', port: 80 },
} as const;

export function stateDoc(size: number, fipEips: boolean): StateDoc {
  const pool = poolSize(size);
  const eips = [{ address: PROBE.first.eip, prefixLength: 16 }, ...Array.from({ length: pool }, (_, i) => ({ address: poolEip(i), prefixLength: 16 }))];
  const dnats: StateDoc['dnats'] = [
    { eip: PROBE.first.eip, port: PROBE.first.port, protocol: 'tcp', internalIp: PROBE.target.ip, internalPort: PROBE.target.port },
  ];
  for (let i = 0; i < size; i++) {
    const round = Math.floor(i / pool);
    dnats.push({
      eip: poolEip(i % pool),
      port: 1024 + round,
      protocol: round % 2 ? 'udp' : 'tcp',
      internalIp: in16(10, 1, i % 60000),
      internalPort: 80 + (i % 1000),
    });
  }
  const fips = Array.from({ length: size }, (_, i) => ({ eip: in16(172, 21, i), internalIp: in16(10, 2, i) }));
  if (fipEips) eips.push(...fips.map((f) => ({ address: f.eip, prefixLength: 16 })));
  // Mixed prefix lengths, so insertion keeps the longest-prefix-first order honest; host bits
  // are zero, and (second, third octet) is unique per rule, so no two canonicalise alike.
  const snats = Array.from({ length: mixOf(size, fipEips).snats }, (_, i) => ({
    eip: poolEip(i % pool),
    cidr: `10.${100 + ((i >> 8) & 127)}.${i & 255}.0/${24 + (i % 9)}`,
    randomFully: false,
  }));
  return { initialized: true, interfaces: { vpc: 'eth0', ext: 'net1' }, eips, snats, dnats, fips };
}

/**
 * Identities the per-command series create and delete again: sample k of a series. Disjoint
 * from the state at every size (ports from 40000, other /16s), and the API and the shim use
 * different k ranges so a failed cleanup of one cannot collide with the other.
 */
export const op = {
  dnat: (k: number) => ({ eip: poolEip(0), port: 40000 + k, protocol: 'udp' as const, internalIp: '10.0.1.9', internalPort: 53 }),
  snat: (k: number) => ({ eip: poolEip(0), cidr: `192.${168 + Math.floor(k / 256)}.${k % 256}.0/24` }),
  fip: (k: number) => ({ eip: in16(172, 22, k), internalIp: in16(10, 3, k) }),
};
export const SHIM_K0 = 5000;
/** The warm-up rounds' identities (bench/run.ts), apart from the measured ones: API, then shim. */
export const WARMUP_K0 = 10_000;
export const WARMUP_SHIM_K0 = 15_000;
