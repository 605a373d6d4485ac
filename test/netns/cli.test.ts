/**
 * `natgw status | apply | get` against a real daemon in the gateway namespace, on the nftables
 * and the iptables backend: no daemon is a clear error (and none is started); a dry run shows
 * the plan as a diff and changes nothing; a real apply changes the kernel (real traffic
 * follows) and a second file shows ~ and - lines; a bad file names its line and field and
 * changes nothing; status shows desired against applied, drift found by a check, and the
 * repair; the same over TCP with the token.
 */
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADDR, createTopology, REPO_ROOT, type ExecResult, type Topology } from '../helpers/netns.js';
import { ONE_BACKEND, ownedNetfilter, type BackendCase } from '../helpers/backends.js';
import { parseLocal, request, startServer, tryRequest, type ServerHandle } from '../helpers/traffic.js';
import { waitFor } from '../helpers/poll.js';
import { api, ok, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const EIP = '172.20.0.10';
const PORT = 8444;
const NATGW_BIN = join(REPO_ROOT, 'bin', 'natgw.js');
// The subject is the CLI (its plan, diff, errors and status), not the backend: one backend does;
// every backend's apply, drift and repair are the daemon suites' (daemon-lifecycle, steady-state).
const CASES = ONE_BACKEND;

/** Remove natgw's DNAT rules behind its back (no link event: only a read-back sees it). */
async function flushNat(topo: Topology, b: BackendCase): Promise<void> {
  if (b.iptablesVariant) await topo.exec('gw', [`iptables-${b.iptablesVariant}`, '-t', 'nat', '-F', 'SHARED_DNAT']);
  else await topo.exec('gw', ['nft', 'flush', 'table', 'ip', 'natgw']);
}

function stateYaml(dnatTarget: string, withSnat: boolean): string {
  return [
    '# natgw apply -f: a desired state',
    'desired:',
    '  initialized: true',
    '  interfaces: {vpc: eth0, ext: net1}',
    `  defaultRoutes: {v4: ${ADDR.extGateway}}`,
    '  eips:',
    `    - {address: ${EIP}, prefixLength: 24}`,
    '  dnats:',
    `    - eip: ${EIP}`,
    '      port: 8080',
    '      protocol: tcp',
    `      internalIp: ${dnatTarget}`,
    '      internalPort: 80',
    ...(withSnat ? ['  snats:', `    - {eip: ${EIP}, cidr: ${ADDR.vpcCidr}}`] : []),
    '',
  ].join('\n');
}

describe.each(CASES)('natgw status | apply | get on $name', (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;
  let tokenFile: string;
  const servers: ServerHandle[] = [];

  const cli = (args: readonly string[], env: Record<string, string> = {}): Promise<ExecResult> =>
    topo.exec('gw', ['node', NATGW_BIN, ...args], { env: { ...topo.natgwEnv(), ...env }, reject: false, timeoutMs: 60_000 });
  const cliOk = async (args: readonly string[]): Promise<string> => {
    const r = await cli(args);
    if (r.exitCode !== 0 || r.stderr !== '') throw new Error(`natgw ${args.join(' ')} → exit ${r.exitCode}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`);
    return r.stdout;
  };
  const file = (name: string, text: string): string => {
    const p = join(topo.stateDir, name);
    writeFileSync(p, text);
    return p;
  };
  const digest = async (): Promise<string> => ok(await api(sock, 'GET', '/v1/state'), 'state').body.digest as string;
  /** Which VPC host answers on the EIP's port 8080 from the external host. */
  const backendOf8080 = async (): Promise<string> => parseLocal(await request(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost })).ip;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const statusJson = async (...extra: string[]): Promise<any> => JSON.parse(await cliOk(['status', '--json', ...extra]));

  beforeAll(async () => {
    topo = await createTopology();
    // No periodic resync during the test: drift stays until a check sees it and a link event repairs it.
    Object.assign(topo.env, backend.env, { GATEWAY_V4: ADDR.extGateway, NATGW_RESYNC_PERIOD: '1h' });
    sock = socketOf(topo);
    tokenFile = join(topo.stateDir, 'token');
    writeFileSync(tokenFile, `cli-${Math.random().toString(36).slice(2)}\n`, { mode: 0o600 });
    for (const ns of ['vpc1', 'vpc2'] as const) {
      const s = startServer(topo, ns, 'tcp', 80, '0.0.0.0', { reportLocal: true });
      servers.push(s);
      await s.ready;
    }
  });
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  });

  it('says no daemon answers, and starts none', async () => {
    const r = await cli(['status'], { NATGW_AUTOSTART: 'true' });
    expect(r.exitCode).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr).toContain(`Error: no natgw daemon answers on ${sock}`);
    expect(r.stderr).toContain('natgw serve');
    const a = await cli(['apply', '-f', file('empty.yaml', stateYaml(ADDR.vpc1, true)), '--dry-run'], { NATGW_AUTOSTART: 'true' });
    expect(a.exitCode).toBe(1);
    expect(a.stderr).toContain('no natgw daemon answers');
    expect(existsSync(sock)).toBe(false);
  });

  it('applies a file: the dry run shows the plan and changes nothing, the apply changes the kernel', async () => {
    daemon = await startDaemon(topo, { NATGW_LISTEN: `${ADDR.gw}:${PORT}`, NATGW_TOKEN_FILE: tokenFile });
    await topo.natgwOk('init');
    await waitReady(topo, daemon);
    const first = file('state.yaml', stateYaml(ADDR.vpc1, true));
    const digestBefore = await digest();
    const kernelBefore = await ownedNetfilter(topo, backend);

    const dry = await cliOk(['apply', '-f', first, '--dry-run']);
    expect(dry).toContain(`eips:\n  + ${EIP}  prefixLength=24\n`);
    expect(dry).toContain(`snats:\n  + ${EIP},${ADDR.vpcCidr}  randomFully=false\n`);
    expect(dry).toContain(`dnats:\n  + ${EIP},8080,tcp  internalIp=${ADDR.vpc1} internalPort=80\n`);
    expect(dry).toMatch(/Plan: 3 to add, 0 to remove, \d to change\.\nDry run: nothing applied\.\n$/);
    expect(await digest()).toBe(digestBefore);
    expect(await ownedNetfilter(topo, backend)).toBe(kernelBefore);
    expect(await tryRequest(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost, timeoutMs: 1000 })).toBeNull();

    // For real, with progress asked for (stderr is no terminal here): phases on stderr only.
    const real = await cli(['apply', '-f', first, '--progress']);
    expect(real.exitCode).toBe(0);
    expect(real.stdout).toContain(`  + ${EIP},8080,tcp  internalIp=${ADDR.vpc1} internalPort=80\n`);
    expect(real.stdout).toMatch(/\nApplied: generation \d+, digest sha256:[0-9a-f]{64}\.\n$/);
    expect(real.stderr).toContain('natgw apply: validated 3 object(s)');
    expect(real.stderr).toContain('natgw apply: daemon applying 3 object(s)');
    expect(real.stderr).toMatch(/natgw apply: done in \d+ ms\n$/);
    expect(await digest()).not.toBe(digestBefore);
    expect(await backendOf8080()).toBe(ADDR.vpc1);

    const table = await cliOk(['get', 'dnats']);
    expect(table.split('\n')[0]).toMatch(/^ID\s+INTERNALIP\s+INTERNALPORT$/);
    expect(table).toMatch(new RegExp(`^${EIP},8080,tcp\\s+${ADDR.vpc1.replace(/\./g, '\\.')}\\s+80$`, 'm'));
    expect(JSON.parse(await cliOk(['get', 'dnat', '--json']))).toEqual([
      { id: `${EIP},8080,tcp`, eip: EIP, port: 8080, protocol: 'tcp', internalIp: ADDR.vpc1, internalPort: 80 },
    ]);
    expect(await cliOk(['get', 'fips'])).toBe('No FIP objects.\n');

    // Another target and no SNAT: ~ and - lines, and the traffic follows.
    const second = file('state2.yaml', stateYaml(ADDR.vpc2, false));
    const out = await cliOk(['apply', '-f', second]);
    expect(out).toContain(`snats:\n  - ${EIP},${ADDR.vpcCidr}  randomFully=false\n`);
    expect(out).toContain(`dnats:\n  ~ ${EIP},8080,tcp  internalIp: ${ADDR.vpc1} -> ${ADDR.vpc2}\n`);
    expect(out).toContain('Plan: 0 to add, 1 to remove, 1 to change.');
    expect(await backendOf8080()).toBe(ADDR.vpc2);

    // What get state prints, apply takes back: nothing to do.
    const roundTrip = file('roundtrip.yaml', await cliOk(['get', 'state', '--yaml']));
    const generation = ok(await api(sock, 'GET', '/v1/state'), 'state').body.generation as number;
    expect(await cliOk(['apply', '-f', roundTrip])).toBe('No changes: the file is the desired state.\nNothing to apply.\n');
    expect(ok(await api(sock, 'GET', '/v1/state'), 'state').body.generation).toBe(generation);
    // --json: one document on stdout, for scripts.
    const asJson = JSON.parse(await cliOk(['apply', '-f', first, '--dry-run', '--json']));
    expect(asJson).toMatchObject({
      dryRun: true,
      applied: false,
      plan: { snats: { added: 1, removed: 0, changed: 0 }, dnats: { added: 0, removed: 0, changed: 1 } },
    });
    expect(asJson.diff.kinds.find((k: { kind: string }) => k.kind === 'dnats').changed).toEqual([
      { id: `${EIP},8080,tcp`, fields: [`internalIp: ${ADDR.vpc2} -> ${ADDR.vpc1}`] },
    ]);
    expect(ok(await api(sock, 'GET', '/v1/state'), 'state').body.generation).toBe(generation);
  });

  it('refuses a bad file naming its line and field, and changes nothing', async () => {
    const before = await digest();
    const lines = stateYaml(ADDR.vpc1, true).split('\n');
    const portLine = lines.findIndex((l) => l.trim() === 'port: 8080');
    lines[portLine] = '      port: 99999';
    const bad = await cli(['apply', '-f', file('bad.yaml', lines.join('\n'))]);
    expect(bad.exitCode).toBe(1);
    expect(bad.stdout).toBe('');
    expect(bad.stderr).toMatch(new RegExp(`^Error: .*bad\\.yaml:${portLine + 1}: desired\\.dnats\\[0\\]\\.port: .+\\n$`));

    const json = JSON.stringify(
      {
        interfaces: { vpc: 'eth0', ext: 'net1' },
        initialized: true,
        fips: [
          { eip: EIP, internalIp: ADDR.vpc1 },
          { eip: EIP, internalIp: ADDR.vpc2 },
        ],
      },
      null,
      2,
    );
    // The duplicate is named at the line where its object opens.
    const jsonLines = json.split('\n');
    const dupLine =
      jsonLines
        .slice(
          0,
          jsonLines.findIndex((l) => l.includes(ADDR.vpc2)),
        )
        .lastIndexOf('    {') + 1;
    const dup = await cli(['apply', '-f', file('dup.json', json), '--dry-run']);
    expect(dup.exitCode).toBe(1);
    expect(dup.stderr).toMatch(new RegExp(`dup\\.json:${dupLine}: fips\\[1\\]: duplicate FIP identity`));

    const syntax = await cli(['apply', '-f', file('syntax.json', '{\n  "interfaces": {"vpc": "eth0", "ext": "net1"}\n  "eips": []\n}\n')]);
    expect(syntax.exitCode).toBe(1);
    expect(syntax.stderr).toMatch(/syntax\.json:3: not valid JSON or YAML: /);
    expect(await digest()).toBe(before);
  });

  it('status: desired against applied, drift a check finds, and its repair', async () => {
    const clean = await statusJson('--check');
    expect(clean).toMatchObject({ ready: true, inSync: true, backend: { kind: backend.iptablesVariant ? 'iptables' : 'nftables' } });
    expect(clean.objects.dnats).toEqual({ desired: 1, applied: 1 });
    expect(clean.objects.snats).toEqual({ desired: 0, applied: 0 });
    expect(clean.lastSync).toMatchObject({ ok: true, kind: expect.stringMatching(/^(full|partial)$/) });
    expect(clean.drift.check.drifted).toBe(false);
    const repairsBefore = clean.drift.repairs as number;
    const text = await cliOk(['status', '--check']);
    expect(text).toContain('Ready:       yes\n');
    expect(text).toContain('Applied:     the desired state (digests equal)\n');
    expect(text).toContain('Drift now:   none (the kernel holds the desired state)\n');
    expect(text).toMatch(/^dnats\s+1\s+1$/m);

    await flushNat(topo, backend);
    expect(await tryRequest(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost, timeoutMs: 1000 })).toBeNull();
    const drifted = await statusJson('--check');
    expect(drifted.drift.check.drifted).toBe(true);
    expect(drifted.drift.check.changes.netfilter).toBeGreaterThan(0);
    expect(drifted.drift.repairs).toBe(repairsBefore);
    // A check repairs nothing.
    expect(await tryRequest(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost, timeoutMs: 1000 })).toBeNull();
    expect(await cliOk(['status', '--check'])).toMatch(/^Drift now: {3}YES: \d+ change\(s\) to repair \(netfilter \d+/m);

    // An address deleted is a link event: the daemon resyncs and repairs everything.
    await topo.exec('gw', ['ip', 'addr', 'del', `${EIP}/24`, 'dev', 'net1']);
    const repaired = await waitFor(
      async () => {
        const s = await statusJson();
        return s.drift.repairs > repairsBefore ? s : undefined;
      },
      { what: 'a resync to repair the drift', timeoutMs: 20_000, intervalMs: 200 },
    );
    expect(repaired.drift.last).toMatchObject({ repaired: true });
    expect(repaired.drift.last.changes.netfilter).toBeGreaterThan(0);
    expect(repaired.drift.last.changes.link).toBeGreaterThan(0);
    expect((await statusJson('--check')).drift.check.drifted).toBe(false);
    expect(await cliOk(['status'])).toMatch(new RegExp(`^Drift:\\s+${repaired.drift.repairs} repairs?; last read-back .*: repaired netfilter \\d+`, 'm'));
    expect(await backendOf8080()).toBe(ADDR.vpc2);
  });

  it('talks to the TCP listener with the token, and says what is wrong without it', async () => {
    const server = `http://${ADDR.gw}:${PORT}`;
    const withToken = await cli(['status', '--json', '--server', server, '--token-file', tokenFile]);
    expect(withToken.exitCode).toBe(0);
    expect(JSON.parse(withToken.stdout).objects.dnats.desired).toBe(1);
    const without = await cli(['get', 'dnats', '--server', server]);
    expect(without.exitCode).toBe(1);
    expect(without.stderr).toContain('401');
    expect(without.stderr).toContain('--token-file');
  });
});
