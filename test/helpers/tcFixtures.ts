/** `tc -d filter show` of three natgw u32 filters (EIP, gateway CIDR, catch-all), as iproute2 6.1 prints it. */
export const FILTERS = `filter protocol ip pref 1 u32 chain 0 
filter protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 
filter protocol ip pref 1 u32 chain 0 fh 800::1 order 1 key ht 800 bkt 0 *flowid 1:1d3a not_in_hw 
  match 0a620002/ffffffff at 12
filter protocol ip pref 2 u32 chain 0 
filter protocol ip pref 2 u32 chain 0 fh 801: ht divisor 1 
filter protocol ip pref 2 u32 chain 0 fh 801::800 order 2048 key ht 801 bkt 0 *flowid 1:b81e not_in_hw 
  match 0a620000/ffff0000 at 16
filter protocol ip pref 3 u32 chain 0 
filter protocol ip pref 3 u32 chain 0 fh 802: ht divisor 1 
filter protocol ip pref 3 u32 chain 0 fh 802::fff order 4095 key ht 802 bkt 0 *flowid 1:ff03 not_in_hw 
  match 00000000/00000000 at 0
`;

/**
 * Answers natgw's QoS reads from listings keyed by command line, as the real tools print them:
 * `ip -j link show`, `tc qdisc show` (every device), and for the lines of a device's
 * `tc -d -raw -batch -` listing `tc class show dev D`, `tc filter show dev D` and
 * `tc filter show dev D parent ffff:` (absent keys print nothing). `tc qdisc show dev D` prints D's
 * lines of `tc qdisc show` without their `dev D` unless it has a key of its own. Like tc, a batch
 * line naming a device that `ip -j link show` does not list ends the batch with exit 1.
 */
export function answerQosRead(
  req: { file: string; args: readonly string[]; input?: string },
  listing: Readonly<Record<string, string>>,
): { stdout?: string; stderr?: string; exitCode?: number } | undefined {
  const cmd = [req.file, ...req.args].join(' ');
  if (cmd === 'ip -j link show' || cmd === 'tc qdisc show') return { stdout: listing[cmd] ?? '' };
  if (cmd !== 'tc -d -raw -batch -') return undefined;
  const links = new Set((JSON.parse(listing['ip -j link show'] ?? '[]') as { ifname: string }[]).map((l) => l.ifname));
  let stdout = '';
  const lines = (req.input ?? '').split('\n').filter((l) => l !== '');
  for (const [i, line] of lines.entries()) {
    const dev = /\bdev (\S+)/.exec(line)?.[1] ?? '';
    if (!links.has(dev)) return { stdout, stderr: `Cannot find device "${dev}"\nCommand failed -:${i + 1}\n`, exitCode: 1 };
    const own = listing[`tc ${line}`];
    if (own !== undefined) stdout += own;
    else if (line === `qdisc show dev ${dev}`) {
      stdout += (listing['tc qdisc show'] ?? '')
        .split('\n')
        .filter((l) => l.includes(` dev ${dev} `))
        .map((l) => `${l.replace(` dev ${dev} `, ' ')}\n`)
        .join('');
    }
  }
  return { stdout };
}
