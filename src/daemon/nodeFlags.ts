/**
 * V8 settings for the long-running daemon. Node's default young generation (up to 16 MiB per
 * semi-space) and its generous heap growth keep the garbage of a bulk change (a 2 MiB state
 * document, parsed, validated and rendered) resident: at 10,000 DNAT + 10,000 FIP the daemon
 * then peaks near 150 MiB; with a 1 MiB semi-space it peaks near 110 MiB at the same speed
 * (`npm run bench`). The old-space cap is far above what 20,000 objects use (under 80 MiB of
 * heap), so it never starves a large gateway; it only makes the collector keep up.
 *
 * Measured again after the bulk path stopped copying the state through zod: an 8 MiB semi-space
 * saves ~0.1 s of CPU in a 21,000-object PUT /v1/state, but the iptables daemon at 10,000
 * objects then holds 146 MiB (peak 148) against 126 (132) with 1 MiB, at the edge of the
 * 150 MiB budget; 16 MiB goes over it. 1 MiB stays.
 *
 * And again after the digest stopped building the state's text (bulk bench, 10,000 objects,
 * 1/2/4 MiB interleaved, 4 runs each per backend, 2-core machine at load 4-5; PUT ÷ raw apply,
 * medians): nftables ×2.5 / ×3.3 / ×2.6, iptables ×2.8 / ×2.5 / ×2.3, within the runs' noise
 * (×1.2-×4.6); RSS peak after the PUT 105-106 / 100-105 / 105-110 MiB (nftables) and
 * 116-119 / 115-124 / 119-122 MiB (iptables). No gain to pay memory for: 1 MiB stays.
 *
 * Then tried off the command line: any V8 flag there makes V8 refuse Node's embedded code cache
 * of its built-in modules (the flags are part of the cache's check), so every start compiles
 * `child_process`, `crypto`, `http`, ... from source (~25 ms before the API serves). Without
 * them, with the young generation kept from growing at run time (`--semi-space-growth-factor=1`
 * through v8.setFlagsFromString once the API served), a bulk PUT peaked about as before, but
 * per-command work at 10,000 objects let the heap grow without bound in practice: the iptables
 * daemon went 108 → 128 → 149 → 200 → 210 MiB (peak) over four series of 180 API commands,
 * against a plateau at 110 (peak 131) MiB with these flags (same build, same run). The 150 MiB
 * budget is a target of issue 8; 25 ms of start is not worth breaking it. Back on the command line.
 *
 * And their cost to the start is gone: V8 reads these two only when it makes the heap, so the
 * daemon's entries set them back to their defaults before any built-in module is compiled
 * (bin/heapFlags.cjs): the heap keeps the bounds they gave it, and the flag hash is Node.js's
 * own again, so its built-in code cache (and the bundle's, written after the same reset) is
 * accepted. The loader's replay now spawns its first `nft` ~16 ms after Node.js's own start.
 *
 * With the start cheap again, its garbage collection showed: ~50 scavenges of a 1 MiB young
 * generation between the spawn and the first sync's end (`--trace-gc`), on the main thread
 * while a restore's replay needed the other core. 4 MiB, interleaved with 1 MiB, 5 restores each
 * (nftables, 10,000 objects): the daemon's CPU from `serve` to its first sync's end 67-70 ms
 * against 88-94, spawn → `/readyz` ×1.41-1.50 of the raw `nft -f` against ×1.51-1.61. RSS at
 * 10,000 objects (`npm run bench`): 109/114 MiB (iptables) and 109/119 MiB (nftables), now/peak,
 * against 98/112 and 106/106 with 1 MiB; after a bulk PUT 98/106 and 95/96. Within the 150 MiB
 * budget: 4 MiB.
 *
 * What they still cost (2-core machine, medians of 9 starts): Node.js's own bootstrap, before
 * any user code can reset them, reaches the first line of a script at ~26 ms against ~20 without
 * flags, and the same with any other V8 flag (`--stack-size=985`): the modules it loads before
 * that line are compiled under the flagged hash. The reset itself took ~5.5 ms while it loaded
 * node:v8 for its setter; through V8's binding it takes ~0.5 ms (bin/heapFlags.cjs).
 *
 * Applied where natgw starts the daemon: the autostart (cli/forward.ts) and the shim's
 * `serve` (image/nat-gateway.sh, kept equal to this by a test).
 */
export const DAEMON_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=4', '--max-old-space-size=1024'];

/**
 * Set by the daemon once its API serves (serve.ts, v8.setFlagsFromString). None now: the
 * command-line flags above bound the young generation already. Kept as the place for a
 * flag that must not be set before the built-ins and the bundle are compiled.
 * (This module stays free of imports: the shim's Node.js path loads it through cli/forward.ts.)
 */
export const DAEMON_RUNTIME_V8_FLAGS: readonly string[] = [];
