import { prng } from './prng.js';

/**
 * A seeded state document that exercises every branch of the NAT renderers: both families,
 * rules in no particular order, DNAT port ranges and both protocols, SNAT pools, fully-random
 * and a /0 source, several floating IPs on one internal IP, and repeated identities (the
 * first copy wins). Parsed by desiredStateSchema; the stored renderings in
 * test/fixtures/render pin the renderers' bytes for it.
 */
export function variedStateDoc(seed: number, n: number): Record<string, unknown> {
  const rnd = prng(seed);
  const int = (k: number): number => Math.floor(rnd() * k);
  const v4 = (a: number, i: number): string => `${a}.${int(4)}.${1 + Math.floor(i / 250)}.${1 + (i % 250)}`;
  const v6 = (p: string, i: number): string => `2001:db8:${p}::${(i + 1).toString(16)}`;
  const shuffle = <T>(xs: T[]): T[] => {
    for (let i = xs.length - 1; i > 0; i--) {
      const j = int(i + 1);
      [xs[i], xs[j]] = [xs[j] as T, xs[i] as T];
    }
    return xs;
  };
  const eips4 = Array.from({ length: Math.max(2, n >> 3) }, (_, i) => `172.20.${2 + (i >> 7)}.${10 + (i & 127)}`);
  const eips6 = Array.from({ length: 3 }, (_, i) => v6('e', i));
  const pick = <T>(xs: readonly T[]): T => xs[int(xs.length)] as T;
  const dnats: Record<string, unknown>[] = [];
  for (let i = 0; i < n; i++) {
    const six = i % 17 === 0;
    const port = 1000 + i * 3;
    const range = i % 23 === 0;
    dnats.push({
      eip: six ? pick(eips6) : pick(eips4),
      port,
      ...(range ? { portEnd: port + 2 } : {}),
      protocol: int(2) ? 'udp' : 'tcp',
      internalIp: six ? v6('1', i) : v4(10, i),
      internalPort: range ? port : 1 + int(65535),
    });
  }
  // A repeated identity with another target: the first stays.
  dnats.push({ ...(dnats[1] as object), internalPort: 9 });
  const fips: Record<string, unknown>[] = [];
  for (let i = 0; i < n; i++) {
    const six = i % 19 === 0;
    fips.push({ eip: six ? v6('f', i) : `172.21.${1 + Math.floor(i / 250)}.${1 + (i % 250)}`, internalIp: six ? v6('2', i >> 1) : v4(10, 5000 + (i >> 1)) });
  }
  fips.push({ ...(fips[2] as object), internalIp: '10.9.9.9' });
  const snats: Record<string, unknown>[] = [];
  for (let i = 0; i < Math.max(4, n >> 2); i++) {
    const pool = i % 7 === 0 ? [pick(eips4), '172.20.99.1', '172.20.99.2'] : undefined;
    const eip = pool ? pool[0] : pick(eips4);
    snats.push({ eip, cidr: `10.${100 + (i >> 8)}.${i & 255}.0/${24 + (i % 9)}`, randomFully: i % 3 === 0, ...(pool ? { eips: pool } : {}) });
  }
  snats.push({ eip: pick(eips4), cidr: '0.0.0.0/0', randomFully: false });
  snats.push({ eip: eips6[0], cidr: '2001:db8:5::/64', randomFully: true });
  snats.push({ ...(snats[0] as object) });
  return {
    initialized: true,
    interfaces: { vpc: 'eth0', ext: 'net1' },
    eips: shuffle([...eips4, ...eips6, eips4[0] as string].map((address) => ({ address, prefixLength: address.includes(':') ? 64 : 16 }))),
    snats,
    dnats: shuffle(dnats),
    fips: shuffle(fips),
  };
}
