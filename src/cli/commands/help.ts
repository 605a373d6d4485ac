/**
 * Help of the agent commands. `natgw --help` is the script's help text, unchanged, followed by
 * the agent's own commands; `natgw help` alone stays the script's command (byte-compatible).
 */
export const AGENT_COMMANDS = ['status', 'apply', 'get'] as const;
export type AgentCommand = (typeof AGENT_COMMANDS)[number];

const CONNECTION = `Connection (never starts a daemon; never touches the kernel itself):
  --socket PATH         the daemon's Unix socket (default: NATGW_SOCKET from the env file or
                        the environment, else /run/natgw/natgw.sock)
  --server URL          the daemon's TCP listener instead (NATGW_LISTEN), e.g. http://10.0.0.5:8080
  --token-file FILE     bearer token for --server (default: NATGW_TOKEN_FILE)
  -h, --help            this help`;

const TEXT: Record<AgentCommand, string> = {
  status: `Usage: natgw status [--check] [--json] [connection options]

Readiness (and why not), the netfilter backend, the desired state against what the daemon
applied last (digests and per-kind counts), the last sync (kind, outcome, duration, when) and
drift: how many resyncs found the kernel changed behind natgw's back and repaired it.

  --check               also read the kernel back now and show what a resync would repair
                        (nothing is applied)
  --json                the status document (GET /v1/status) for scripts

Exit status: 0 ready, 3 not ready, 1 error (no daemon, ...), 2 usage error.

${CONNECTION}`,
  apply: `Usage: natgw apply -f FILE [--dry-run] [--json] [--progress] [--all] [--show-script] [connection options]

Replace the whole desired state with FILE (JSON or YAML; '-' reads stdin): the document
\`natgw get state\` prints, or a bare desired state. The file is validated first (an error
names the line and the field), then the plan is shown as a diff against the daemon's desired
state (+ added, - removed, ~ changed, per kind), then it is applied in one transaction.
If the desired state changes between plan and apply, nothing is applied.

  -f, --filename FILE   the state to apply
  --dry-run             show the plan only; change nothing
  --json                one JSON document on stdout (diff, plan, outcome) instead of text
  --progress            phases on stderr even when it is not a terminal (on a terminal: always)
  --all                 every diff line (default: at most 50 of each sign per kind)
  --show-script         also print the backend script the plan renders

${CONNECTION}`,
  get: `Usage: natgw get KIND [--json | --yaml] [connection options]
       natgw get state [--yaml] [connection options]

List the desired objects of one kind as a table: eips, snats, dnats, fips, share-dnats,
routes, eip-qos, qos (singular and camelCase names work too). \`natgw get state\` prints the
whole desired state in the form \`natgw apply -f\` takes back.

  --json, --yaml        the objects as JSON or YAML instead of a table

${CONNECTION}`,
};

export const isAgentCommand = (c: string | undefined): c is AgentCommand => (AGENT_COMMANDS as readonly string[]).includes(c ?? '');

export function commandHelp(c: AgentCommand): string {
  return `${TEXT[c]}\n`;
}

/** The script's text comes from the engine's module, loaded only here (the commands need none of it). */
export async function mainHelp(): Promise<string> {
  const { HELP } = await import('../../engine/legacy.js');
  return `${HELP}

natgw's own commands:
  serve                                   run the daemon (HTTP API on NATGW_SOCKET, optional TCP)
  status [--check] [--json]               readiness, backend, desired vs applied, last sync, drift
  apply -f FILE [--dry-run]               show the plan as a diff, then replace the desired state
  get KIND | get state                    list desired objects (eips, snats, dnats, fips, ...)
  <command> --help                        help of one of these (also: natgw help <command>)
`;
}
