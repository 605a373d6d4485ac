/**
 * Fault injection (issue 12): wrappers on the daemon's PATH make the Nth matching call of
 * `nft`, `iptables-restore`, `ip`, `tc` or `conntrack` fail, fail half-way (the first line of
 * a batch applied) or hang. The change reports a clear failure, the kernel and the state are
 * exactly as before (independent dumps: `nft list ruleset`, `iptables-save`, `ip addr`,
 * `ip route`, `tc`), and the same change then goes through cleanly. A delete removes the
 * address it names even where the state does not list it, and a daemon killed while an
 * address change hangs half-way leaves nothing behind after its restart.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { waitFor } from '../helpers/poll.js';
import { makeWrappers, type Mode, type Tool } from '../helpers/faults.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

/** Everything natgw could have touched, read by tools of the test's own (never the wrappers). */
async function dumps(topo: Topology, b: BackendCase): Promise<Record<string, string>> {
  const run = async (argv: string[]) => (await topo.exec('gw', argv, { reject: false })).stdout;
  const strip = (s: string) =>
    s
      .split('\n')
      .map((l) => l.replace(/\s+valid_lft.*$/, '').replace(/^\d+:\s+/, ''))
      .filter((l) => !l.includes('fe80::'))
      .sort()
      .join('\n');
  const out: Record<string, string> = {
    netfilter: b.iptablesVariant
      ? (await topo.iptablesSave('nat', b.iptablesVariant)) + (await topo.iptablesSave('mangle', b.iptablesVariant))
      : await run(['nft', 'list', 'ruleset']),
    shareDnat: await run(['nft', 'list', 'table', 'ip', 'kube-ovn']),
    addresses: strip(await run(['ip', '-o', 'addr', 'show', 'dev', 'net1'])),
    routes: strip((await run(['ip', 'route', 'show'])) + (await run(['ip', '-6', 'route', 'show']))),
  };
  for (const dev of ['net1', 'ifb-net1']) {
    for (const what of ['qdisc', 'class', 'filter']) out[`tc ${what} ${dev}`] = await run(['tc', what, 'show', 'dev', dev]);
  }
  out['tc filter ingress net1'] = await run(['tc', 'filter', 'show', 'dev', 'net1', 'ingress']);
  return out;
}

describe.each(BACKENDS)('faults ($name)', (b) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;
  let faults: ReturnType<typeof makeWrappers>;
  let baseDoc: { desired: unknown; digest: string };
  let changedDoc: { desired: unknown; digest: string };
  let before: Record<string, string>;

  const legacy = async (command: string, ...rules: string[]) => {
    const r = ok(await api(sock, 'POST', '/v1/legacy', { command, rules }), command);
    // The daemon's last lines say why (a CI run shows nothing else of it).
    if (r.body.status !== 0) throw new Error(`${command} ${rules.join(' ')}: ${r.text}\n${daemon?.logs().split('\n').slice(-30).join('\n')}`);
    return r.body;
  };
  const start = async () => {
    daemon = await startDaemon(topo, {
      PATH: `${faults.dir}:${process.env.PATH ?? ''}`,
      // The faults are injected into the nft tool: the daemon runs it instead of its libnftables helper.
      NATGW_LIBNFTABLES: 'off',
    });
    await waitReady(topo, daemon);
  };
  const stateDigest = async () => (await api(sock, 'GET', '/v1/state')).body.digest as string;

  beforeAll(async () => {
    faults = makeWrappers();
    topo = await createTopology();
    Object.assign(topo.env, { ...b.env, GATEWAY_V4: ADDR.extGateway, NATGW_RESYNC_PERIOD: '1h', NATGW_TOOL_TIMEOUT: '2s' });
    sock = socketOf(topo);
    await start();
    await legacy('init');
    await legacy('eip-add', '172.20.0.10/24');
    await legacy('snat-add', '172.20.0.10,10.0.1.0/24');
    await legacy('dnat-add', '172.20.0.10,8080,tcp,10.0.1.6,80');
    await legacy('floating-ip-add', '172.20.0.11,10.0.1.7');
    await legacy('eip-add', '172.20.0.11/24');
    await legacy('subnet-route-add', '10.0.2.0/24,10.0.1.254');
    await legacy('eip-egress-qos-add', '172.20.0.10,1,10,1');
    await legacy('nft-dnat-map-add', '172.20.0.10,9000,tcp,10.0.1.6:80@10.0.1.7:80');
    baseDoc = (await api(sock, 'GET', '/v1/state')).body;
    // The change every fault interrupts touches every part: NAT, share DNAT, addresses and routes, QoS.
    await legacy('eip-add', '172.20.0.21/24');
    await legacy('eip-add', '172.20.0.22/24');
    await legacy('dnat-add', '172.20.0.21,8081,tcp,10.0.1.6,81');
    await legacy('nft-dnat-map-add', '172.20.0.21,9001,udp,10.0.1.6:53');
    await legacy('subnet-route-add', '10.0.3.0/24,10.0.1.254', '10.0.4.0/24,10.0.1.254');
    await legacy('eip-ingress-qos-add', '172.20.0.21,1,20,1');
    changedDoc = (await api(sock, 'GET', '/v1/state')).body;
    ok(await api(sock, 'PUT', '/v1/state', baseDoc), 'back to the base state');
    before = await dumps(topo, b);
  }, 180_000);

  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
    // A hang the daemon did not kill (it was killed itself) is ended here, by its own pid.
    faults?.remove();
  });

  // What each fault matches: the forward change (adds), never the roll-back (deletes).
  const netfilterFault = (mode: Mode): [Tool, Mode, string, string] =>
    b.iptablesVariant ? [`iptables-${b.iptablesVariant}-restore`, mode, '--noflush', '^-[AI] '] : ['nft', mode, '-f', '^(add|insert|replace) '];
  const cases: Array<{ name: string; fault: () => [Tool, Mode, string, string]; message: RegExp }> = [
    { name: 'the NAT transaction fails', fault: () => netfilterFault('fail'), message: /injected fault/ },
    { name: 'the NAT transaction hangs', fault: () => netfilterFault('hang'), message: /timed out after 2000 ms/ },
    { name: 'ip -batch stops half-way', fault: () => ['ip', 'half', '-batch', '^(addr|route) replace '], message: /injected fault: ip stopped half-way/ },
    { name: 'ip -batch hangs', fault: () => ['ip', 'hang', '-batch', '^(addr|route) replace '], message: /timed out after 2000 ms/ },
    {
      name: 'tc -batch stops half-way',
      fault: () => ['tc', 'half', '-batch', '^(qdisc|class|filter) (add|replace|change) '],
      message: /injected fault: tc stopped half-way/,
    },
  ];

  for (const c of cases) {
    it(`${c.name}: a clear error, kernel and state as before, then the change goes through`, async () => {
      const [tool, mode, args, stdin] = c.fault();
      faults.arm(tool, 1, mode, args, stdin);
      let r: Awaited<ReturnType<typeof api>>;
      try {
        r = await api(sock, 'PUT', '/v1/state', changedDoc);
      } finally {
        faults.disarm();
      }
      expect(faults.fired()).toContain(tool);
      expect(r.status).toBe(500);
      expect(r.body.message).toMatch(c.message);
      expect(await dumps(topo, b)).toEqual(before);
      expect(await stateDigest()).toBe(baseDoc.digest);
      // The next sync is clean: the same change applies, and going back restores the dumps.
      ok(await api(sock, 'PUT', '/v1/state', changedDoc), 'the change after the fault');
      expect(await stateDigest()).toBe(changedDoc.digest);
      ok(await api(sock, 'PUT', '/v1/state', baseDoc), 'back to the base state');
      expect(await dumps(topo, b)).toEqual(before);
    }, 60_000);
  }

  it('a conntrack flush that fails is logged and retried with the next flush', async () => {
    // A flush whose mapping has no entry in the kernel's conntrack table runs on no backend (conntrack.ts):
    // each port gets one, written by hand.
    const tracked = (port: number) =>
      topo.exec('gw', [
        'conntrack',
        '-I',
        '-s',
        ADDR.extHost,
        '-d',
        '172.20.0.11',
        '-p',
        'tcp',
        '--sport',
        '40000',
        '--dport',
        String(port),
        '--state',
        'ESTABLISHED',
        '-t',
        '300',
        '-r',
        '10.0.1.6',
        '-q',
        ADDR.extHost,
        '--reply-port-src',
        String(port - 8000),
        '--reply-port-dst',
        '40000',
      ]);
    await tracked(8090);
    await tracked(8091);
    await legacy('dnat-add', '172.20.0.11,8090,tcp,10.0.1.6,90');
    faults.arm('conntrack', 1, 'fail', '-D');
    try {
      const out = await legacy('dnat-del', '172.20.0.11,8090,tcp');
      expect(out.stderr).toBe('');
      await waitFor(async () => daemon!.logs().includes('conntrack flush failed'), { what: 'the flush failure in the log', timeoutMs: 10_000 });
    } finally {
      faults.disarm();
    }
    expect(faults.fired()).toContain('conntrack -D --orig-dst 172.20.0.11 -p tcp --orig-port-dst 8090');
    // The next flush carries the one still owed.
    const logged = daemon!.logs().length;
    await legacy('dnat-add', '172.20.0.11,8091,tcp,10.0.1.6,91');
    await legacy('dnat-del', '172.20.0.11,8091,tcp');
    await waitFor(
      async () => {
        const lines = daemon!
          .logs()
          .slice(logged)
          .split('\n')
          .filter((l) => l.includes('"conntrack flushed"'));
        return lines.some((l) => l.includes('"port":8090')) && lines.some((l) => l.includes('"port":8091'));
      },
      { what: 'the owed flush retried beside the new one', timeoutMs: 10_000 },
    );
  }, 60_000);

  it('eip-del removes an address the state does not list, as the script does', async () => {
    await topo.exec('gw', ['ip', 'addr', 'add', '172.20.0.77/16', 'dev', 'net1']);
    const out = await legacy('eip-del', '172.20.0.77/16');
    expect(out.stderr).toBe('');
    expect((await topo.exec('gw', ['ip', '-o', 'addr', 'show', 'dev', 'net1'])).stdout).not.toContain('172.20.0.77');
    expect(await dumps(topo, b)).toEqual(before);
  }, 30_000);

  it('kill -9 while an address change hangs half-way: after the restart nothing natgw added is left', async () => {
    faults.arm('ip', 1, 'half-hang', '-batch', '^addr replace ');
    const pending = api(sock, 'POST', '/v1/legacy', { command: 'eip-add', rules: ['172.20.0.31/24'] }).catch(() => undefined);
    try {
      await waitFor(async () => faults.fired().includes('ip -batch'), { what: 'the hung ip -batch', timeoutMs: 10_000 });
      // The first line applied: the address is on net1, the state never listed it.
      await waitFor(async () => (await topo.exec('gw', ['ip', '-o', 'addr', 'show', 'dev', 'net1'])).stdout.includes('172.20.0.31'), {
        what: 'the half-applied address',
        timeoutMs: 10_000,
      });
      await stopDaemon(daemon!, 'SIGKILL');
      daemon = undefined;
      await pending;
    } finally {
      faults.disarm();
    }
    await start();
    expect(await dumps(topo, b)).toEqual(before);
    expect(await stateDigest()).toBe(baseDoc.digest);
  }, 60_000);

  // Last: it takes away the shared pieces the dumps above were taken with.
  it('tc stops half-way on the first ingress rule: the IFB, ingress qdisc and redirect it made are gone again', async () => {
    // A gateway whose ingress QoS never existed: no IFB, no ingress qdisc (the daemon stopped meanwhile).
    await stopDaemon(daemon!, 'SIGTERM');
    daemon = undefined;
    await topo.exec('gw', ['tc', 'qdisc', 'del', 'dev', 'net1', 'ingress'], { reject: false });
    await topo.exec('gw', ['ip', 'link', 'del', 'ifb-net1'], { reject: false });
    await start();
    const pristine = await dumps(topo, b);
    expect(pristine['tc qdisc ifb-net1']).toBe('');
    // Three lines: the ingress qdisc, the IFB's root and its default class; then the batch fails.
    faults.arm('tc', 1, 'half', '-batch', '^(qdisc|class|filter) (add|replace|change) ', 3);
    let r: Awaited<ReturnType<typeof api>>;
    try {
      r = await api(sock, 'PUT', '/v1/state', changedDoc);
    } finally {
      faults.disarm();
    }
    expect(faults.fired()).toContain('tc -batch');
    expect(r.status).toBe(500);
    expect(await dumps(topo, b)).toEqual(pristine);
    expect(await stateDigest()).toBe(baseDoc.digest);
    // And the change then goes through, creating them.
    ok(await api(sock, 'PUT', '/v1/state', changedDoc), 'the change after the fault');
    expect((await dumps(topo, b))['tc filter ingress net1']).toContain('ifb-net1');
  }, 60_000);
});
