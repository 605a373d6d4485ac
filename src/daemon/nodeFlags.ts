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
 * Then moved off the command line: any V8 flag there makes V8 refuse Node's embedded code cache
 * of its built-in modules (the flags are part of the cache's check), so every start compiled
 * `child_process`, `crypto`, `http`, ... from source: the replay started ~8 ms later and the
 * API served ~25 ms later. The young generation is kept from growing at run time instead
 * (DAEMON_RUNTIME_V8_FLAGS, once the API serves and the built-ins are loaded); the old-space cap
 * has no run-time form and is dropped. Peak RSS after a dry run and a PUT /v1/state of 10,000
 * DNAT + 10,000 FIP + 1,000 SNAT into a fresh daemon (4 runs each, 2-core machine at load ~3):
 * nftables 97-103 → 113-117 MiB, iptables 122 → 122-123 MiB; without the run-time flag 117-120
 * (nftables). Well inside the 150 MiB budget, for a start ~25 ms sooner.
 *
 * Applied where natgw starts the daemon: the autostart (cli/forward.ts) and the shim's
 * `serve` (image/nat-gateway.sh, kept equal to this by a test); none now.
 */
export const DAEMON_NODE_FLAGS: readonly string[] = [];

/**
 * Set by the daemon once its API serves (serve.ts, v8.setFlagsFromString): the young generation
 * stays at its initial size instead of doubling under a bulk change's garbage. Not earlier: a
 * flag set before a built-in module or the bundle is compiled makes V8 refuse its code cache too.
 * (This module stays free of imports: the shim's Node.js path loads it through cli/forward.ts.)
 */
export const DAEMON_RUNTIME_V8_FLAGS: readonly string[] = ['--semi-space-growth-factor=1'];
