/**
 * QoS through the API: `POST /v1/legacy` of one `eip-egress-qos-add` (a new rule on EXT) and its
 * `eip-egress-qos-del`, with the device holding `size` rules in all, against one bare
 * `tc class show dev net1` (the floor: one tc process in the gateway's namespace) in the same run.
 * Rounds alternate: one floor sample, then one add and its delete. Ratios: of the medians, and the
 * median of each round's command over that round's floor.
 *
 *   node dist/bench/qos.js [--sizes 1,100] [--rounds 30] [--warmup 5] [--backend nftables]
 *
 * Prints one line per size and, last, one JSON line with every figure.
 */
import { api, must } from './daemon.js';
import { type BackendName, Gateway, using } from './gateway.js';
import { progress } from './progress.js';
import { round, summarize, timed } from './stats.js';

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback;
}

const sizes = arg('sizes', '1,100').split(',').map(Number);
const rounds = Number(arg('rounds', '30'));
const warmup = Number(arg('warmup', '5'));
const backend = arg('backend', 'nftables') as BackendName;

const ruleIp = (i: number): string => `10.98.${(i >> 8) & 255}.${(i & 255) + 1}`;
const MEASURED = '10.97.0.1';

async function legacy(gw: Gateway, command: string, rules: string[]): Promise<number> {
  const [r, ms] = await timed(() => api(gw.socket, 'POST', '/v1/legacy', { command, rules }));
  must(r, `${command} ${rules.slice(0, 1).join(' ')}`);
  if (r.body?.status !== 0) throw new Error(`${command}: status ${String(r.body?.status)}: ${JSON.stringify(r.body).slice(0, 300)}`);
  return ms;
}

async function measure(size: number): Promise<Record<string, number>> {
  return using(
    () => Gateway.withDaemon({ backend, resync: '1h' }),
    async (gw) => {
      await legacy(gw, 'init', ['eth0,net1']);
      // size − 1 rules already there (priorities 1–4, as a controller spreads them), then the measured one.
      const fill = Array.from({ length: size - 1 }, (_, i) => `${ruleIp(i)},${1 + (i % 4)},10,1`);
      if (fill.length > 0) await legacy(gw, 'eip-egress-qos-add', fill);
      const floor: number[] = [];
      const add: number[] = [];
      const del: number[] = [];
      for (let k = 0; k < warmup + rounds; k++) {
        const f = await gw.runner.run(['tc', 'class', 'show', 'dev', 'net1']);
        if (f.exitCode !== 0) throw new Error(`tc class show dev net1: ${f.stderr}`);
        const a = await legacy(gw, 'eip-egress-qos-add', [`${MEASURED},2,20,1`]);
        const d = await legacy(gw, 'eip-egress-qos-del', [MEASURED]);
        if (k < warmup) continue;
        floor.push(f.ms);
        add.push(a);
        del.push(d);
      }
      const [fl, ad, de] = [summarize(floor), summarize(add), summarize(del)];
      // Under a shifting load the floor moves too: each round's command over that round's floor, then their median.
      const perRound = (xs: number[]) => summarize(xs.map((x, i) => x / floor[i]!)).median;
      return {
        size,
        floorMs: fl.median,
        addMs: ad.median,
        delMs: de.median,
        addRatio: round(ad.median / fl.median),
        delRatio: round(de.median / fl.median),
        addRoundRatio: perRound(add),
        delRoundRatio: perRound(del),
      };
    },
  );
}

const results: Record<string, number>[] = [];
for (const size of sizes) {
  progress(`qos: ${size} rule(s) on net1, ${rounds} rounds (${backend})`);
  const r = await measure(size);
  results.push(r);
  console.log(
    `${size} rule(s): floor (tc class show) ${r.floorMs} ms; add ${r.addMs} ms = ×${r.addRatio} (per round ×${r.addRoundRatio}); del ${r.delMs} ms = ×${r.delRatio} (per round ×${r.delRoundRatio})`,
  );
}
console.log(JSON.stringify({ qos: results, backend, rounds }));
