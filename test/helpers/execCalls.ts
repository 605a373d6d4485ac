import type { ExecRequest } from '../../src/system/exec.js';

/** A recorded tool run as one line, for comparing what the engine ran. */
export const cmd = (r: ExecRequest): string => [r.file, ...r.args].join(' ');

/** A run that reads the kernel back (a listing): a partial sync runs none. */
export const isListing = (r: ExecRequest): boolean =>
  r.args.some((a) => a === 'list' || a === 'show' || a.endsWith('-save')) || (r.file === 'ip' && r.args.includes('-j'));

/** An nft transaction. */
export const isApply = (r: ExecRequest): boolean => r.file === 'nft' && r.args.includes('-f');
