/**
 * Floors: what the cheapest possible version of each step costs in the same namespace, at the
 * same size, timed by the same runner as the shim. A command's figure divided by its floor
 * says how much natgw adds on top of what the kernel and the process model force anyway.
 */
import { iptablesTools, type BackendInfo, type Gateway } from './gateway.js';
import { summarize, type Summary } from './stats.js';

export interface Floors {
  /** One element into a map (nftables) or one rule through `iptables-restore --noflush` (iptables). */
  readonly kernel: Summary;
  readonly kernelWhat: string;
  /**
   * The same element deleted again (nftables): a delete waits for the kernel's RCU grace
   * period, so a delete command's floor is this, not the add's.
   */
  readonly kernelDelete?: Summary;
  readonly node: Summary;
  readonly bash: Summary;
  /** `nc -U … GET /healthz`: the shim's client alone; undefined where nc is missing. */
  readonly client?: Summary;
}

const FLOOR_CHAIN = 'NATGW_BENCH_FLOOR';
const FLOOR_TABLE = 'natgw_bench_floor';

async function series(n: number, sample: (k: number) => Promise<{ ms: number; ok: boolean }>): Promise<Summary> {
  const times: number[] = [];
  let failures = 0;
  for (let k = 0; k < n; k++) {
    const r = await sample(k);
    if (r.ok) times.push(r.ms);
    else failures++;
  }
  return summarize(times, failures);
}

/** One sample of the kernel floor: the add, and (nftables) the delete that follows it. */
export interface FloorSample {
  readonly add: { readonly ms: number; readonly ok: boolean };
  readonly del?: { readonly ms: number; readonly ok: boolean };
}

/**
 * The kernel floor as a sampler: one sample at a time, so that the per-command rounds can take
 * one beside each round of commands (bench/commands.ts). Sample k uses its own rule or element
 * and leaves the gateway as it found it.
 */
export interface KernelFloor {
  readonly what: string;
  sample(k: number): Promise<FloorSample>;
  close(): Promise<void>;
}

/**
 * natgw's own port-DNAT map when it has one (same table, same size, exactly the element a
 * dnat-add adds); otherwise a map of the same type and size in a table of the bench's own.
 */
async function nftFloor(gw: Gateway, mapSize: number): Promise<KernelFloor> {
  const probe = await gw.runner.run(['nft', 'list', 'map', 'ip', 'natgw', 'port_dnat']);
  let table = 'natgw';
  let map = 'port_dnat';
  if (probe.exitCode !== 0) {
    table = FLOOR_TABLE;
    map = 'm';
    const lines = [`add table ip ${table}`, `add map ip ${table} ${map} { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; }`];
    for (let i = 0; i < mapSize; i++)
      lines.push(`add element ip ${table} ${map} { 172.30.${(i >> 8) & 255}.${i & 255} . tcp . ${1 + (i >> 16)} : 10.0.1.6 . 80 }`);
    await gw.runner.ok(['nft', '-f', '-'], { input: `${lines.join('\n')}\n` });
  }
  const elem = (k: number) => `172.31.255.1 . udp . ${30000 + (k % 30000)}`;
  return {
    what: `nft add element ip ${table} ${map}`,
    async sample(k) {
      // Untimed first: a netlink socket's close waits for the destroy work a delete left in the
      // kernel (the RCU grace period), and natgw's own deletes just before, through its nft
      // session that never closes, leave theirs pending: the add would wait for them.
      await gw.runner.run(['nft', 'list', 'tables']);
      const a = await gw.runner.run(['nft', 'add', 'element', 'ip', table, map, `{ ${elem(k)} : 10.0.1.9 . 53 }`]);
      const d = await gw.runner.run(['nft', 'delete', 'element', 'ip', table, map, `{ ${elem(k)} }`]);
      return { add: { ms: a.ms, ok: a.exitCode === 0 }, del: { ms: d.ms, ok: d.exitCode === 0 } };
    },
    async close() {
      if (table === FLOOR_TABLE) await gw.runner.run(['nft', 'delete', 'table', 'ip', table]);
    },
  };
}

/**
 * A chain of the bench's own in the nat table natgw fills: legacy iptables rewrites the whole
 * table on every change, so the table's size, not the chain's, sets the cost.
 */
async function iptablesFloor(gw: Gateway, variant: string | undefined): Promise<KernelFloor> {
  const t = iptablesTools(variant);
  await gw.runner.run([t.cmd, '-w', '-t', 'nat', '-N', FLOOR_CHAIN]);
  return {
    what: `${t.restore} --noflush (one -A)`,
    async sample(k) {
      const rule = `-A ${FLOOR_CHAIN} -d 172.31.255.1/32 -p udp -m udp --dport ${30000 + (k % 30000)} -j DNAT --to-destination 10.0.1.9:53`;
      const r = await gw.runner.run([t.restore, '--noflush', '--wait'], { input: `*nat\n${rule}\nCOMMIT\n` });
      await gw.runner.run([t.cmd, '-w', '-t', 'nat', '-F', FLOOR_CHAIN]);
      return { add: { ms: r.ms, ok: r.exitCode === 0 } };
    },
    async close() {
      await gw.runner.run([t.cmd, '-w', '-t', 'nat', '-X', FLOOR_CHAIN]);
    },
  };
}

export function openKernelFloor(gw: Gateway, backend: BackendInfo, mapSize: number): Promise<KernelFloor> {
  return backend.kind === 'nftables' ? nftFloor(gw, mapSize) : iptablesFloor(gw, backend.variant);
}

/** The kernel floor's samples, summarised: the add and (nftables) the delete. */
export function floorSummary(samples: readonly FloorSample[]): { kernel: Summary; kernelDelete?: Summary } {
  const ok = (xs: readonly { ms: number; ok: boolean }[]) =>
    summarize(
      xs.filter((x) => x.ok).map((x) => x.ms),
      xs.filter((x) => !x.ok).length,
    );
  const dels = samples.flatMap((s) => (s.del ? [s.del] : []));
  return { kernel: ok(samples.map((s) => s.add)), ...(dels.length ? { kernelDelete: ok(dels) } : {}) };
}

/** Whether the shim's client (`nc -U`, netcat-openbsd) is installed. */
export async function hasNc(gw: Gateway): Promise<boolean> {
  return (await gw.runner.run(['sh', '-c', 'command -v nc'])).exitCode === 0;
}

const HEALTHZ = 'GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n';

/** The process floors: `node -e 0`, `bash -c true`, and the shim's nc client alone (GET /healthz). */
export async function processFloors(gw: Gateway, n: number, nc: boolean): Promise<Pick<Floors, 'node' | 'bash' | 'client'>> {
  const proc = (argv: string[], input?: string) =>
    series(n, async () => {
      const r = await gw.runner.run(argv, input === undefined ? {} : { input });
      return { ms: r.ms, ok: r.exitCode === 0 && (input === undefined || r.stdout.startsWith('HTTP/1.1 200')) };
    });
  return {
    node: await proc(['node', '-e', '0']),
    bash: await proc(['bash', '-c', 'true']),
    client: nc ? await proc(['nc', '-U', gw.socket], HEALTHZ) : undefined,
  };
}

/** Every floor, each as a series of its own (the kernel floor's n samples first). */
export async function measureFloors(gw: Gateway, backend: BackendInfo, mapSize: number, n: number, nc: boolean): Promise<Floors> {
  const floor = await openKernelFloor(gw, backend, mapSize);
  const samples: FloorSample[] = [];
  try {
    for (let k = 0; k < n; k++) samples.push(await floor.sample(k));
  } finally {
    await floor.close();
  }
  return { ...floorSummary(samples), kernelWhat: floor.what, ...(await processFloors(gw, n, nc)) };
}
