import { inspect } from 'node:util';

/**
 * Polling with a deadline: the only sanctioned way for tests to wait for the kernel,
 * a daemon or a remote process to reach a state. Sleeping a fixed time is either too
 * short on a loaded CI machine or wastes time everywhere else.
 */
export interface WaitForOptions {
  /** Give up after this long (default 10 s). */
  readonly timeoutMs?: number;
  /** Pause between attempts (default 100 ms). */
  readonly intervalMs?: number;
  /** What we are waiting for, in words; it names the failure. */
  readonly what: string;
}

const NO_VALUE = Symbol('no value yet');

/**
 * Call `fn` until it resolves to something other than `undefined` or `false` and return
 * that value. A throwing attempt counts as "not yet" (the thing polled may simply not
 * exist yet); the last value or error is reported if the deadline passes.
 */
export async function waitFor<T>(fn: () => Promise<T | undefined | false>, opts: WaitForOptions): Promise<T> {
  const timeoutMs = opts.timeoutMs ?? 10_000;
  const intervalMs = opts.intervalMs ?? 100;
  const deadline = Date.now() + timeoutMs;
  let last: unknown = NO_VALUE;
  let lastError: unknown;

  for (;;) {
    const remaining = deadline - Date.now();
    try {
      // A single attempt may not outlive the deadline, or a hung probe would hang the test.
      const value = await withinMs(fn(), Math.max(remaining, 1));
      if (value !== undefined && value !== false) return value;
      last = value;
      lastError = undefined;
    } catch (err) {
      lastError = err;
    }
    if (Date.now() + intervalMs > deadline) break;
    await delay(intervalMs);
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${opts.what}; ${describeLast(last, lastError)}`);
}

function describeLast(last: unknown, lastError: unknown): string {
  if (lastError !== undefined) {
    const msg = lastError instanceof Error ? lastError.message : inspect(lastError);
    return `last attempt failed: ${msg}`;
  }
  if (last === NO_VALUE) return 'no attempt completed';
  return `last value: ${inspect(last, { depth: 4, breakLength: Infinity })}`;
}

class AttemptTimeout extends Error {
  constructor(ms: number) {
    super(`attempt still pending after ${ms} ms`);
  }
}

function withinMs<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new AttemptTimeout(ms)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

/** Internal pacing between polling attempts; not for synchronisation. */
function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
