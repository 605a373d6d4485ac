/**
 * Draining an EIP out of a SNAT pool, the pure parts: the schema's checks, the rule the kernel
 * gets in either backend (the pool less its draining EIPs), the count of connections still
 * translated to a draining EIP, and the status line. Real traffic: test/netns/snat-draining.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { activeSnat, snatSchema } from '../../src/model/rules.js';
import { snatSpecs } from '../../src/dataplane/netfilter/iptables/ruleText.js';
import { ruleText, snatRule } from '../../src/dataplane/netfilter/nft/render.js';
import { countSnatTo, drainingPairs, srcNatListArgs } from '../../src/dataplane/draining.js';
import { parseConntrackLines } from '../../src/model/conntrackLine.js';
import { buildStatus } from '../../src/api/status.js';
import type { Readiness, StateDocument } from '../../src/api/bodies.js';
import { desiredStateSchema } from '../../src/state/state.js';
import { renderStatus } from '../../src/cli/render.js';

const A = '172.20.0.10';
const B = '172.20.0.11';
const C = '172.20.0.12';
const CIDR = '10.0.1.0/24';

const issues = (x: unknown): string[] => {
  const r = snatSchema.safeParse(x);
  return r.success ? [] : r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`);
};

describe('draining in the SNAT schema', () => {
  it('accepts EIPs of the pool, leaving at least one taking new connections', () => {
    expect(issues({ eip: A, cidr: CIDR, eips: [A, B, C], draining: [B] })).toEqual([]);
    expect(issues({ eip: A, cidr: CIDR, eips: [A, B, C], draining: [A, C] })).toEqual([]);
  });

  it('refuses an address outside the pool, a repeat, and draining the whole pool, saying why', () => {
    expect(issues({ eip: A, cidr: CIDR, eips: [A, B], draining: [C] })).toEqual([`draining: ${C} is not an EIP of this SNAT's pool (${A}, ${B})`]);
    expect(issues({ eip: A, cidr: CIDR, eips: [A, B, C], draining: [B, B] })).toEqual(['draining: must not repeat an address']);
    expect(issues({ eip: A, cidr: CIDR, eips: [A, B], draining: [A, B] })[0]).toMatch(
      /^draining: must leave at least one EIP of the pool taking new connections/,
    );
    // A plain SNAT is a pool of one: draining it would stop translating.
    expect(issues({ eip: A, cidr: CIDR, draining: [A] })[0]).toMatch(/^draining: must leave at least one/);
    expect(issues({ eip: A, cidr: CIDR, eips: [A, B], draining: [] })[0]).toMatch(/^draining: /);
  });
});

describe('the rule of a pool with draining EIPs', () => {
  const pool = snatSchema.parse({ eip: A, cidr: CIDR, eips: [A, B, C], draining: [B], randomFully: true });

  it('leaves the draining EIPs out of the pool, keeping the order of the others', () => {
    expect(activeSnat(pool)).toEqual({ eip: A, cidr: CIDR, randomFully: true, eips: [A, C] });
    // A pool of one left is a plain SNAT to it, even when the identity's own EIP drains.
    expect(activeSnat(snatSchema.parse({ eip: A, cidr: CIDR, eips: [A, B], draining: [A] }))).toEqual({ eip: B, cidr: CIDR, randomFully: false });
    const plain = snatSchema.parse({ eip: A, cidr: CIDR, eips: [A, B] });
    expect(activeSnat(plain)).toBe(plain);
  });

  it('renders so in iptables (nth over the active EIPs) and nftables (numgen over them)', () => {
    expect(snatSpecs(pool, 'net1')).toEqual([
      `-s ${CIDR} -o net1 -m statistic --mode nth --every 2 --packet 0 -j SNAT --to-source ${A} --random-fully`,
      `-s ${CIDR} -o net1 -j SNAT --to-source ${C} --random-fully`,
    ]);
    expect(ruleText(snatRule(pool), 'ip')).toBe(`ip saddr ${CIDR} snat ip to numgen inc mod 2 map { 0 : ${A}, 1 : ${C} } fully-random`);
    const one = snatSchema.parse({ eip: A, cidr: CIDR, eips: [A, B], draining: [A] });
    expect(snatSpecs(one, 'net1')).toEqual([`-s ${CIDR} -o net1 -j SNAT --to-source ${B}`]);
    expect(ruleText(snatRule(one), 'ip')).toBe(`ip saddr ${CIDR} snat ip to ${B}`);
  });
});

describe('connections left on a draining EIP', () => {
  // conntrack -L --src-nat 172.20.0.11: two from the CIDR through the pool, one from another
  // CIDR, and a hairpin connection (its destination rewritten too) that belongs to a DNAT.
  const listing = [
    `tcp      6 431999 ESTABLISHED src=10.0.1.6 dst=172.20.0.100 sport=40000 dport=7101 src=172.20.0.100 dst=${B} sport=7101 dport=40000 [ASSURED] mark=0 use=1`,
    `udp      17 29 src=10.0.1.7 dst=172.20.0.100 sport=5353 dport=53 [UNREPLIED] src=172.20.0.100 dst=${B} sport=53 dport=5353 mark=0 use=1`,
    `tcp      6 431999 ESTABLISHED src=10.0.2.5 dst=172.20.0.100 sport=40001 dport=7101 src=172.20.0.100 dst=${B} sport=7101 dport=40001 [ASSURED] mark=0 use=1`,
    `tcp      6 431999 ESTABLISHED src=10.0.1.7 dst=${B} sport=40002 dport=8080 src=10.0.1.6 dst=${B} sport=80 dport=40002 [ASSURED] mark=0 use=1`,
  ].join('\n');

  it('counts the entries source-NATed to the EIP from the CIDR, and only those', () => {
    const entries = parseConntrackLines(listing);
    expect(countSnatTo(entries, B, CIDR)).toBe(2);
    expect(countSnatTo(entries, B, '10.0.2.0/24')).toBe(1);
    expect(countSnatTo(entries, C, CIDR)).toBe(0);
  });

  it('lists per EIP and family with conntrack filtering in the kernel', () => {
    expect(srcNatListArgs(B)).toEqual(['-L', '-f', 'ipv4', '--src-nat', B]);
    expect(srcNatListArgs('fd00:20::10')).toEqual(['-L', '-f', 'ipv6', '--src-nat', 'fd00:20::10']);
  });

  it('pairs each SNAT with its draining EIPs', () => {
    const s = desiredStateSchema.parse({
      initialized: true,
      interfaces: { vpc: 'eth0', ext: 'net1' },
      snats: [
        { eip: A, cidr: CIDR, eips: [A, B, C], draining: [C, B] },
        { eip: A, cidr: '10.0.2.0/24' },
      ],
    });
    expect(drainingPairs(s.snats).map((p) => [p.snat.cidr, p.eip])).toEqual([
      [CIDR, C],
      [CIDR, B],
    ]);
  });
});

describe('the status of a draining EIP', () => {
  const desired = desiredStateSchema.parse({
    initialized: true,
    interfaces: { vpc: 'eth0', ext: 'net1' },
    snats: [{ eip: A, cidr: CIDR, eips: [A, B], draining: [B] }],
  });
  const readiness: Readiness = { ready: true, interfaces: { present: true, missing: [] }, lastSync: { ok: true, at: '2026-01-01T00:00:00.000Z' }, reasons: [] };
  const doc: StateDocument = {
    desired,
    lastApplied: desired,
    drift: { last: null, lastRepair: null, repairs: 0 },
    backend: { kind: 'nftables' },
    mode: 'auto',
    generation: 1,
    digest: 'sha256:x',
  };

  it('renders each draining EIP with the connections it still carries, and nothing while none drains', () => {
    // The route adds the agent's count to the document (as GET /v1/status does).
    const s = { ...buildStatus(doc, readiness, null), draining: [{ snat: { eip: A, cidr: CIDR }, eip: B, connections: 3 }] };
    expect(renderStatus(s)).toContain(`Draining:    ${B} out of snat ${A},${CIDR}: 3 connections left\n`);
    const unknown = { ...buildStatus(doc, readiness, null), draining: [{ snat: { eip: A, cidr: CIDR }, eip: B, connections: null }] };
    expect(renderStatus(unknown)).toContain('connections unknown (conntrack unreadable)');
    expect(renderStatus(buildStatus(doc, readiness, null))).not.toContain('Draining');
  });
});
