/**
 * The one optional fast path to nftables: a long-lived helper process on libnftables, nft's own
 * library, through its Python binding (Debian's python3-nftables: `Nftables().cmd(text)` returns
 * nft's exit status, output and error text, as `nft -f -` would print them). A change then costs
 * one netlink transaction, not the start of an `nft` process: the fork of the daemon and nft's
 * own start are most of a bare `nft` call (docs/performance.md).
 *
 * It sits behind the NftClient seam and answers exactly as SystemNftClient does. Where the
 * helper cannot start (no python3-nftables) natgw runs `nft` as a tool instead; where it dies,
 * the change it was running fails as a refused transaction would (the engine retries it as a
 * full sync, which reads the kernel back), and later changes run `nft` as a tool until a new
 * helper has started. The helper dies with natgw (parent-death signal) and ends when its stdin
 * closes. Its script is constant; the nft scripts reach it as JSON strings on stdin.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import type { Logger } from 'pino';
import { diesWithNatgw } from '../../../system/diesWithNatgw.js';
import { ExecError, toolEnv, type ExecResult, type Executor } from '../../../system/exec.js';
import { SystemNftClient, listingText } from './client.js';
import type { NftTableFamily, NftTransaction } from './transaction.js';

/** Debian's interpreter, the one python3-nftables is installed for. */
const LIBNFT_PYTHON = '/usr/bin/python3';

/** One request per line, one answer per line, in order. */
const HELPER = `
import json, sys
from nftables import Nftables
nft = Nftables()
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    nft.set_json_output(bool(req.get("json")))
    rc, out, err = nft.cmd(req["script"])
    print(json.dumps({"rc": rc, "out": out, "err": err}), flush=True)
`;

const TABLE_NAME = /^[A-Za-z0-9_-]+$/;

/** A helper that died is not started again sooner than this after its last start. */
const RESTART_AFTER_MS = 10_000;
/** How long a starting helper may take to say it is ready. */
const START_TIMEOUT_MS = 5_000;

interface Answer {
  readonly rc: number;
  readonly out: string;
  readonly err: string;
}

interface Pending {
  readonly resolve: (a: Answer) => void;
  readonly reject: (e: Error) => void;
}

/** One helper process: requests answered in order; any failure ends it for good. */
class Helper {
  private readonly waiting: Pending[] = [];
  dead: string | undefined;

  private constructor(private readonly child: ChildProcess) {
    // readline searches each chunk once for a line end: a listing of ten thousand rules is megabytes on one line.
    if (child.stdout) createInterface({ input: child.stdout, crlfDelay: Infinity }).on('line', (line) => this.answer(line));
    let stderr = '';
    child.stderr?.setEncoding('utf8').on('data', (d: string) => {
      stderr = (stderr + d).slice(-2000);
    });
    child.stdin?.on('error', () => undefined);
    child.once('error', (e) => this.end(e.message));
    child.once('close', (code, signal) =>
      this.end(`libnftables helper exited (${signal ?? `status ${code}`})${stderr ? `: ${stderr.trim().split('\n').pop()}` : ''}`),
    );
  }

  /** A running helper, or why there is none. */
  static async start(): Promise<Helper | string> {
    const cmd = diesWithNatgw(LIBNFT_PYTHON, ['-u', '-c', HELPER]);
    let child: ChildProcess;
    try {
      child = spawn(cmd.file, [...cmd.args], { stdio: ['pipe', 'pipe', 'pipe'], env: toolEnv() });
    } catch (e) {
      return e instanceof Error ? e.message : String(e);
    }
    const h = new Helper(child);
    // The first line says the binding loaded; anything else (an ImportError, no python3) ends it.
    const ready = new Promise<Answer>((resolve, reject) => h.waiting.push({ resolve, reject }));
    const timer = setTimeout(() => h.kill(`libnftables helper not ready after ${START_TIMEOUT_MS} ms`), START_TIMEOUT_MS);
    try {
      await ready;
      return h;
    } catch (e) {
      return e instanceof Error ? e.message : String(e);
    } finally {
      clearTimeout(timer);
    }
  }

  run(script: string, json: boolean): Promise<Answer> {
    if (this.dead) return Promise.reject(new Error(this.dead));
    return new Promise((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      this.child.stdin?.write(`${JSON.stringify({ script, json })}\n`);
    });
  }

  kill(why: string): void {
    this.end(why);
    this.child.kill('SIGKILL');
  }

  /** Hand one answer line to the oldest request; anything unexpected ends the helper. */
  private answer(line: string): void {
    if (this.dead) return;
    const p = this.waiting.shift();
    if (!p) {
      this.kill('libnftables helper answered what was not asked');
      return;
    }
    try {
      const a = JSON.parse(line) as Partial<Answer> & { ready?: boolean };
      p.resolve({ rc: a.ready ? 0 : Number(a.rc), out: String(a.out ?? ''), err: String(a.err ?? '') });
    } catch {
      p.reject(new Error('libnftables helper answered what natgw cannot read'));
      this.kill('libnftables helper answered what natgw cannot read');
    }
  }

  private end(why: string): void {
    this.dead ??= why;
    for (const p of this.waiting.splice(0)) p.reject(new Error(this.dead));
  }
}

/** The tool's client with listings and transactions through the helper while it runs; a bulk load's element groups (several `nft` at once) stay the tool's. */
export class LibnftClient extends SystemNftClient {
  private helper: Helper | undefined;
  private starting: Promise<void> | undefined;
  private startedAt = 0;
  /** The helper could not start at all (no python3-nftables): the tool for good. */
  private unavailable = false;
  /** The one request the helper is running: requests go one at a time, each with the deadline. */
  private turn: Promise<unknown> = Promise.resolve();

  /** Starts the helper in the background: until it is ready (tens of ms), `nft` runs as a tool. */
  constructor(
    exec: Executor,
    private readonly log: Logger,
    private readonly deadlineMs: number,
  ) {
    super(exec);
    this.launch();
  }

  /** Resolves once the first start has succeeded or failed (tests, the bench). */
  async ready(): Promise<boolean> {
    await this.starting;
    return this.helper !== undefined && !this.helper.dead;
  }

  private launch(): void {
    const first = this.startedAt === 0;
    this.startedAt = Date.now();
    this.starting = Helper.start().then((h) => {
      this.starting = undefined;
      if (typeof h !== 'string') {
        this.helper = h;
        this.log.info(first ? 'nftables through libnftables (a long-lived helper process)' : 'libnftables helper started again');
        return;
      }
      if (first) {
        this.unavailable = true;
        this.log.info({ reason: h }, 'nftables through the nft tool: the libnftables helper cannot start (install python3-nftables for faster changes)');
      } else {
        this.log.warn({ reason: h }, 'libnftables helper cannot start again; nft runs as a tool meanwhile');
      }
    });
  }

  /** The helper when it runs; else undefined (run the tool), a new one starting where the last died a while ago. */
  private current(): Helper | undefined {
    if (this.helper && !this.helper.dead) return this.helper;
    if (!this.unavailable && !this.starting && Date.now() - this.startedAt >= RESTART_AFTER_MS) this.launch();
    return undefined;
  }

  /**
   * One script through the helper, as `nft [-j] -f -` would answer it; undefined where there is
   * no helper (the caller runs the tool). A helper that misses the deadline is killed.
   */
  private ask(script: string, json: boolean, command: string): Promise<ExecResult | undefined> {
    const next = this.turn.then(async () => {
      const h = this.current();
      if (!h) return undefined;
      const started = performance.now();
      let timedOut = false;
      const timer = setTimeout(() => {
        timedOut = true;
        h.kill(`libnftables helper: ${command} timed out after ${this.deadlineMs} ms (NATGW_TOOL_TIMEOUT) and was killed`);
      }, this.deadlineMs);
      try {
        const a = await h.run(script, json);
        const r: ExecResult = { command, exitCode: a.rc === 0 ? 0 : 1, stdout: a.out, stderr: a.err, timedOut: false, failedToStart: false };
        this.log.debug(
          { cmd: command, via: 'libnftables', exitCode: r.exitCode, ms: Math.round(performance.now() - started), stdinBytes: script.length },
          'exec',
        );
        return r;
      } catch (e) {
        const why = e instanceof Error ? e.message : String(e);
        this.log.error({ cmd: command, err: why }, 'libnftables helper failed; the change counts as refused');
        return { command, exitCode: timedOut ? 124 : 127, stdout: '', stderr: `${why}\n`, timedOut, failedToStart: false };
      } finally {
        clearTimeout(timer);
      }
    });
    this.turn = next.catch(() => undefined);
    return next;
  }

  override async listJson(family: NftTableFamily, table: string): Promise<string | null> {
    if (!TABLE_NAME.test(table)) throw new Error(`not a table name: ${table}`);
    const r = await this.ask(`list table ${family} ${table}`, true, `nft -j list table ${family} ${table}`);
    return r ? listingText(r) : super.listJson(family, table);
  }

  override async run(tx: NftTransaction | string, opts: { readonly concurrent?: boolean } = {}): Promise<void> {
    const script = typeof tx === 'string' ? tx : tx.text();
    if (script === '') return;
    // The helper runs one request at a time: transactions meant to run at once go to the tool.
    if (opts.concurrent) return super.run(script);
    const r = await this.ask(script, false, 'nft -f -');
    if (!r) return super.run(script);
    if (r.exitCode !== 0) throw new ExecError(r, 'the transaction', script);
  }

  /** End the helper for good. */
  close(): void {
    this.unavailable = true;
    this.helper?.kill('natgw is stopping');
  }
}
