/**
 * The image lab: the lab (scripts/lab.ts) against natgw's built image instead of the checkout,
 * then the no-zombie proof. natgw is driven only through the image's own
 * `bash /kube-ovn/nat-gateway.sh <command> …`, in a "pod" whose PID 1 is `sleep infinity` —
 * the controller's pod spec — and which sits in the lab's gateway namespace:
 *
 * - podman: `podman run --entrypoint sleep … infinity` + `podman exec`, where the runtime works;
 * - chroot: where it does not (crun/runc cannot set rlimits on some machines), the image's
 *   files as a `podman mount`ed container, entered with chroot (image/chroot-enter.sh) under
 *   `unshare --pid --fork --mount-proc`, with `nsenter` standing in for `podman exec`.
 *
 * The podman path is written for machines where `podman run` works; the machine this was
 * developed on has none, so only the chroot path has run there.
 *
 * Run as root: `node dist/scripts/imageLab.js [image]` (image/lab.sh builds first).
 * NATGW_IMAGE_LAB_MODE=podman|chroot forces a path; by default podman is tried first.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, readdirSync, readlinkSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { parseAllDocuments } from 'yaml';
import { ADDR, createTopology, REPO_ROOT, type ExecResult, type Topology } from '../test/helpers/netns.js';
import { parsePeer, request, startServer, type ServerHandle } from '../test/helpers/traffic.js';
import { waitFor } from '../test/helpers/poll.js';
import { runLab, type NatgwRunner } from './lab.js';

const IMAGE = process.argv[2] ?? process.env.NATGW_IMAGE ?? 'localhost/natgw:dev';
/** Where the controller finds the shim (Kube-OVN's `kubectl exec … bash /kube-ovn/nat-gateway.sh`). */
const SHIM = '/kube-ovn/nat-gateway.sh';
const ENTER = join(REPO_ROOT, 'image', 'chroot-enter.sh');
/** The environment of an exec in the image: its own PATH, nothing inherited from this host. */
const IMAGE_ENV = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', HOME: '/root', LC_ALL: 'C' };
const ZOMBIE_COMMANDS = 200;

type Mode = 'podman' | 'chroot';

/** A host command, never through a shell; resolves with its result whatever the exit code. */
function host(argv: readonly string[], timeoutMs = 60_000): Promise<ExecResult> {
  const [file, ...args] = argv;
  return new Promise((resolve) => {
    execFile(file ?? '', args, { timeout: timeoutMs, maxBuffer: 16 << 20, encoding: 'utf8' }, (err, stdout, stderr) => {
      const e = err as (NodeJS.ErrnoException & { code?: number | string; killed?: boolean }) | null;
      const exitCode = e === null ? 0 : typeof e.code === 'number' ? e.code : 127;
      resolve({ exitCode, stdout, stderr: e !== null && typeof e.code !== 'number' && stderr === '' ? String(e) : stderr, timedOut: e?.killed === true });
    });
  });
}

async function hostOk(argv: readonly string[], timeoutMs?: number): Promise<string> {
  const r = await host(argv, timeoutMs);
  if (r.exitCode !== 0) throw new Error(`${argv.join(' ')} exited ${r.exitCode}: ${r.stderr.trim()}`);
  return r.stdout.trim();
}

/**
 * What a pod's PID 1 runs: `sleep infinity` (the controller's pod spec), or the image's own
 * ENTRYPOINT and CMD (natgw as the main process), with this environment.
 */
interface PodCommand {
  readonly argv: 'sleep' | 'image';
  readonly env: Readonly<Record<string, string>>;
  /** Written into the pod's root before PID 1 starts (what volume mounts would provide). */
  readonly files?: Readonly<Record<string, string>>;
}
const SLEEP: PodCommand = { argv: 'sleep', env: {} };

/** A running "pod" of the image in the gateway namespace. */
interface Pod {
  /** PID 1 of the pod's PID namespace, as this host sees it. */
  readonly pid1: number;
  exec(argv: readonly string[], env: Readonly<Record<string, string>>): Promise<ExecResult>;
  remove(): Promise<void>;
}

let podSeq = 0;
const podName = (topo: Topology) => `natgw-lab-${topo.prefix}${podSeq++}`;

function envPairs(env: Readonly<Record<string, string>>): string[] {
  return Object.entries({ ...IMAGE_ENV, ...env }).map(([k, v]) => `${k}=${v}`);
}

async function startPodmanPod(topo: Topology, cmd: PodCommand): Promise<Pod> {
  const name = podName(topo);
  const run = cmd.argv === 'sleep' ? ['--entrypoint', 'sleep', IMAGE, 'infinity'] : [IMAGE];
  const env = Object.entries(cmd.env).flatMap(([k, v]) => ['-e', `${k}=${v}`]);
  // Privileged and in the gateway's network namespace, as Kube-OVN's gateway pod is.
  await hostOk(['podman', 'create', '--name', name, '--privileged', '--network', `ns:/run/netns/${topo.ns.gw}`, ...env, ...run]);
  const root = await hostOk(['podman', 'mount', name]);
  writeFiles(root, cmd.files);
  await hostOk(['podman', 'umount', name]);
  await hostOk(['podman', 'start', name]);
  const pid1 = Number(await hostOk(['podman', 'inspect', '--format', '{{.State.Pid}}', name]));
  return {
    pid1,
    exec: (argv, env) => host(['podman', 'exec', '-i', ...envPairs(env).flatMap((p) => ['-e', p]), name, ...argv], 45_000),
    remove: async () => void (await host(['podman', 'rm', '-f', '-t', '0', name])),
  };
}

function writeFiles(root: string, files: Readonly<Record<string, string>> = {}): void {
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(root, path)), { recursive: true });
    writeFileSync(join(root, path), text, { mode: 0o600 });
  }
}

/** The image's ENTRYPOINT and CMD, as a runtime would start them. */
async function imageCommand(): Promise<string[]> {
  const cfg = JSON.parse(await hostOk(['podman', 'image', 'inspect', '--format', '{{json .Config}}', IMAGE])) as { Entrypoint?: string[]; Cmd?: string[] };
  return [...(cfg.Entrypoint ?? []), ...(cfg.Cmd ?? [])];
}

async function startChrootPod(topo: Topology, cmd: PodCommand): Promise<Pod> {
  const name = podName(topo);
  const argv = cmd.argv === 'sleep' ? ['sleep', 'infinity'] : await imageCommand();
  const comm = (argv[0] ?? '').split('/').at(-1) ?? '';
  // A container's own writable root, not the read-only image mount: the state dir lives in it.
  await hostOk(['podman', 'create', '--name', name, IMAGE]);
  let pid1 = 0;
  let sleeper: ReturnType<Topology['spawn']> | undefined;
  try {
    const root = await hostOk(['podman', 'mount', name]);
    writeFiles(root, cmd.files);
    // `env -i`: PID 1 gets the pod's environment, nothing of this host's.
    const env = ['env', '-i', ...envPairs(cmd.env)];
    sleeper = topo.spawn('gw', ['unshare', '--pid', '--fork', '--mount-proc', 'bash', ENTER, root, ...env, ...argv]);
    const unsharePid = sleeper.pid;
    if (unsharePid === undefined) throw new Error('could not start unshare');
    // `ip netns exec` execs unshare in place; its one child becomes PID 1 and ends up as sleep.
    pid1 = await waitFor(
      async () => {
        const child = Number(readFileSync(`/proc/${unsharePid}/task/${unsharePid}/children`, 'utf8').trim().split(' ')[0]);
        return child > 0 && readFileSync(`/proc/${child}/comm`, 'utf8').trim() === comm ? child : undefined;
      },
      { what: `${argv.join(' ')} as PID 1 of the chroot pod ${name}`, timeoutMs: 15_000, intervalMs: 50 },
    );
  } catch (err) {
    sleeper?.kill('SIGKILL');
    await host(['podman', 'rm', '-f', name]);
    throw err;
  }
  const pid = String(pid1);
  return {
    pid1,
    // nsenter forks into the PID namespace from outside it, as `podman exec` does.
    exec: (argv, env) => host(['nsenter', '-t', pid, '-m', '-n', '-p', '-r', '-w', '--', 'env', '-i', ...envPairs(env), ...argv], 45_000),
    remove: async () => {
      // The end of a PID namespace's init takes every process in it along (the daemon too).
      try {
        process.kill(pid1, 'SIGKILL');
      } catch {
        // Already gone.
      }
      await waitFor(async () => sleeper?.exitCode !== null || sleeper.signalCode !== null, {
        what: `pod ${name} to stop`,
        timeoutMs: 15_000,
        intervalMs: 50,
      }).catch(() => undefined);
      await host(['podman', 'umount', name]);
      await host(['podman', 'rm', '-f', name]);
    },
  };
}

async function chooseMode(): Promise<{ mode: Mode; why: string }> {
  const forced = process.env.NATGW_IMAGE_LAB_MODE;
  if (forced === 'podman' || forced === 'chroot') return { mode: forced, why: 'NATGW_IMAGE_LAB_MODE' };
  const r = await host(['podman', 'run', '--rm', '--network', 'none', '--entrypoint', 'true', IMAGE]);
  if (r.exitCode === 0) return { mode: 'podman', why: '`podman run` works here' };
  const reason = r.stderr.trim().split('\n').pop() ?? `exit ${r.exitCode}`;
  return { mode: 'chroot', why: `\`podman run\` fails here: ${reason}` };
}

const startPod = (mode: Mode, topo: Topology, cmd: PodCommand = SLEEP): Promise<Pod> =>
  mode === 'podman' ? startPodmanPod(topo, cmd) : startChrootPod(topo, cmd);

/** natgw's environment inside the pod: the lab's keys, with the state under the pod's own root. */
function podEnv(topo: Topology): Record<string, string> {
  const stateDir = `/var/lib/natgw-lab/${topo.prefix.replace(/-$/, '')}`;
  const keys = Object.entries(topo.natgwEnv()).filter(([k]) => k.startsWith('NATGW_') || k.startsWith('GATEWAY_'));
  return {
    ...Object.fromEntries(keys),
    NATGW_STATE_DIR: stateDir,
    NATGW_ENV_FILE: `${stateDir}/nat-gateway.env`,
    NATGW_SOCKET: `${stateDir}/natgw.sock`,
    // The controller's pod runs `sleep infinity`: the first command autostarts the daemon and
    // every later one reaches it through nc -U, so both of the shim's paths are exercised.
    NATGW_AUTOSTART: 'true',
  };
}

class ImageRunner implements NatgwRunner {
  private readonly pods = new Map<Topology, Pod>();
  constructor(private readonly mode: Mode) {}

  async setup(topo: Topology): Promise<void> {
    const pod = await startPod(this.mode, topo);
    this.pods.set(topo, pod);
    const env = podEnv(topo);
    const r = await pod.exec(['mkdir', '-p', env.NATGW_STATE_DIR ?? ''], {});
    if (r.exitCode !== 0) throw new Error(`mkdir in the pod: ${r.stderr}`);
  }

  run(topo: Topology, command: string, ...rules: string[]): Promise<ExecResult> {
    const pod = this.pods.get(topo);
    if (pod === undefined) throw new Error('no pod for this topology');
    return pod.exec(['bash', SHIM, command, ...rules], podEnv(topo));
  }

  async teardown(topo: Topology): Promise<void> {
    await this.pods.get(topo)?.remove();
    this.pods.delete(topo);
  }
}

// ---------------------------------------------------------------------------------
// Zombies: processes of the pod's PID namespace, read from this host's /proc.
// ---------------------------------------------------------------------------------

interface PodProcess {
  readonly pid: number;
  readonly ppid: number;
  readonly state: string;
  readonly cmdline: string;
}

function podProcesses(pid1: number): PodProcess[] {
  const ns = readlinkSync(`/proc/${pid1}/ns/pid`);
  const out: PodProcess[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readlinkSync(`/proc/${entry}/ns/pid`) !== ns) continue;
      // The state follows the parenthesised command name, which may itself hold spaces.
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const [state = '?', ppid = '0'] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0').join(' ').trim();
      out.push({ pid: Number(entry), ppid: Number(ppid), state, cmdline });
    } catch {
      // Exited while we looked.
    }
  }
  return out;
}

/**
 * The daemon, whatever its command line: the processes of the pod holding the Unix socket that
 * listens at `socket` (the pod's network namespace's /proc/net/unix names the listener's inode;
 * /proc/<pid>/fd shows who holds it).
 */
function daemonPids(pid1: number, socket: string, procs: readonly { pid: number }[]): number[] {
  // Num RefCount Protocol Flags Type St Inode Path; Flags 00010000 is __SO_ACCEPTCON (listening).
  const inodes = new Set(
    readFileSync(`/proc/${pid1}/net/unix`, 'utf8')
      .split('\n')
      .slice(1)
      .map((l) => l.trim().split(/\s+/))
      .filter((f) => f[7] === socket && (Number.parseInt(f[3] ?? '0', 16) & 0x10000) !== 0)
      .map((f) => `socket:[${f[6]}]`),
  );
  return procs
    .filter((p) => {
      try {
        return readdirSync(`/proc/${p.pid}/fd`).some((fd) => inodes.has(readlinkSafe(`/proc/${p.pid}/fd/${fd}`)));
      } catch {
        return false; // exited while we looked
      }
    })
    .map((p) => p.pid);
}

/**
 * The pod's zombies that stay: a child of the daemon that has just exited is a zombie until the
 * daemon reaps it a moment later, so each zombie seen is given ZOMBIE_GRACE_MS to go. An orphan
 * under a PID 1 that never reaps stays for good.
 */
async function lingeringZombies(pid1: number): Promise<PodProcess[]> {
  const first = podProcesses(pid1).filter((p) => p.state === 'Z');
  if (first.length === 0) return [];
  const still = () => podProcesses(pid1).filter((p) => p.state === 'Z' && first.some((z) => z.pid === p.pid));
  await waitFor(async () => still().length === 0, { what: 'zombies to be reaped', timeoutMs: ZOMBIE_GRACE_MS }).catch(() => undefined);
  return still();
}

const ZOMBIE_GRACE_MS = 3_000;

const zombieText = (z: readonly PodProcess[]): string => z.map((p) => `${p.pid} (parent ${p.ppid})`).join(', ');

function readlinkSafe(path: string): string {
  try {
    return readlinkSync(path);
  } catch {
    return '';
  }
}

/** ZOMBIE_COMMANDS shim commands in a pod whose PID 1 never reaps: a daemon, no zombies. */
async function zombieCheck(mode: Mode): Promise<number> {
  console.log(`\nno-zombie check — ${ZOMBIE_COMMANDS} commands through ${SHIM}, PID 1 \`sleep infinity\` (${mode})`);
  const topo = await createTopology();
  let pod: Pod | undefined;
  let failed = 0;
  const report = (ok: boolean, what: string) => {
    console.log(`  ${ok ? '✓' : '✗'} ${what}`);
    if (!ok) failed++;
  };
  try {
    Object.assign(topo.env, { GATEWAY_NETFILTER_MODE: 'nftables', GATEWAY_V4: ADDR.extGateway });
    pod = await startPod(mode, topo);
    const env = podEnv(topo);
    await pod.exec(['mkdir', '-p', env.NATGW_STATE_DIR ?? ''], {});
    const commands: string[][] = [['init']];
    for (let i = 0; commands.length < ZOMBIE_COMMANDS - 1; i++) {
      const eip = `172.20.0.${20 + (i % 50)}`;
      const dnat = `${eip},${8000 + i},tcp,${ADDR.vpc1},80`;
      commands.push(['eip-add', `${eip}/24`], ['snat-add', `${eip},${ADDR.vpcCidr}`], ['dnat-add', dnat]);
      commands.push(['dnat-del', dnat], ['snat-del', `${eip},${ADDR.vpcCidr}`], ['eip-del', `${eip}/24`]);
    }
    commands.length = ZOMBIE_COMMANDS - 1;
    // One command natgw answers in Node.js itself, never through the daemon.
    commands.push(['get-iptables-version']);
    let ok = 0;
    const failures: string[] = [];
    for (const [command, ...rules] of commands) {
      const r = await pod.exec(['bash', SHIM, command ?? '', ...rules], env);
      if (r.exitCode === 0 && r.stderr === '') ok++;
      else if (failures.length < 3) failures.push(`${command} ${rules.join(' ')} → exit ${r.exitCode} ${r.stderr.trim()}`);
    }
    report(ok === commands.length, `${ok}/${commands.length} commands exited 0 with empty stderr${failures.length ? `: ${failures.join('; ')}` : ''}`);
    const procs = podProcesses(pod.pid1);
    const daemon = procs.find((p) => daemonPids(pod?.pid1 ?? 0, env.NATGW_SOCKET ?? '', procs).includes(p.pid) && p.state !== 'Z');
    report(daemon !== undefined, `the autostarted daemon runs: ${daemon ? `pid ${daemon.pid}, ${daemon.cmdline}` : 'none'}`);
    const zombies = await lingeringZombies(pod.pid1);
    report(
      zombies.length === 0,
      `zombie processes that stay: ${zombies.length}${zombies.length ? ` (${zombieText(zombies)}; the pod: ${procs.map((p) => `${p.pid} ${p.state} ${p.cmdline.slice(0, 40)}`).join(' | ')})` : ` (of ${procs.length} in the pod)`}`,
    );
    // Control: the count above can fail. An orphan that exits under this PID 1 stays a zombie.
    const orphan = await pod.exec(['bash', '-c', '(sleep 0 &)'], {});
    const seen = await waitFor(async () => podProcesses(pod?.pid1 ?? 0).filter((p) => p.state === 'Z').length || undefined, {
      what: 'the control orphan to show up as a zombie',
      timeoutMs: 10_000,
    }).catch(() => 0);
    const stays = seen > 0 ? await lingeringZombies(pod.pid1) : [];
    report(
      orphan.exitCode === 0 && stays.length > 0,
      `control: an orphan left by \`bash -c '(sleep 0 &)'\` is seen as a zombie that stays (${zombieText(stays) || 'none'})`,
    );
    // Last, as it starts tools the zombie count above would catch mid-exit. Node.js lives in
    // /usr/local/bin: without it on PATH only the shim's nc client can answer.
    const viaNc = await pod.exec(['bash', SHIM, 'eip-add', '172.20.0.99/24'], { ...env, PATH: '/usr/sbin:/usr/bin:/sbin:/bin' });
    report(
      viaNc.exitCode === 0 && viaNc.stderr === '',
      `a command reaches the daemon through nc -U, Node.js off PATH (exit ${viaNc.exitCode}${viaNc.stderr ? `, ${viaNc.stderr.trim()}` : ''})`,
    );
  } catch (err) {
    report(false, `error: ${String(err)}`);
  } finally {
    await pod?.remove().catch(() => undefined);
    await topo.cleanup();
  }
  return failed;
}

/**
 * What image/deploy gives the StatefulSet's pod: the env file (with the TCP API turned on as
 * its comment says: both lines uncommented, bound to the lab's VPC-side address), a random
 * token where the Secret would put it (the Secret's own is a placeholder natgw refuses), the probes.
 */
function deployManifest(): { envFile: string; tokenFile: string; token: string; probes: Record<'liveness' | 'readiness', string[]> } {
  const dir = join(REPO_ROOT, 'image', 'deploy');
  const docs = readdirSync(dir)
    .filter((f) => /\.ya?ml$/.test(f))
    .flatMap((f) => parseAllDocuments(readFileSync(join(dir, f), 'utf8')).map((d) => d.toJS() as Record<string, any>));
  const shipped = docs.find((d) => d.kind === 'ConfigMap' && typeof d.data?.['nat-gateway.env'] === 'string')?.data['nat-gateway.env'] as string;
  const tokenFile = /^#?NATGW_TOKEN_FILE=(.*)$/m.exec(shipped)?.[1] ?? '';
  const envFile = shipped.replace(/^#NATGW_LISTEN=.*$/m, `NATGW_LISTEN=${ADDR.gw}:8443`).replace(/^#NATGW_TOKEN_FILE=/m, 'NATGW_TOKEN_FILE=');
  const main = docs.find((d) => d.kind === 'StatefulSet')?.spec.template.spec.containers[0] as Record<string, any>;
  return {
    envFile,
    tokenFile,
    token: randomBytes(32).toString('hex'),
    probes: { liveness: main.livenessProbe.exec.command, readiness: main.readinessProbe.exec.command },
  };
}

/**
 * natgw as the pod's main process, as image/deploy/natgw-gateway.yaml runs it: the image's own
 * ENTRYPOINT and CMD as PID 1, the manifest's env file and token where its volumes put them,
 * its probes, commands through the shim, traffic, the TCP API with its token, no zombies.
 */
async function mainProcessCheck(mode: Mode): Promise<number> {
  const manifest = deployManifest();
  console.log(
    `\nmain process — PID 1 is the image's own command (${(await imageCommand()).join(' ')}), configured as image/deploy/natgw-gateway.yaml (${mode})`,
  );
  const topo = await createTopology();
  const servers: ServerHandle[] = [];
  let pod: Pod | undefined;
  let failed = 0;
  const report = (ok: boolean, what: string) => {
    console.log(`  ${ok ? '✓' : '✗'} ${what}`);
    if (!ok) failed++;
  };
  try {
    // The manifest's env file names the lab's upstream gateway; the lab depends on that.
    if (!manifest.envFile.includes(`GATEWAY_V4=${ADDR.extGateway}`)) throw new Error(`the manifest's env file no longer sets GATEWAY_V4=${ADDR.extGateway}`);
    const port = /^NATGW_LISTEN=.*:(\d+)$/m.exec(manifest.envFile)?.[1] ?? '';
    if (manifest.tokenFile === '' || port === '') throw new Error("the manifest's env file no longer names NATGW_LISTEN and NATGW_TOKEN_FILE");
    pod = await startPod(mode, topo, {
      argv: 'image',
      env: {},
      files: { '/etc/kube-ovn/nat-gateway.env': manifest.envFile, [manifest.tokenFile]: manifest.token },
    });
    const p = pod;
    const probe = (which: 'liveness' | 'readiness') => p.exec(manifest.probes[which], {});
    const live = await waitFor(async () => (await probe('liveness')).exitCode === 0, {
      what: 'the liveness probe to pass',
      timeoutMs: 30_000,
      intervalMs: 200,
    }).catch(() => false);
    report(live, `liveness probe (${manifest.probes.liveness.join(' ')}) passes`);
    const cmds: string[][] = [['init'], ['eip-add', '172.20.0.10/24'], ['snat-add', `172.20.0.10,${ADDR.vpcCidr}`]];
    for (const [command, ...rules] of cmds) {
      const r = await p.exec(['bash', SHIM, command ?? '', ...rules], {});
      report(
        r.exitCode === 0 && r.stderr === '',
        `${SHIM} ${command} ${rules.join(' ')}  (exit ${r.exitCode}${r.stderr ? `, stderr: ${r.stderr.trim()}` : ''})`,
      );
    }
    const ready = await waitFor(async () => (await probe('readiness')).exitCode === 0, {
      what: 'the readiness probe to pass',
      timeoutMs: 30_000,
      intervalMs: 200,
    }).catch(() => false);
    report(ready, 'readiness probe (/readyz) passes after init');
    const server = startServer(topo, 'ext', 'tcp', 7001);
    servers.push(server);
    await server.ready;
    const seen = await request(topo, 'vpc1', 'tcp', ADDR.extHost, 7001).then(
      (l) => parsePeer(l).ip,
      (e: Error) => `failed: ${e.message}`,
    );
    report(seen === '172.20.0.10', `SNAT (TCP): the external host sees vpc1 as the EIP (${seen})`);
    const url = `http://${ADDR.gw}:${port}`;
    const curl = (path: string, ...extra: string[]) =>
      topo
        .exec('vpc1', ['curl', '-s', '-o', '/dev/null', '-w', '%{http_code}', '--max-time', '5', ...extra, `${url}${path}`], { reject: false })
        .then((r) => r.stdout);
    const codes = [await curl('/healthz'), await curl('/v1/state'), await curl('/v1/state', '-H', `Authorization: Bearer ${manifest.token}`)];
    report(codes.join(' ') === '200 401 200', `TCP API ${url}: /healthz open, /v1/state 401 without and 200 with the Secret's token (${codes.join(' ')})`);
    const procs = podProcesses(p.pid1);
    const pid1 = procs.find((x) => x.pid === p.pid1);
    const listeners = daemonPids(p.pid1, /^NATGW_SOCKET=(.*)$/m.exec(manifest.envFile)?.[1] ?? '/run/natgw/natgw.sock', procs);
    const daemons = procs.filter((x) => listeners.includes(x.pid) && x.state !== 'Z');
    const parent = daemons[0] === undefined ? -1 : Number(/^PPid:\s*(\d+)/m.exec(readFileSync(`/proc/${daemons[0].pid}/status`, 'utf8'))?.[1]);
    report(
      daemons.length === 1 && parent === p.pid1,
      `one daemon, PID 1's child (PID 1: ${pid1?.cmdline}; daemon: ${daemons.map((d) => d.cmdline).join(' | ')})`,
    );
    // The daemon's nftables changes go through its libnftables helper (python3-nftables is in the image).
    const helper = procs.find((x) => x.ppid === daemons[0]?.pid && x.cmdline.includes('from nftables import Nftables'));
    report(
      helper !== undefined,
      `the daemon's libnftables helper runs${helper ? ` (pid ${helper.pid}, ${helper.cmdline.split(' ').slice(0, 3).join(' ')} …)` : ''}`,
    );
    const zombies = await lingeringZombies(p.pid1);
    report(
      zombies.length === 0,
      `zombie processes that stay: ${zombies.length}${zombies.length ? ` (${zombieText(zombies)})` : ''} (of ${procs.length} in the pod)`,
    );
  } catch (err) {
    report(false, `error: ${String(err)}`);
  } finally {
    await Promise.all(servers.map((s) => s.stop().catch(() => undefined)));
    await pod?.remove().catch(() => undefined);
    await topo.cleanup();
  }
  return failed;
}

async function main(): Promise<number> {
  const size = Number(await hostOk(['podman', 'image', 'inspect', '--format', '{{.Size}}', IMAGE]));
  const { mode, why } = await chooseMode();
  console.log(`image ${IMAGE}: ${(size / 1e6).toFixed(1)} MB; path: ${mode} (${why})`);
  let failed = await runLab(new ImageRunner(mode), `natgw image lab (${mode})`);
  failed += await mainProcessCheck(mode);
  failed += await zombieCheck(mode);
  console.log(failed === 0 ? '\nall checks passed; pods and namespaces removed' : `\n${failed} check(s) FAILED; pods and namespaces removed`);
  return failed === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (e: unknown) => {
    console.error(e);
    process.exit(1);
  },
);
