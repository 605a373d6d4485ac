import { promises as fs } from 'node:fs';
import type { Logger } from 'pino';

const PEER_TIMEOUT_MS = 5000;

export interface PeerView {
  readonly api: string;
  readonly digest: string | null;
  readonly divergent: boolean | null;
  readonly checkedAt: string | null;
  readonly error: string | null;
}

export interface PeerCompareOptions {
  /** The peer's natgw TCP API, e.g. http://10.99.0.2:8080. */
  readonly api: string;
  readonly tokenFile?: string;
  readonly periodMs: number;
  readonly log: Logger;
  /** This replica's digest. */
  readonly own: () => Promise<string>;
  readonly onResult: (v: PeerView) => void;
}

/**
 * Compares this replica's desired-state digest with the peer's (GET /v1/ha over the peer's
 * authenticated TCP API) every period. It reports, never repairs: which replica is right is
 * the controller's call, not a replica's.
 */
export class PeerCompare {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private view: PeerView;

  constructor(private readonly o: PeerCompareOptions) {
    this.view = { api: o.api, digest: null, divergent: null, checkedAt: null, error: null };
  }

  get last(): PeerView {
    return this.view;
  }

  start(): void {
    if (this.timer) return;
    const tick = (): void => {
      this.running = this.check()
        .then(() => undefined)
        .finally(() => {
          this.running = undefined;
          if (this.timer) this.timer = setTimeout(tick, this.o.periodMs).unref();
        });
    };
    this.timer = setTimeout(tick, 0).unref();
  }

  async stop(): Promise<void> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    await this.running;
  }

  /** One comparison; never throws. */
  async check(): Promise<PeerView> {
    const before = this.view;
    let next: PeerView;
    try {
      const token = this.o.tokenFile ? (await fs.readFile(this.o.tokenFile, 'utf8')).trim() : undefined;
      const res = await fetch(`${this.o.api}/v1/ha`, {
        headers: token ? { authorization: `Bearer ${token}` } : {},
        // Not tied to the period: a busy peer answering late is slow, not divergent.
        signal: AbortSignal.timeout(PEER_TIMEOUT_MS),
      });
      if (!res.ok) throw new Error(`HTTP ${res.status} from ${this.o.api}/v1/ha${res.status === 401 ? ' (check NATGW_HA_PEER_TOKEN_FILE)' : ''}`);
      const body = (await res.json()) as { digest?: unknown };
      if (typeof body.digest !== 'string') throw new Error(`${this.o.api}/v1/ha answered without a digest`);
      const own = await this.o.own();
      next = { api: this.o.api, digest: body.digest, divergent: body.digest !== own, checkedAt: new Date().toISOString(), error: null };
      if (next.divergent && before.divergent !== true) {
        this.o.log.warn(
          { peer: this.o.api, own, theirs: body.digest },
          "replicas disagree: the peer's desired state differs from this one (natgw changes nothing; resend the rules to both)",
        );
      } else if (!next.divergent && before.divergent === true) {
        this.o.log.info({ peer: this.o.api, digest: own }, 'replicas agree again');
      }
    } catch (e) {
      const msg = e instanceof Error ? e.message : String(e);
      next = { ...before, checkedAt: new Date().toISOString(), error: msg };
      if (before.error === null) this.o.log.warn({ peer: this.o.api, err: msg }, "cannot read the peer's digest; retrying every resync period");
    }
    this.view = next;
    this.o.onResult(next);
    return next;
  }
}

/**
 * Ask the peer to resend its whole kernel table (POST /v1/ha/resend): what a (re)joining
 * active-active replica needs, since flows the peer received from others never enter its
 * conntrackd's internal cache. Resolves to the number of flows the peer sent; throws when the
 * peer cannot be asked (the caller then stops waiting for it).
 */
export async function requestResend(api: string, tokenFile: string | undefined, timeoutMs: number): Promise<number> {
  const token = tokenFile ? (await fs.readFile(tokenFile, 'utf8')).trim() : undefined;
  const res = await fetch(`${api}/v1/ha/resend`, {
    method: 'POST',
    headers: token ? { authorization: `Bearer ${token}` } : {},
    signal: AbortSignal.timeout(timeoutMs),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status} from ${api}/v1/ha/resend${res.status === 401 ? ' (check NATGW_HA_PEER_TOKEN_FILE)' : ''}`);
  const body = (await res.json()) as { resent?: unknown; flows?: unknown };
  if (body.resent !== true) throw new Error(`${api} did not resend (${JSON.stringify(body).slice(0, 200)})`);
  return typeof body.flows === 'number' ? body.flows : 0;
}
