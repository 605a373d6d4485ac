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
  /** `curl --unix-socket … /healthz`: the shim's client alone; undefined where curl is missing. */
  readonly client?: Summary;
}

const FLOOR_CHAIN = 'NATGW_BENCH_FLOOR';
const FLOOR_TABLE = 'natgw_bench_floor';

async function series(n: number, sample: (k: number) => Promise<{ ms: number; ok: boolean }>, after?: (k: number) => Promise<unknown>): Promise<Summary> {
  const times: number[] = [];
  let failures = 0;
  for (let k = 0; k < n; k++) {
    const r = await sample(k);
    if (r.ok) times.push(r.ms);
    else failures++;
    await after?.(k);
  }
  return summarize(times, failures);
}

/**
 * natgw's own port-DNAT map when it has one (same table, same size, exactly the element a
 * dnat-add adds); otherwise a map of the same type and size in a table of the bench's own.
 */
async function nftFloor(gw: Gateway, mapSize: number, n: number): Promise<{ s: Summary; what: string; del: Summary }> {
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
  try {
    const elem = (k: number) => `172.31.255.1 . udp . ${30000 + k}`;
    const deletes: number[] = [];
    let deleteFailures = 0;
    const s = await series(
      n,
      async (k) => {
        const r = await gw.runner.run(['nft', 'add', 'element', 'ip', table, map, `{ ${elem(k)} : 10.0.1.9 . 53 }`]);
        return { ms: r.ms, ok: r.exitCode === 0 };
      },
      async (k) => {
        const r = await gw.runner.run(['nft', 'delete', 'element', 'ip', table, map, `{ ${elem(k)} }`]);
        if (r.exitCode === 0) deletes.push(r.ms);
        else deleteFailures++;
      },
    );
    return { s, what: `nft add element ip ${table} ${map}`, del: summarize(deletes, deleteFailures) };
  } finally {
    if (table === FLOOR_TABLE) await gw.runner.run(['nft', 'delete', 'table', 'ip', table]);
  }
}

/**
 * A chain of the bench's own in the nat table natgw fills: legacy iptables rewrites the whole
 * table on every change, so the table's size, not the chain's, sets the cost.
 */
async function iptablesFloor(gw: Gateway, variant: string | undefined, n: number): Promise<{ s: Summary; what: string }> {
  const t = iptablesTools(variant);
  await gw.runner.run([t.cmd, '-w', '-t', 'nat', '-N', FLOOR_CHAIN]);
  try {
    const s = await series(
      n,
      async (k) => {
        const rule = `-A ${FLOOR_CHAIN} -d 172.31.255.1/32 -p udp -m udp --dport ${30000 + k} -j DNAT --to-destination 10.0.1.9:53`;
        const r = await gw.runner.run([t.restore, '--noflush', '--wait'], { input: `*nat\n${rule}\nCOMMIT\n` });
        return { ms: r.ms, ok: r.exitCode === 0 };
      },
      () => gw.runner.run([t.cmd, '-w', '-t', 'nat', '-F', FLOOR_CHAIN]),
    );
    return { s, what: `${t.restore} --noflush (one -A)` };
  } finally {
    await gw.runner.run([t.cmd, '-w', '-t', 'nat', '-X', FLOOR_CHAIN]);
  }
}

export async function hasCurl(gw: Gateway): Promise<boolean> {
  return (await gw.runner.run(['curl', '--version'])).exitCode === 0;
}

export async function measureFloors(gw: Gateway, backend: BackendInfo, mapSize: number, n: number, curl: boolean): Promise<Floors> {
  const k: { s: Summary; what: string; del?: Summary } =
    backend.kind === 'nftables' ? await nftFloor(gw, mapSize, n) : await iptablesFloor(gw, backend.variant, n);
  const proc = (argv: string[]) =>
    series(n, async () => {
      const r = await gw.runner.run(argv);
      return { ms: r.ms, ok: r.exitCode === 0 };
    });
  return {
    kernel: k.s,
    kernelWhat: k.what,
    ...(k.del ? { kernelDelete: k.del } : {}),
    node: await proc(['node', '-e', '0']),
    bash: await proc(['bash', '-c', 'true']),
    client: curl ? await proc(['curl', '-sf', '--unix-socket', gw.socket, 'http://x/healthz']) : undefined,
  };
}
