import path from 'node:path';
import pino from 'pino';
import { loadConfig } from '../../src/config/config.js';
import { Engine, type FlushCount } from '../../src/engine/engine.js';
import { runLegacy } from '../../src/engine/legacy.js';
import type { RecordedExecutor } from './execCalls.js';
import { ADDR, type Topology } from './netns.js';

/** An engine whose tools are counted, with the script's commands and the flushes each counted. */
export interface CountingEngine {
  readonly engine: Engine;
  /** A script command, which must succeed without output on stderr. */
  natgw(command: string, ...args: string[]): Promise<void>;
  /** A command, with the conntrack runs it made and the flushes it counted (as the metrics hear them). */
  counted(command: string, ...args: string[]): Promise<{ conntrack: string[]; flushes: FlushCount | undefined }>;
}

/**
 * A new engine in this process over `exec` (a recorder of the production executor in the
 * gateway namespace), on the topology's state dir and kernel: what a daemon restart is.
 * `env` picks the backend.
 */
export async function countingEngine(topo: Topology, exec: RecordedExecutor, env: Record<string, string>): Promise<CountingEngine> {
  const config = await loadConfig({
    NATGW_ENV_FILE: path.join(topo.stateDir, 'none.env'),
    NATGW_STATE_DIR: topo.stateDir,
    GATEWAY_V4: ADDR.extGateway,
    ...env,
  });
  const engine = new Engine({ config, exec, log: pino({ level: 'silent' }) });
  let flushes: FlushCount | undefined;
  engine.onSync((e) => {
    if (e.ok) flushes = e.flushes;
  });
  const natgw = async (command: string, ...args: string[]): Promise<void> => {
    const r = await runLegacy(engine, command, args);
    if (r.status !== 0 || r.stderr !== '') throw new Error(`${command} ${args.join(' ')}: exit ${r.status}: ${r.stdout}${r.stderr}`);
  };
  return {
    engine,
    natgw,
    counted: async (command, ...args) => {
      exec.calls.length = 0;
      flushes = undefined;
      await natgw(command, ...args);
      return { conntrack: exec.calls.filter((r) => r.file === 'conntrack').map((r) => r.args.join(' ')), flushes };
    },
  };
}
