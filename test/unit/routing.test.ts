/**
 * EIPs announced by BGP (issue 30): the configuration keys, the decision to announce, the
 * rendered bird.conf, the parsers of BIRD's control replies (fed with replies as BIRD 2
 * prints them with `birdc -v`), and the manager's reloads with BIRD and the kernel faked.
 */
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig, type Config } from '../../src/config/config.js';
import { ReplicaRole } from '../../src/engine/replicaRole.js';
import { errorOf, parseBfdSessions, parseProtocols, parseReplies, parseRoutePrefixes } from '../../src/routing/birdc.js';
import { announceOf, gateOf, prefixOf } from '../../src/routing/plan.js';
import { RoutingManager } from '../../src/routing/manager.js';
import { renderBirdConf, routerIdOf, sessionsOf } from '../../src/routing/render.js';
import type { Executor } from '../../src/system/exec.js';
import { waitFor } from '../helpers/poll.js';

const load = (env: Record<string, string>) => loadConfig({ NATGW_ENV_FILE: '/nonexistent/natgw-routing-test.env', ...env });

describe('BGP configuration', () => {
  it('off without NATGW_BGP_PEERS', async () => {
    expect((await load({})).bgp).toBeUndefined();
  });

  it('peers, AS numbers, BFD defaults; peers canonical and once each', async () => {
    const c = await load({ NATGW_BGP_PEERS: '172.20.0.1, FD00::1,172.20.0.1', NATGW_BGP_ASN: '65001', NATGW_BGP_PEER_ASN: '4200000000' });
    expect(c.bgp).toEqual({
      peers: ['172.20.0.1', 'fd00::1'],
      asn: 65001,
      peerAsn: 4_200_000_000,
      routerId: undefined,
      bfd: { intervalMs: 300, multiplier: 3 },
      bird: 'bird',
      birdc: 'birdc',
    });
    const off = await load({ NATGW_BGP_PEERS: '172.20.0.1', NATGW_BGP_ASN: '65001', NATGW_BGP_PEER_ASN: '65000', NATGW_BFD: 'off' });
    expect(off.bgp?.bfd).toBeNull();
    const fast = await load({
      NATGW_BGP_PEERS: '172.20.0.1',
      NATGW_BGP_ASN: '65001',
      NATGW_BGP_PEER_ASN: '65000',
      NATGW_BFD_INTERVAL: '100ms',
      NATGW_BFD_MULTIPLIER: '5',
    });
    expect(fast.bgp?.bfd).toEqual({ intervalMs: 100, multiplier: 5 });
  });

  it('peers without AS numbers: the message names the missing keys and how to fix it', async () => {
    const e = await load({ NATGW_BGP_PEERS: '172.20.0.1', NATGW_BGP_ASN: '65001' }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ConfigError);
    expect((e as Error).message).toMatch(/NATGW_BGP_PEERS is set, so NATGW_BGP_PEER_ASN must be set too.*or unset NATGW_BGP_PEERS/);
  });

  it.each([
    [{ NATGW_BGP_PEERS: 'router1' }, /NATGW_BGP_PEERS: must be one to eight IP addresses/],
    [{ NATGW_BGP_PEERS: '172.20.0.1', NATGW_BGP_ASN: '0', NATGW_BGP_PEER_ASN: '65000' }, /NATGW_BGP_ASN: must be an AS number from 1 to 4294967295/],
    [{ NATGW_BGP_PEERS: '172.20.0.1', NATGW_BGP_ASN: '1', NATGW_BGP_PEER_ASN: '4294967296' }, /NATGW_BGP_PEER_ASN: must be an AS number/],
    [{ NATGW_BGP_ROUTER_ID: 'fd00::1' }, /NATGW_BGP_ROUTER_ID: must be an IPv4 address/],
    [{ NATGW_BFD_INTERVAL: '5ms' }, /NATGW_BFD_INTERVAL: must be between 10ms and 10s/],
    [{ NATGW_BFD_MULTIPLIER: '0' }, /NATGW_BFD_MULTIPLIER: must be a whole number from 1 to 255/],
  ])('refuses %o', async (env, msg) => {
    await expect(load(env)).rejects.toThrow(msg);
  });

  it('routed EIPs get no gratuitous ARP, whatever the role', () => {
    const bgp = { peers: ['172.20.0.1'], asn: 65001, peerAsn: 65000, bfd: null, bird: 'bird', birdc: 'birdc' };
    expect(new ReplicaRole({ bgp }).mayAnnounce('init', ['172.20.0.10'])).toBe(false);
    expect(new ReplicaRole({}).mayAnnounce('init', ['172.20.0.10'])).toBe(true);
  });
});

describe('the decision to announce', () => {
  const base = { ready: true, readyReasons: [], extUp: true, syncedSinceExtUp: true, role: 'active' as const };

  it('open only when ready, the external interface up and synced, and active', () => {
    expect(gateOf(base)).toEqual({ open: true, why: undefined, reasons: [] });
    expect(gateOf({ ...base, ready: false, readyReasons: ['waiting for interface(s) eth0'] })).toMatchObject({
      open: false,
      why: 'not-ready',
      reasons: ['not ready: waiting for interface(s) eth0'],
    });
    expect(gateOf({ ...base, extUp: false })).toMatchObject({ open: false, why: 'external-down' });
    expect(gateOf({ ...base, extUp: undefined })).toMatchObject({ open: false, why: 'external-down' });
    expect(gateOf({ ...base, syncedSinceExtUp: false }).reasons[0]).toMatch(/waiting for a full sync/);
    expect(gateOf({ ...base, role: 'standby' })).toMatchObject({ open: false, why: 'standby' });
  });

  it('every EIP while open (canonical, sorted, once), none while closed', () => {
    const eips = ['172.20.0.11', 'FD00::A', '172.20.0.10', '172.20.0.10'];
    expect(announceOf(gateOf(base), eips)).toEqual(['172.20.0.10', '172.20.0.11', 'fd00::a']);
    expect(announceOf(gateOf({ ...base, ready: false, readyReasons: [] }), eips)).toEqual([]);
    expect(prefixOf('172.20.0.10')).toBe('172.20.0.10/32');
    expect(prefixOf('fd00::a')).toBe('fd00::a/128');
  });
});

describe('bird.conf', () => {
  it('a session per peer from this replica’s own address of its family; a peer without one is skipped with the fix', () => {
    expect(sessionsOf(['172.20.0.1', 'fd00::1', '172.20.0.2'], ['172.20.0.11', 'fd00::11'])).toEqual({
      sessions: [
        { name: 'natgw_peer1', peer: '172.20.0.1', local: '172.20.0.11' },
        { name: 'natgw_peer2', peer: 'fd00::1', local: 'fd00::11' },
        { name: 'natgw_peer3', peer: '172.20.0.2', local: '172.20.0.11' },
      ],
      skipped: [],
    });
    const v4only = sessionsOf(['fd00::1', '172.20.0.1'], ['172.20.0.11']);
    expect(v4only.sessions).toEqual([{ name: 'natgw_peer2', peer: '172.20.0.1', local: '172.20.0.11' }]);
    expect(v4only.skipped[0]?.reason).toMatch(/no IPv6 address of this replica's own.*remove fd00::1 from NATGW_BGP_PEERS/);
    expect(routerIdOf(undefined, ['fd00::11', '172.20.0.11'])).toBe('172.20.0.11');
    expect(routerIdOf('10.255.0.1', ['172.20.0.11'])).toBe('10.255.0.1');
    expect(routerIdOf(undefined, ['fd00::11'])).toBeUndefined();
  });

  const input = {
    routerId: '172.20.0.11',
    asn: 65001,
    peerAsn: 65000,
    extInterface: 'net1',
    bfd: { intervalMs: 100, multiplier: 3 },
    sessions: [
      { name: 'natgw_peer1', peer: '172.20.0.1', local: '172.20.0.11' },
      { name: 'natgw_peer2', peer: 'fd00::1', local: 'fd00::11' },
    ],
    announce: ['172.20.0.100', 'fd00::100'],
  };

  it('renders the EIPs as host routes exported to the peers of their family, next hop self, BFD, no graceful restart', () => {
    expect(renderBirdConf(input)).toBe(`# Rendered by natgw from its configuration and rewritten at every change: edits here are lost.
log stderr { info, remote, warning, error, auth, fatal, bug };
timeformat protocol iso long;
router id 172.20.0.11;

protocol device {}

protocol bfd natgw_bfd {
  interface "net1" { interval 100 ms; multiplier 3; };
}

protocol static natgw_eips4 {
  ipv4;
  route 172.20.0.100/32 blackhole;
}

protocol static natgw_eips6 {
  ipv6;
  route fd00::100/128 blackhole;
}

template bgp natgw_peer {
  local as 65001;
  direct;
  bfd on;
  graceful restart off;
  long lived graceful restart off;
  connect delay time 1;
  connect retry time 5;
  error wait time 1, 10;
}

protocol bgp natgw_peer1 from natgw_peer {
  local 172.20.0.11 as 65001;
  neighbor 172.20.0.1 as 65000;
  interface "net1";
  ipv4 { import none; export where proto = "natgw_eips4"; next hop self; };
}

protocol bgp natgw_peer2 from natgw_peer {
  local fd00::11 as 65001;
  neighbor fd00::1 as 65000;
  interface "net1";
  ipv6 { import none; export where proto = "natgw_eips6"; next hop self; };
}
`);
  });

  it('withdrawn: the same sessions with no routes; without BFD no bfd protocol', () => {
    const text = renderBirdConf({ ...input, announce: [], bfd: null });
    expect(text).not.toMatch(/route |protocol bfd/);
    expect(text).toMatch(/bfd off;/);
    expect(text).toMatch(/protocol bgp natgw_peer2/);
  });

  it('refuses anything that is not a validated value', () => {
    expect(() => renderBirdConf({ ...input, extInterface: 'net1"; }' })).toThrow(/interface name/);
    expect(() => renderBirdConf({ ...input, announce: ['172.20.0.1/32 blackhole; }'] })).toThrow(/not an IP address/);
    expect(() => renderBirdConf({ ...input, routerId: 'fd00::1' })).toThrow(/router ID/);
    expect(() => renderBirdConf({ ...input, asn: 0 })).toThrow(/AS number/);
  });
});

describe("BIRD's control replies", () => {
  const protocols = `0001 BIRD 2.0.12 ready.
2002-Name       Proto      Table      State  Since         Info
1002-device1    Device     ---        up     2026-12-05 02:52:41.520  
     natgw_bfd  BFD        ---        up     2026-12-05 02:52:41.520  
     natgw_eips4 Static     master4    up     2026-12-05 02:52:41.520  
     natgw_peer1 BGP        ---        up     2026-12-05 02:52:45.001  Established   
     natgw_peer2 BGP        ---        start  2026-12-05 02:52:41.520  Active        Socket: Connection refused
0000 
`;

  it('show protocols: each protocol’s state, since and info', () => {
    const rows = parseProtocols(parseReplies(protocols));
    expect(rows.map((r) => r.name)).toEqual(['device1', 'natgw_bfd', 'natgw_eips4', 'natgw_peer1', 'natgw_peer2']);
    expect(rows[3]).toEqual({ name: 'natgw_peer1', proto: 'BGP', state: 'up', since: '2026-12-05 02:52:45.001', info: 'Established' });
    expect(rows[4]).toMatchObject({ state: 'start', info: 'Active        Socket: Connection refused' });
  });

  it('show bfd sessions and show route export', () => {
    const bfd = parseReplies(`0001 BIRD 2.0.12 ready.
1020-natgw_bfd:
     IP address                Interface  State      Since         Interval  Timeout
     172.20.0.1                net1       Up         2026-12-05 02:52:42.118    0.100    0.300
     fd00::1                   net1       Down       2026-12-05 02:52:41.520    1.000    0.000
0000 
`);
    expect(parseBfdSessions(bfd)).toEqual([
      { peer: '172.20.0.1', interface: 'net1', state: 'Up' },
      { peer: 'fd00::1', interface: 'net1', state: 'Down' },
    ]);
    const routes = parseReplies(`0001 BIRD 2.0.12 ready.
1007-Table master4:
     172.20.0.100/32      blackhole [natgw_eips4 2026-12-05 02:50:37.364] * (200)
     172.20.0.101/32      blackhole [natgw_eips4 2026-12-05 02:50:37.364] * (200)
0000 
`);
    expect(parseRoutePrefixes(routes)).toEqual(['172.20.0.100/32', '172.20.0.101/32']);
  });

  it('errors by their reply code', () => {
    expect(errorOf(parseReplies('0001 BIRD 2.0.12 ready.\n0002-Reading configuration from /x/bird.conf\n0003 Reconfigured\n'))).toBeUndefined();
    expect(errorOf(parseReplies('0001 BIRD 2.0.12 ready.\n9001 syntax error, unexpected CF_SYM_UNDEFINED\n'))).toEqual({
      code: 9001,
      text: 'syntax error, unexpected CF_SYM_UNDEFINED',
    });
    expect(errorOf(parseReplies('0001 BIRD 2.0.12 ready.\n8002 /x/bird.conf, line 3: syntax error\n'))?.code).toBe(8002);
  });
});

/** BIRD's stand-in: a script that records its pid and the signal it ends by, then waits. */
function fakeBird(stateDir: string): string {
  const dir = join(stateDir, 'fake');
  mkdirSync(dir);
  const p = join(dir, 'bird');
  writeFileSync(p, `#!/bin/sh\necho $$ > '${dir}/bird.pid'\ntrap "echo TERM > '${dir}/bird.ended'; exit 0" TERM\nwhile :; do sleep 1; done\n`);
  chmodSync(p, 0o755);
  return p;
}

describe('RoutingManager (BIRD and the kernel faked)', () => {
  it('rewrites and reloads BIRD as readiness and the external link change; after the link comes back it waits for a full sync', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'natgw-routing-unit-'));
    try {
      let ready = true;
      let carrier = true;
      const ran: string[] = [];
      const exec: Executor = {
        run: async (req) => {
          ran.push([req.file, ...req.args].join(' '));
          const result = { command: req.file, exitCode: 0, stdout: '', stderr: '', timedOut: false, failedToStart: false };
          if (req.file === 'ip') {
            const flags = ['BROADCAST', 'UP', ...(carrier ? ['LOWER_UP'] : [])];
            const addr_info = [
              { family: 'inet', local: '172.20.0.11', scope: 'global' },
              { family: 'inet', local: '198.51.100.10', scope: 'global' },
            ];
            return { ...result, stdout: JSON.stringify([{ ifname: 'net1', flags, addr_info }]) };
          }
          if (req.args.includes('configure')) return { ...result, stdout: '0001 BIRD 2.0.12 ready.\n0003 Reconfigured\n' };
          return result;
        },
      };
      const syncs: string[] = [];
      const registry = new Registry();
      const bgp = { peers: ['172.20.0.1'], asn: 65001, peerAsn: 65000, bfd: { intervalMs: 100, multiplier: 3 }, bird: fakeBird(dir), birdc: 'birdc' };
      const m = new RoutingManager({
        config: { stateDir: dir, extInterface: 'net1', bgp } as unknown as Config,
        exec,
        log: pino({ level: 'silent' }),
        registry,
        readiness: () => ({ ready, reasons: ready ? [] : ['waiting for interface(s) eth0'] }),
        applied: () => ({ eips: [{ address: '198.51.100.10' }], interfaces: { ext: 'net1' } }),
        role: () => 'active',
        requestSync: (why) => syncs.push(why),
      });
      const conf = () => readFileSync(m.paths.config, 'utf8');
      const routed = () => conf().includes('route 198.51.100.10/32 blackhole;');
      await m.start();
      await waitFor(async () => routed(), { what: 'the EIP rendered at start' });
      // The session's source and the router ID: the replica's own address, never the EIP it also holds.
      expect(conf()).toMatch(/router id 172\.20\.0\.11;/);
      expect(conf()).toMatch(/local 172\.20\.0\.11 as 65001;/);

      ready = false;
      m.changed('readiness');
      await waitFor(async () => !routed(), { what: 'withdrawn when not ready' });
      await waitFor(async () => ran.some((c) => c === `birdc -v -s ${m.paths.socket} configure`), { what: 'BIRD reloaded' });
      ready = true;
      m.changed('readiness');
      await waitFor(async () => routed(), { what: 'announced again when ready' });

      carrier = false;
      m.changed('link event', { link: true });
      await waitFor(async () => !routed(), { what: 'withdrawn when net1 lost carrier' });
      carrier = true;
      m.changed('link event', { link: true });
      await waitFor(async () => syncs.length === 1, { what: 'a full sync asked for' });
      expect(routed()).toBe(false);
      expect((await m.status()).reasons).toEqual(['external interface came back up: waiting for a full sync to restore its addresses and routes']);
      m.synced();
      await waitFor(async () => routed(), { what: 'announced after the sync' });

      const text = await registry.metrics();
      expect(text).toMatch(/natgw_bgp_withdrawals_total\{reason="not-ready"\} 1/);
      expect(text).toMatch(/natgw_bgp_withdrawals_total\{reason="external-down"\} 1/);
      expect(text).toMatch(/natgw_bgp_announcing 1/);
      await m.stop();
      expect(readFileSync(join(dir, 'fake', 'bird.ended'), 'utf8').trim()).toBe('TERM');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
