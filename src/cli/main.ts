import { loadConfig, ConfigError } from '../config/config.js';
import { commandLogger } from '../system/logger.js';
import type { CommandOutput } from '../engine/output.js';

/**
 * `natgw <command> [rule ...]`: the script's command line. `natgw serve` runs the daemon.
 * Output goes out exactly as the command produced it; nothing else touches stdout/stderr.
 */
async function main(argv: readonly string[]): Promise<number> {
  const [command, ...args] = argv;
  let config;
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
  const log = commandLogger(config.logLevel, config.stateDir);
  const result: CommandOutput = await (async () => {
    const { forward } = await import('./forward.js');
    const viaDaemon = await forward(config, command, args, log);
    if (viaDaemon) return viaDaemon;
    // Loaded only here: a command the daemon ran needs none of the engine.
    const [{ SystemExecutor }, { Engine }, { runLegacy }] = await Promise.all([
      import('../system/exec.js'),
      import('../engine/engine.js'),
      import('../engine/legacy.js'),
    ]);
    const engine = new Engine({ config, exec: new SystemExecutor(log), log });
    return runLegacy(engine, command, args);
  })();
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
