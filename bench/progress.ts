/** Progress goes to stderr, so stdout stays the tables and the final JSON line. */
const t0 = Date.now();
export function progress(msg: string): void {
  const s = ((Date.now() - t0) / 1000).toFixed(0).padStart(5);
  process.stderr.write(`[bench +${s}s] ${msg}\n`);
}

/** Things the reader of the tables must know about this run (printed under "Notes"). */
export const runNotes: string[] = [];
export function note(msg: string): void {
  if (!runNotes.includes(msg)) runNotes.push(msg);
  progress(`NOTE: ${msg}`);
}
