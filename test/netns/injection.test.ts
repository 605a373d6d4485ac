/**
 * The injection corpus (test/corpus/injection.json, every case with the reason it is hostile)
 * through the command shim against a real daemon in a gateway namespace, on every backend.
 * Every case must be refused (status 1, one reason line naming the hostile field, nothing else on
 * stderr) and the kernel must stay byte-identical: one dump of everything natgw could touch before
 * and after the whole corpus, plus spot dumps every SPOT cases (per-case dumps would multiply the
 * run time by ten).
 * The control: every command's unmutated base rule (the corpus's bases) is accepted through the
 * same shim and changes that dump, the adds while the gateway is set up, the deletes at the end.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BASES, CORPUS, hostileField } from '../helpers/injectionCorpus.js';
import { ADDR, createTopology, type Topology } from '../helpers/netns.js';
import { BACKENDS, type BackendCase } from '../helpers/backends.js';
import { api, socketOf, startDaemon, stopDaemon, waitReady, type Daemon } from './daemon-util.js';

const isDelete = (command: string) => command.endsWith('-del');
const SPOT = 40;
const EIP = '172.20.0.10';

/** Everything natgw could touch, as the tools print it (generation timestamps of *-save and packet counters dropped). */
async function kernelDump(topo: Topology): Promise<string> {
  const run = async (argv: string[]) => {
    const r = await topo.exec('gw', argv, { reject: false });
    return `$ ${argv.join(' ')} (${r.exitCode})\n${r.stdout}${r.stderr}`;
  };
  const parts = [
    await run(['nft', 'list', 'ruleset']),
    (await run(['iptables-legacy-save'])).replace(/^# (Generated|Completed) .*\n/gm, ''),
    (await run(['ip6tables-legacy-save'])).replace(/^# (Generated|Completed) .*\n/gm, ''),
    await run(['ip', 'addr', 'show']),
    await run(['ip', 'route', 'show', 'table', 'all']),
    await run(['ip', '-6', 'route', 'show', 'table', 'all']),
    await run(['ip', 'link', 'show']),
  ];
  for (const dev of ['eth0', 'net1', 'ifb-net1']) {
    for (const what of ['qdisc', 'class', 'filter']) parts.push(await run(['tc', what, 'show', 'dev', dev]));
  }
  // Packet counters count packets (IPv6 neighbour discovery on the links, for one), not configuration.
  // `ip` names a veth peer's namespace by looking through every named one; while other files'
  // topologies come and go (files run in parallel) a lookup can fail or differ: not natgw's.
  return parts
    .join('\n')
    .replace(/\[\d+:\d+\]/g, '[n:n]')
    .replace(/packets \d+ bytes \d+/g, 'packets n bytes n')
    .replace(/^Error: Peer netns reference is invalid\.\n/gm, '')
    .replace(/ link-netns(?:id)? \S+/g, ' link-netns P');
}

/** The lines that differ, for the message. */
function changed(a: string, b: string): string {
  const al = new Set(a.split('\n'));
  const bl = new Set(b.split('\n'));
  return [
    ...a
      .split('\n')
      .filter((l) => !bl.has(l))
      .map((l) => `- ${l}`),
    ...b
      .split('\n')
      .filter((l) => !al.has(l))
      .map((l) => `+ ${l}`),
  ].join('\n');
}

describe.each(BACKENDS)('the injection corpus on $name', (backend: BackendCase) => {
  let topo: Topology;
  let daemon: Daemon | undefined;

  beforeAll(async () => {
    topo = await createTopology();
    Object.assign(topo.env, backend.env, { GATEWAY_V4: ADDR.extGateway });
    daemon = await startDaemon(topo);
    // A gateway with something of every kind, so a case that touched anything would show: the
    // corpus's base rules (init first), each accepted and seen by the dump, and an EIP and a FIP more.
    const adds = Object.entries(BASES)
      .filter(([cmd]) => !isDelete(cmd))
      .sort(([a], [b]) => Number(b === 'init') - Number(a === 'init'));
    for (const [cmd, rule] of [
      ...adds.map(([c, b]) => [c, b.rule] as const),
      ['eip-add', `${EIP}/24`] as const,
      ['floating-ip-add', `172.20.0.11,${ADDR.vpc2}`] as const,
    ]) {
      const before = await kernelDump(topo);
      const r = await topo.natgw(cmd, rule);
      if (r.exitCode !== 0 || r.stderr !== '') throw new Error(`${cmd} ${rule}: ${r.exitCode} ${r.stdout} ${r.stderr}`);
      expect(await kernelDump(topo), `the dump sees ${cmd} ${rule}`).not.toBe(before);
    }
    await waitReady(topo, daemon);
  });
  afterAll(async () => {
    if (daemon) await stopDaemon(daemon, 'SIGKILL');
    await topo?.cleanup();
  });

  it(`refuses all ${CORPUS.length} cases with one reason line each and leaves the kernel byte-identical (packet counters aside)`, async () => {
    const before = await kernelDump(topo);
    const wrong: string[] = [];
    let spot = before;
    for (const [i, c] of CORPUS.entries()) {
      const r = await topo.natgw(c.command, ...c.rules);
      const header = `${c.command} ${c.rules.join(' ')}\n`;
      const reason = c.command === 'init' ? r.stderr : r.stdout.startsWith(header) ? r.stdout.slice(header.length) : r.stdout;
      const problems = [
        r.exitCode !== 1 && `exit ${r.exitCode}`,
        c.command !== 'init' && r.stderr !== '' && `stderr ${JSON.stringify(r.stderr.slice(0, 300))}`,
        c.command !== 'init' && !r.stdout.startsWith(header) && 'stdout does not start with the command line',
        !/^Error: [^\n]*\n$/.test(reason) && `reason ${JSON.stringify(reason.slice(0, 300))}`,
        !hostileField(c).test(reason) && `reason ${JSON.stringify(reason.slice(0, 300))} does not name the field (${hostileField(c)})`,
      ].filter(Boolean);
      if (problems.length) wrong.push(`#${i} ${c.why}: ${problems.join('; ')}`);
      if ((i + 1) % SPOT === 0) {
        const now = await kernelDump(topo);
        if (now !== spot) wrong.push(`kernel changed by cases ${i + 1 - SPOT}..${i}:\n${changed(spot, now)}`);
        spot = now;
      }
    }
    expect(wrong).toEqual([]);
    // The daemon took every case and is still the same process, still ready.
    expect((await api(socketOf(topo), 'GET', '/healthz')).body?.pid).toBe(daemon!.pid);
    expect((await api(socketOf(topo), 'GET', '/readyz')).status).toBe(200);
    expect(await kernelDump(topo)).toBe(before);
    expect(daemon!.stderr()).toBe('');
    // The control: the deletes' unmutated base rules are accepted and the same dump sees them.
    for (const [cmd, base] of Object.entries(BASES).filter(([c]) => isDelete(c))) {
      const was = await kernelDump(topo);
      const r = await topo.natgw(cmd, base.rule);
      expect({ exit: r.exitCode, stderr: r.stderr }, `${cmd} ${base.rule}: ${r.stdout}`).toEqual({ exit: 0, stderr: '' });
      expect(await kernelDump(topo), `the dump sees ${cmd} ${base.rule}`).not.toBe(was);
    }
  }, 150_000);
});
