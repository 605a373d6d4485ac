/**
 * natgw's kubectl-like commands against a real daemon in the gateway namespace.
 *
 * On the nftables and the iptables backend (what reaches the kernel): no daemon is a clear
 * error (and none is started); `diff` shows the plan and `apply --dry-run` says what would be
 * created and changes nothing; a real apply changes the kernel (real traffic follows); a file
 * that lists only a DNAT configures it and leaves the rest, `--prune` removes the rest; what
 * `get state` prints, apply takes back unchanged; `status --check` finds drift and exits
 * non-zero, and the repair follows.
 *
 * On one backend (the commands' own behaviour): get in every output format, one object by
 * ID, describe, delete (the kernel follows), each error as one line with its exit status,
 * every error of a bad file at once with its line, --version, and the TCP listener's token.
 */
import { randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { createReadStream, existsSync, readFileSync, writeFileSync } from 'node:fs';
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

/** The CLI run in the gateway against its daemon; `topo` and `sock` are read at each call (made in beforeAll). */
function cliOf(topo: () => Topology, sock: () => string) {
  const cli = (args: readonly string[], env: Record<string, string> = {}): Promise<ExecResult> =>
    topo().exec('gw', ['node', NATGW_BIN, ...args], { env: { ...topo().natgwEnv(), ...env }, reject: false, timeoutMs: 60_000 });
  const cliOk = async (args: readonly string[]): Promise<string> => {
    const r = await cli(args);
    if (r.exitCode !== 0 || r.stderr !== '') throw new Error(`natgw ${args.join(' ')} → exit ${r.exitCode}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`);
    return r.stdout;
  };
  const file = (name: string, text: string): string => {
    const p = join(topo().stateDir, name);
    writeFileSync(p, text);
    return p;
  };
  const digest = async (): Promise<string> => ok(await api(sock(), 'GET', '/v1/state'), 'state').body.digest as string;
  return { cli, cliOk, file, digest };
}

describe.each(CASES)('natgw status | apply | get on $name', (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;
  let tokenFile: string;
  const servers: ServerHandle[] = [];

  const { cli, cliOk, file, digest } = cliOf(
    () => topo,
    () => sock,
  );
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
    writeFileSync(tokenFile, `${randomBytes(24).toString('hex')}\n`, { mode: 0o600 });
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

  it('diff shows the plan; apply --dry-run says what it would do and changes nothing; apply changes the kernel', async () => {
    daemon = await startDaemon(topo, { NATGW_LISTEN: `${ADDR.gw}:${PORT}`, NATGW_TOKEN_FILE: tokenFile });
    await topo.natgwOk('init');
    await waitReady(topo, daemon);
    const first = file('state.yaml', stateYaml(ADDR.vpc1, true));
    const digestBefore = await digest();
    const kernelBefore = await ownedNetfilter(topo, backend);

    const d = await cli(['diff', '-f', first]);
    expect(d.exitCode).toBe(1);
    expect(d.stderr).toBe('');
    expect(d.stdout).toContain(`eips:\n  + ${EIP}  prefixLength=24\n`);
    expect(d.stdout).toContain(`snats:\n  + ${EIP},${ADDR.vpcCidr}  randomFully=false\n`);
    expect(d.stdout).toContain(`dnats:\n  + ${EIP},8080,tcp  internalIp=${ADDR.vpc1} internalPort=80\n`);
    expect(d.stdout).toMatch(/Plan: 3 to add, 0 to remove, \d to change\.\n$/);

    const dry = await cliOk(['apply', '-f', first, '--dry-run']);
    expect(dry).toContain(`eip/${EIP} created (dry run)\n`);
    expect(dry).toContain(`snat/${EIP},${ADDR.vpcCidr} created (dry run)\n`);
    expect(dry).toContain(`dnat/${EIP},8080,tcp created (dry run)\n`);
    expect(await digest()).toBe(digestBefore);
    expect(await ownedNetfilter(topo, backend)).toBe(kernelBefore);
    expect(await tryRequest(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost, timeoutMs: 1000 })).toBeNull();

    // For real, with progress asked for (stderr is no terminal here): phases on stderr only.
    const real = await cli(['apply', '-f', first, '--progress']);
    expect(real.exitCode).toBe(0);
    expect(real.stdout.split('\n')).toEqual(
      expect.arrayContaining([`eip/${EIP} created`, `snat/${EIP},${ADDR.vpcCidr} created`, `dnat/${EIP},8080,tcp created`]),
    );
    expect(real.stderr).toContain('natgw apply: validated 3 object(s)');
    expect(real.stderr).toContain('natgw apply: daemon applying 3 object(s)');
    expect(real.stderr).toMatch(/natgw apply: done in \d+ ms\n$/);
    expect(await digest()).not.toBe(digestBefore);
    expect(await backendOf8080()).toBe(ADDR.vpc1);
  });

  it('apply configures what the file lists and leaves the rest; --prune removes the rest', async () => {
    // Only the DNAT, with another target: the EIP and the SNAT stay.
    const onlyDnat = file('dnat.yaml', `dnats:\n  - {eip: ${EIP}, port: 8080, protocol: tcp, internalIp: ${ADDR.vpc2}, internalPort: 80}\n`);
    expect(await cliOk(['apply', '-f', onlyDnat])).toBe(`dnat/${EIP},8080,tcp configured\n`);
    expect(await backendOf8080()).toBe(ADDR.vpc2);
    const state = ok(await api(sock, 'GET', '/v1/state'), 'state').body.desired;
    expect(state.snats).toHaveLength(1);
    expect(state.eips).toHaveLength(1);

    // The whole state without the SNAT, with --prune: the SNAT goes (from the kernel too).
    const second = file('state2.yaml', stateYaml(ADDR.vpc2, false));
    const pruned = await cliOk(['apply', '-f', second, '--prune']);
    expect(pruned).toContain(`dnat/${EIP},8080,tcp unchanged\n`);
    expect(pruned).toContain(`eip/${EIP} unchanged\n`);
    expect(pruned).toMatch(new RegExp(`snat/${EIP.replace(/\./g, '\\.')},${ADDR.vpcCidr.replace(/[./]/g, '\\$&')} pruned\\n$`));
    expect(ok(await api(sock, 'GET', '/v1/state'), 'state').body.desired.snats).toEqual([]);
    expect(await ownedNetfilter(topo, backend)).not.toContain(ADDR.vpcCidr);
    expect(await backendOf8080()).toBe(ADDR.vpc2);

    // What get state prints, apply takes back: every object unchanged, no new generation.
    const roundTrip = file('roundtrip.yaml', await cliOk(['get', 'state', '-o', 'yaml']));
    const generation = ok(await api(sock, 'GET', '/v1/state'), 'state').body.generation as number;
    const same = await cliOk(['apply', '-f', roundTrip]);
    expect(same.trimEnd().split('\n')).toEqual(['gateway unchanged', `eip/${EIP} unchanged`, `dnat/${EIP},8080,tcp unchanged`]);
    expect((await cli(['diff', '-f', roundTrip])).exitCode).toBe(0);
    expect(ok(await api(sock, 'GET', '/v1/state'), 'state').body.generation).toBe(generation);

    // -o json: one document on stdout, for scripts; the daemon's plan of the dry run.
    const asJson = JSON.parse(await cliOk(['apply', '-f', first(), '--dry-run', '-o', 'json']));
    expect(asJson).toMatchObject({
      dryRun: true,
      applied: false,
      plan: { snats: { added: 1, removed: 0, changed: 0 }, dnats: { added: 0, removed: 0, changed: 1 } },
    });
    expect(asJson.results).toContainEqual({ kind: 'dnat', id: `${EIP},8080,tcp`, action: 'configured' });
    expect(asJson.diff.kinds.find((k: { kind: string }) => k.kind === 'dnats').changed).toEqual([
      { id: `${EIP},8080,tcp`, fields: [`internalIp: ${ADDR.vpc2} -> ${ADDR.vpc1}`] },
    ]);
    expect(ok(await api(sock, 'GET', '/v1/state'), 'state').body.generation).toBe(generation);
  });

  it('status: desired against applied; --check finds drift and exits 4; the repair follows', async () => {
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
    const check = await cli(['status', '--check', '-o', 'json']);
    expect(check.exitCode).toBe(4);
    const drifted = JSON.parse(check.stdout);
    expect(drifted.drift.check.drifted).toBe(true);
    expect(drifted.drift.check.changes.netfilter).toBeGreaterThan(0);
    expect(drifted.drift.repairs).toBe(repairsBefore);
    // A check repairs nothing; without --check, ready is all status asks.
    expect(await tryRequest(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost, timeoutMs: 1000 })).toBeNull();
    const textCheck = await cli(['status', '--check']);
    expect(textCheck.exitCode).toBe(4);
    expect(textCheck.stderr).toBe('');
    expect(textCheck.stdout).toMatch(/^Drift now: {3}YES: \d+ change\(s\) to repair \(netfilter \d+/m);
    expect((await cli(['status'])).exitCode).toBe(0);

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
    expect((await cli(['status', '--check'])).exitCode).toBe(0);
    expect(await cliOk(['status'])).toMatch(new RegExp(`^Drift:\\s+${repaired.drift.repairs} repairs?; last read-back .*: repaired netfilter \\d+`, 'm'));
    expect(await backendOf8080()).toBe(ADDR.vpc2);
  });

  const first = (): string => join(topo.stateDir, 'state.yaml');
});

// The commands' own behaviour, whatever the backend: on one.
const ONE = ONE_BACKEND[0];

describe.runIf(ONE)('natgw get | describe | delete | errors | --version on one backend', () => {
  const backend = ONE as BackendCase;
  let topo: Topology;
  let daemon: Daemon | undefined;
  let sock: string;
  let tokenFile: string;
  const servers: ServerHandle[] = [];
  const ID = `${EIP},8080,tcp`;

  const { cli, cliOk, file, digest } = cliOf(
    () => topo,
    () => sock,
  );
  /** A failure: nothing on stdout, one line on stderr, this exit status. */
  const cliFails = async (args: readonly string[], exitCode: number): Promise<string> => {
    const r = await cli(args);
    expect(r.stdout, args.join(' ')).toBe('');
    expect(r.stderr, args.join(' ')).toMatch(/^Error: [^\n]+\n$/);
    expect(r.exitCode, args.join(' ')).toBe(exitCode);
    return r.stderr;
  };

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env, { GATEWAY_V4: ADDR.extGateway, NATGW_RESYNC_PERIOD: '1h' });
    sock = socketOf(topo);
    tokenFile = join(topo.stateDir, 'token');
    writeFileSync(tokenFile, `${randomBytes(24).toString('hex')}\n`, { mode: 0o600 });
    const s = startServer(topo, 'vpc1', 'tcp', 80, '0.0.0.0', { reportLocal: true });
    servers.push(s);
    await s.ready;
    // A port alone: the API binds to the VPC interface's address (eth0's, ADDR.gw), not net1's.
    daemon = await startDaemon(topo, { NATGW_LISTEN: String(PORT), NATGW_TOKEN_FILE: tokenFile });
    await topo.natgwOk('init');
    await waitReady(topo, daemon);
    await cliOk(['apply', '-f', file('state.yaml', stateYaml(ADDR.vpc1, true))]);
  });
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await topo?.cleanup();
  });

  it('get: a table with kubectl headers, -o wide, json and yaml, one object by ID', async () => {
    const table = await cliOk(['get', 'dnats']);
    expect(table.split('\n')[0]).toMatch(/^ID\s+INTERNAL-IP\s+INTERNAL-PORT$/);
    expect(table).toMatch(new RegExp(`^${ID.replace(/\./g, '\\.')}\\s+${ADDR.vpc1.replace(/\./g, '\\.')}\\s+80$`, 'm'));
    expect((await cliOk(['get', 'eips', '-o', 'wide'])).split('\n')[0]).toMatch(/^ID\s+PREFIX-LENGTH$/);
    const item = { id: ID, eip: EIP, port: 8080, protocol: 'tcp', internalIp: ADDR.vpc1, internalPort: 80 };
    expect(JSON.parse(await cliOk(['get', 'dnat', '-o', 'json']))).toEqual([item]);
    expect(JSON.parse(await cliOk(['get', 'dnat', '--json']))).toEqual([item]);
    expect(await cliOk(['get', 'dnats', '-o', 'yaml'])).toContain(`- id: ${ID}\n  eip: ${EIP}\n`);
    expect(JSON.parse(await cliOk(['get', 'dnat', ID, '-o', 'json']))).toEqual(item);
    // The identity as the API reads it: a protocol in capitals names the same DNAT.
    expect((await cliOk(['get', 'dnat', `${EIP},8080,TCP`])).split('\n')[1]).toMatch(new RegExp(`^${ID.replace(/\./g, '\\.')}\\s`));
    expect(await cliOk(['get', 'snat', `${EIP},${ADDR.vpcCidr}`, '-o', 'yaml'])).toContain(`cidr: ${ADDR.vpcCidr}\n`);
    expect(await cliOk(['get', 'dnats', '-o', 'name'])).toBe(`dnat/${ID}\n`);
    expect(await cliOk(['get', 'fips'])).toBe('No FIP objects.\n');
    expect(JSON.parse(await cliOk(['get', 'state'])).desired.dnats).toEqual([
      { eip: EIP, port: 8080, protocol: 'tcp', internalIp: ADDR.vpc1, internalPort: 80 },
    ]);
  });

  it('describe: every field, and whether the daemon applied it', async () => {
    const text = await cliOk(['describe', 'dnat', ID]);
    expect(text).toMatch(/^Kind:\s+DNAT$/m);
    expect(text).toMatch(new RegExp(`^ID:\\s+${ID.replace(/\./g, '\\.')}$`, 'm'));
    expect(text).toMatch(new RegExp(`^Internal IP:\\s+${ADDR.vpc1.replace(/\./g, '\\.')}$`, 'm'));
    expect(text).toMatch(/^Internal port:\s+80$/m);
    expect(text).toMatch(/^Applied:\s+yes/m);
  });

  it('each error is one line with its exit status: usage 2, failure 1', async () => {
    expect(await cliFails(['get', 'dnats', '-o', 'xml'], 2)).toContain("unknown output format 'xml'; one of: table, wide, json, yaml, name");
    expect(await cliFails(['get', 'dnats', '--frob'], 2)).toBe("Error: natgw get: unknown flag --frob (see 'natgw get --help')\n");
    expect(await cliFails(['get', 'dnats', '-o'], 2)).toContain('flag --output needs a value');
    expect(await cliFails(['get', 'dnats', '-o', 'json', '--yaml'], 2)).toContain('one output format at a time');
    expect(await cliFails(['get', 'frobs'], 2)).toContain("unknown kind 'frobs'");
    expect(await cliFails(['get'], 2)).toContain('which kind?');
    expect(await cliFails(['describe', 'dnat'], 2)).toContain('which one?');
    expect(await cliFails(['delete', 'dnat'], 2)).toContain('which one?');
    expect(await cliFails(['status', '--chek'], 2)).toContain('unknown flag --chek');
    expect(await cliFails(['apply'], 2)).toContain('-f FILE is required');
    expect(await cliFails(['apply', '-f', join(topo.stateDir, 'absent.yaml')], 1)).toContain('absent.yaml: no such file');
    expect(await cliFails(['get', 'dnat', `${EIP},9999,tcp`], 1)).toBe(`Error: dnat "${EIP},9999,tcp" not found\n`);
    expect(await cliFails(['describe', 'fip', '172.20.0.99'], 1)).toBe('Error: fip "172.20.0.99" not found\n');
    expect(await cliFails(['get', 'dnat', 'nonsense'], 1)).toMatch(/^Error: dnat nonsense: id: must be eip,port,protocol/);
    expect(await cliFails(['diff'], 2)).toContain('-f FILE is required');
  });

  it('apply reports every error of a strict file at once, each with its line, and changes nothing', async () => {
    const before = await digest();
    const lines = stateYaml(ADDR.vpc1, true).split('\n');
    const portLine = lines.findIndex((l) => l.trim() === 'port: 8080');
    lines[portLine] = '      port: 99999';
    lines.splice(portLine + 1, 0, '      protocl: tcp');
    const bad = await cli(['apply', '-f', file('bad.yaml', lines.join('\n'))]);
    expect(bad.exitCode).toBe(1);
    expect(bad.stdout).toBe('');
    const errs = bad.stderr.trimEnd().split('\n');
    expect(errs[0]).toMatch(/^Error: .*bad\.yaml: 2 errors, nothing was applied:$/);
    expect(errs.slice(1)).toEqual([
      expect.stringMatching(new RegExp(`bad\\.yaml:${portLine + 1}: desired\\.dnats\\[0\\]\\.port: `)),
      expect.stringMatching(new RegExp(`bad\\.yaml:${portLine + 2}: desired\\.dnats\\[0\\]\\.protocl: unknown field \\(did you mean protocol\\?\\)$`)),
    ]);

    // One error: one line, as before. A duplicate is named at the line where its object opens.
    const json = JSON.stringify(
      {
        fips: [
          { eip: EIP, internalIp: ADDR.vpc1 },
          { eip: EIP, internalIp: ADDR.vpc2 },
        ],
      },
      null,
      2,
    );
    const jsonLines = json.split('\n');
    const dupLine =
      jsonLines
        .slice(
          0,
          jsonLines.findIndex((l) => l.includes(ADDR.vpc2)),
        )
        .lastIndexOf('    {') + 1;
    expect(await cliFails(['apply', '-f', file('dup.json', json), '--dry-run'], 1)).toMatch(
      new RegExp(`dup\\.json:${dupLine}: fips\\[1\\]: duplicate FIP identity`),
    );
    expect(await cliFails(['apply', '-f', file('syntax.json', '{\n  "interfaces": {"vpc": "eth0", "ext": "net1"}\n  "eips": []\n}\n')], 1)).toMatch(
      /syntax\.json:3: not valid JSON or YAML: /,
    );
    expect(await cliFails(['diff', '-f', file('typo.yaml', 'dnatz: []\n')], 2)).toContain('typo.yaml:1: dnatz: unknown field (did you mean dnats?)');
    expect(await digest()).toBe(before);
  });

  it('delete removes the object (the kernel follows); an absent one is an error unless --ignore-not-found', async () => {
    expect(parseLocal(await request(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost })).ip).toBe(ADDR.vpc1);
    expect(await cliOk(['delete', 'dnat', `${EIP},8080,TCP`])).toBe(`dnat/${ID} deleted\n`);
    expect(await tryRequest(topo, 'ext', 'tcp', EIP, 8080, { localAddress: ADDR.extHost, timeoutMs: 1000 })).toBeNull();
    expect(ok(await api(sock, 'GET', '/v1/state'), 'state').body.desired.dnats).toEqual([]);
    expect(await cliFails(['delete', 'dnat', ID], 1)).toBe(`Error: dnat "${ID}" not found\n`);
    expect(await cliOk(['delete', 'dnat', ID, '--ignore-not-found'])).toBe('');
  });

  it('--version: the version and the revision the build recorded', async () => {
    const built = JSON.parse(readFileSync(join(REPO_ROOT, 'dist', 'version.json'), 'utf8')) as { version: string; revision: string };
    const pkg = JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as { version: string };
    expect(built.version).toBe(pkg.version);
    expect(built.revision).toMatch(/^([0-9a-f]{40}(-dirty)?|unknown)$/);
    expect(await cliOk(['--version'])).toBe(`natgw ${pkg.version} (revision ${built.revision})\n`);
  });

  it('talks to the TCP listener (on the VPC address only) with the token, and says what is wrong without it', async () => {
    const server = `http://${ADDR.gw}:${PORT}`;
    const withToken = await cli(['status', '-o', 'json', '--server', server, '--token-file', tokenFile]);
    expect(withToken.exitCode).toBe(0);
    expect(JSON.parse(withToken.stdout).objects.eips.desired).toBe(1);
    const without = await cliFails(['get', 'dnats', '--server', server], 1);
    expect(without).toContain('401');
    expect(without).toContain('--token-file');
    // The EIP on net1 (external side) has no API.
    const onEip = await cliFails(['status', '--server', `http://${EIP}:${PORT}`, '--token-file', tokenFile], 1);
    expect(onEip).toContain(`no natgw daemon answers on http://${EIP}:${PORT} (ECONNREFUSED)`);
  });

  it('serve refuses a token shorter than 32 bytes, or the example placeholder, naming the key', async () => {
    const serve = (token: string) => {
      const f = file('weak-token', `${token}\n`);
      // Its own socket and state: were it not refused, it would not touch the running daemon's.
      return topo.exec('gw', ['node', NATGW_BIN, 'serve'], {
        env: {
          ...topo.natgwEnv(),
          NATGW_LISTEN: `${ADDR.gw}:${PORT + 1}`,
          NATGW_TOKEN_FILE: f,
          NATGW_SOCKET: join(topo.stateDir, 'weak.sock'),
          NATGW_STATE_DIR: join(topo.stateDir, 'weak'),
        },
        reject: false,
        timeoutMs: 20_000,
      });
    };
    const short = await serve('0123456789abcdef');
    expect(short.exitCode).toBe(1);
    expect(short.stderr).toBe(
      `Error: NATGW_TOKEN_FILE: the token in ${join(topo.stateDir, 'weak-token')} is 16 bytes, shorter than 32: put a random one there (e.g. openssl rand -hex 32)\n`,
    );
    const placeholder = await serve('change-me-to-a-long-random-string');
    expect(placeholder.exitCode).toBe(1);
    expect(placeholder.stderr).toMatch(/^Error: NATGW_TOKEN_FILE: .*weak-token holds the example's placeholder token/);
  });
});

/**
 * The shim's autostart as under the controller's pod spec: in a PID namespace whose PID 1
 * (standing in for `sleep infinity`) has its own stdout, the shim's command starts the daemon,
 * whose JSON log lands on PID 1's stdout (where `kubectl logs` reads a container's) when that
 * is a file or pipe, and in natgw-daemon.log in the state dir when it is /dev/null. The
 * command's own output stays clean either way.
 */
describe.runIf(ONE)('an autostarted daemon logs to the container stdout, else to its file', () => {
  const backend = ONE as BackendCase;
  let topo: Topology;

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env, { NATGW_AUTOSTART: 'true', NATGW_RESYNC_PERIOD: '1h' });
  });
  afterAll(async () => {
    await topo?.cleanup();
  });

  /**
   * PID 1 runs the shim's `init` (its output in shim.out), then becomes `sleep`. PID 1's
   * stdout is a FIFO this test reads, as a container runtime's is, or /dev/null.
   */
  async function autostartUnder(pid1Stdout: 'fifo' | '/dev/null', tag: string): Promise<{ shim: string; logLine: Record<string, unknown>; logFile: string }> {
    const shimOut = join(topo.stateDir, `shim-${tag}.out`);
    // PID 1's stdout as containerd gives it: a FIFO the runtime reads.
    const fifo = join(topo.stateDir, `pid1-${tag}.fifo`);
    let containerLog = '';
    if (pid1Stdout === 'fifo') {
      execFileSync('mkfifo', [fifo]);
      createReadStream(fifo, 'utf8').on('data', (d) => (containerLog += d));
    }
    // The shim runs in a child shell: a shell redirects a command's output in its own fds
    // while the command runs, which would make PID 1's stdout the shim's (refused as its own).
    const script = `exec 3>"$1" >"$2" 2>&1 </dev/null; sh -c 'node "$0" init >&3 2>&3; echo "exit=$?" >&3' "$3"; exec sleep 120`;
    const pidns = topo.spawn(
      'gw',
      ['unshare', '--pid', '--fork', '--kill-child', '--mount-proc', 'sh', '-c', script, 'sh', shimOut, pid1Stdout === 'fifo' ? fifo : '/dev/null', NATGW_BIN],
      { env: topo.natgwEnv() },
    );
    const gone = new Promise<void>((resolve) => pidns.once('exit', () => resolve()));
    const sock = socketOf(topo);
    try {
      const shim = await waitFor(
        async () => {
          const t = existsSync(shimOut) ? readFileSync(shimOut, 'utf8') : '';
          return /exit=\d+\n/.test(t) ? t : undefined;
        },
        { what: 'the shim under PID 1 to finish', timeoutMs: 30_000, intervalMs: 100 },
      );
      const logFile = join(topo.stateDir, 'natgw-daemon.log');
      const where = pid1Stdout === 'fifo' ? "PID 1's stdout" : logFile;
      const logLine = await waitFor(
        async () => {
          const t = pid1Stdout === 'fifo' ? containerLog : existsSync(logFile) ? readFileSync(logFile, 'utf8') : '';
          const line = t.split('\n').find((l) => l.includes('"natgw serving"'));
          return line ? (JSON.parse(line) as Record<string, unknown>) : undefined;
        },
        { what: `the daemon's start line in ${where}`, timeoutMs: 20_000, intervalMs: 100 },
      );
      expect(ok(await api(sock, 'GET', '/healthz'), 'healthz').body.status).toBe('ok');
      return { shim, logLine, logFile };
    } catch (e) {
      const natgwLog = existsSync(join(topo.stateDir, 'natgw.log')) ? readFileSync(join(topo.stateDir, 'natgw.log'), 'utf8') : '';
      throw new Error(`${(e as Error).message}\nPID 1 stdout: ${containerLog}\nshim log: ${natgwLog}`);
    } finally {
      // PID 1 gone takes the daemon with it (the PID namespace ends).
      pidns.kill('SIGKILL');
      await gone;
      await waitFor(async () => (await api(sock, 'GET', '/healthz', undefined, {}, 500).catch(() => undefined))?.status !== 200, {
        what: 'the autostarted daemon to end with its PID namespace',
        timeoutMs: 10_000,
        intervalMs: 100,
      });
    }
  }

  it("to PID 1's stdout when it is a pipe (FIFO); the shim's output stays the command's", async () => {
    const { shim, logLine, logFile } = await autostartUnder('fifo', 'container');
    expect(shim).toMatch(/^using VPC interface: eth0\nusing External interface: net1\n/);
    expect(shim).not.toContain('"level"');
    expect(shim).toMatch(/exit=0\n$/);
    expect(logLine).toMatchObject({ msg: 'natgw serving', svc: 'natgw', logs: 'container stdout (/proc/1/fd/1)' });
    expect(existsSync(logFile) ? readFileSync(logFile, 'utf8') : '').toBe('');
  });

  it("to natgw-daemon.log in the state dir when PID 1's stdout is /dev/null", async () => {
    const { shim, logLine, logFile } = await autostartUnder('/dev/null', 'devnull');
    expect(shim).toMatch(/exit=0\n$/);
    expect(logLine).toMatchObject({ msg: 'natgw serving', logs: logFile });
  });
});
