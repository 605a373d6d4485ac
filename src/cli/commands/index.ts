import { CliError } from '../client.js';
import { processIo, type Io } from './common.js';
import { commandHelp, isAgentCommand, mainHelp, type AgentCommand } from './help.js';

/**
 * The agent commands (status, apply, diff, get, describe, delete) and the agent's help. Errors
 * become one line on stderr (a file's errors: one line each): exit 1 for a failure, 2 for a usage error.
 */
export async function runAgent(command: AgentCommand | 'help', args: readonly string[], io: Io = processIo()): Promise<number> {
  try {
    switch (command) {
      case 'help': {
        const topic = args[0];
        io.out(isAgentCommand(topic) ? commandHelp(topic) : await mainHelp());
        return 0;
      }
      case 'status':
        return await (await import('./status.js')).status(args, io);
      case 'apply':
        return await (await import('./apply.js')).apply(args, io);
      case 'diff':
        return await (await import('./apply.js')).diff(args, io);
      case 'get':
        return await (await import('./get.js')).get(args, io);
      case 'describe':
        return await (await import('./get.js')).describe(args, io);
      case 'delete':
        return await (await import('./get.js')).del(args, io);
    }
  } catch (e) {
    if (e instanceof CliError) {
      io.err(`Error: ${e.message}\n`);
      return e.exitCode;
    }
    throw e;
  }
}
