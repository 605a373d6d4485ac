import type { CommandOutput } from '../engine/output.js';
import { socketPathFromEnv } from '../config/socketPath.js';
import { isAgentCommand } from './commands/help.js';

/**
 * `natgw <command> [rule ...]`: the script's command line. `natgw serve` runs the daemon.
 * Output goes out exactly as the command produced it; nothing else touches stdout/stderr.
 *
 * Modules load in the order they are needed: a running daemon answers a forwarded command
 * before configuration (zod), logging (pino) or the engine are loaded at all.
 */
async function main(argv: readonly string[]): Promise<number> {
  const [command, ...args] = argv;
  if (command === '--version') {
    const { versionLine } = await import('./version.js');
    process.stdout.write(versionLine());
    return 0;
  }
  // natgw's own commands (src/cli/commands) and help; `help` alone stays the script's command.
  if (isAgentCommand(command) || command === '--help' || command === '-h' || (command === 'help' && isAgentCommand(args[0]))) {
    const { runAgent } = await import('./commands/index.js');
    return runAgent(isAgentCommand(command) ? command : 'help', args);
  }
  if (command === 'lb-svc') return emit(await (await import('../lbsvc/main.js')).lbSvc(args));
  // `serve` forwards nothing: its start does not load the HTTP client (node:http loads beside its first sync).
  const forwarding = command === 'serve' ? undefined : await import('./forward.js');
  const first = await forwarding?.tryRunningDaemon(await socketPathFromEnv(), command, args);
  if (first?.kind === 'ok') return emit(first.out);

  const { loadConfig, ConfigError } = await import('../config/config.js');
  let config: Awaited<ReturnType<typeof loadConfig>>;
  try {
    config = await loadConfig();
  } catch (e) {
    if (e instanceof ConfigError) {
      process.stderr.write(`Error: ${e.message}\n`);
      return 1;
    }
    throw e;
  }
  if (command === 'serve') {
    const { serve } = await import('../daemon/serve.js');
    return serve(config);
  }
  const { commandLogger } = await import('../system/logger.js');
  const log = commandLogger(config.logLevel, config.stateDir);
  // `first` is undefined only for the commands that run in-process.
  const viaDaemon = forwarding && first && command !== undefined ? await forwarding.forward(config, command, args, first, log) : undefined;
  if (viaDaemon) return emit(viaDaemon);
  const [{ SystemExecutor }, { Engine }, { runLegacy }] = await Promise.all([
    import('../system/exec.js'),
    import('../engine/engine.js'),
    import('../engine/legacy.js'),
  ]);
  const engine = new Engine({ config, exec: new SystemExecutor(log, { deadlineMs: config.toolTimeoutMs }), log });
  const out = await runLegacy(engine, command, args);
  // Its arping children finish before this process exits: none is left for PID 1 to reap.
  await engine.link.settle();
  return emit(out);
}

function emit(result: CommandOutput): number {
  process.stdout.write(result.stdout);
  process.stderr.write(result.stderr);
  return result.status;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (e: unknown) => {
    process.stderr.write(`Error: ${e instanceof Error ? e.message : String(e)}\n`);
    process.exitCode = 1;
  },
);
