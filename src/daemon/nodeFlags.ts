/**
 * V8 settings for the long-running daemon. Node's default young generation (up to 16 MiB per
 * semi-space) and its generous heap growth keep the garbage of a bulk change (a 2 MiB state
 * document, parsed, validated and rendered) resident: at 10,000 DNAT + 10,000 FIP the daemon
 * then peaks near 150 MiB; with a 1 MiB semi-space it peaks near 110 MiB at the same speed
 * (`npm run bench`). The old-space cap is far above what 20,000 objects use (under 80 MiB of
 * heap), so it never starves a large gateway; it only makes the collector keep up.
 *
 * Applied where natgw starts the daemon: the autostart (cli/forward.ts) and the shim's
 * `serve` (image/nat-gateway.sh, kept equal to this by a test).
 */
export const DAEMON_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=1', '--max-old-space-size=1024'];
