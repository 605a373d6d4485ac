/**
 * Help of the agent commands. `natgw --help` is the script's help text, unchanged, followed by
 * the agent's own commands; `natgw help` alone stays the script's command (byte-compatible).
 */
export const AGENT_COMMANDS = ['status', 'apply', 'diff', 'get', 'describe', 'delete'] as const;
export type AgentCommand = (typeof AGENT_COMMANDS)[number];

const CONNECTION = `Connection (never starts a daemon; never touches the kernel itself):
  --socket PATH         the daemon's Unix socket (default: NATGW_SOCKET from the env file or
                        the environment, else /run/natgw/natgw.sock)
  --server URL          the daemon's TCP listener instead (NATGW_LISTEN), e.g. http://10.0.0.5:8443
  --token-file FILE     bearer token for --server (default: NATGW_TOKEN_FILE)
  -h, --help            this help`;

const KINDS = `KIND: eips, snats, dnats, fips, share-dnats, routes, eip-qos, qos, neighbours (the singular
and camelCase names work too). ID: the identity's fields joined by commas, as the API's URLs
and \`natgw get\`'s ID column write it, e.g. 172.20.0.10,8080,tcp (a dnat) or
172.20.0.10,10.0.1.0/24 (a snat).`;

const APPLY_FILE = `FILE is JSON or YAML ('-' reads stdin): the document \`natgw get state -o yaml\` prints, or
a bare desired state; it may list only some kinds. It is checked strictly first: a field the
schema does not know is an error, and every error in the file is reported at once, each with
its line and field; nothing is sent then.`;

const TEXT: Record<AgentCommand, string> = {
  status: `Usage: natgw status [--check] [-o json] [connection options]

Readiness (and why not), the netfilter backend, the desired state against what the daemon
applied last (digests and per-kind counts), the last sync (kind, outcome, duration, when) and
drift: how many resyncs found the kernel changed behind natgw's back and repaired it.

  --check               also read the kernel back now and show what a resync would repair
                        (nothing is applied)
  -o, --output json     the status document (GET /v1/status) for scripts (also: --json)

Exit status: 0 ready (with --check: and no drift), 3 not ready, 4 drift found by --check,
1 error (no daemon, ...), 2 usage error.

${CONNECTION}`,
  apply: `Usage: natgw apply -f FILE [--prune] [--dry-run] [-o json] [--progress] [--all] [--show-script] [connection options]

Create or update, by identity, the objects FILE lists (gateway fields too: initialized,
interfaces, defaultRoutes, where the file sets them), in one transaction. Objects the file
does not list stay as they are unless --prune is given: then FILE is the whole desired state
and everything else is removed. One line per object says what happened to it:
created, configured, unchanged or pruned, as kubectl apply prints them. If the desired state
changes between the read and the apply, nothing is applied.

${APPLY_FILE}

  -f, --filename FILE   the objects to apply
  --prune               also remove every object FILE does not list
  --dry-run             show what would happen (the daemon plans it); change nothing
  -o, --output json     one JSON document on stdout (results, diff, plan, outcome) (also: --json)
  --progress            phases on stderr even when it is not a terminal (on a terminal: always)
  --all                 every line (default: at most 50 of each action per kind)
  --show-script         also print the backend script the plan renders (with --dry-run)

See \`natgw diff -f FILE\` for the changes field by field.

${CONNECTION}`,
  diff: `Usage: natgw diff -f FILE [--prune] [--all] [connection options]

What \`natgw apply -f FILE\` (with --prune: \`apply --prune\`) would change, against the daemon's
desired state: + added, - removed, ~ changed (field by field), per kind. Changes nothing.

${APPLY_FILE}

  -f, --filename FILE   the objects to compare
  --prune               compare as apply --prune would apply it
  --all                 every diff line (default: at most 50 of each sign per kind)

Exit status: 0 no differences, 1 differences, 2 error (as kubectl diff).

${CONNECTION}`,
  get: `Usage: natgw get KIND [ID] [-o table|wide|json|yaml|name] [connection options]
       natgw get state [-o json|yaml] [connection options]

List the desired objects of one kind (or the one named by ID) as a table: the identity, then
the kind's main fields; -o wide shows every field (allocated QoS ids, pools, ...).
\`natgw get state\` prints the whole desired state in the form \`natgw apply -f\` takes back.

${KINDS}

  -o, --output FORMAT   table (default), wide, json, yaml, or name (kind/ID per line)
                        (also: --json, --yaml)

${CONNECTION}`,
  describe: `Usage: natgw describe KIND ID [connection options]

One object in detail: every field, and whether the daemon has applied it as it stands.

${KINDS}

${CONNECTION}`,
  delete: `Usage: natgw delete KIND ID [ID ...] [--ignore-not-found] [connection options]

Delete objects by identity, each in its own transaction, as the script's *-del commands do
(the kernel follows at once; conntrack entries of a removed DNAT or FIP are flushed).

${KINDS}

  --ignore-not-found    an absent object is not an error

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
  status [--check] [-o json]              readiness, backend, desired vs applied, last sync, drift
  get KIND [ID] [-o wide|json|yaml]       list desired objects (eips, snats, dnats, fips, ...)
  get state [-o yaml]                     the whole desired state, as apply takes it back
  describe KIND ID                        one object in detail
  delete KIND ID [ID ...]                 delete objects by identity
  apply -f FILE [--prune] [--dry-run]     create or update the file's objects (--prune: remove the rest)
  diff -f FILE [--prune]                  what apply would change, field by field
  --version                               natgw's version and source revision
  <command> --help                        help of one of these (also: natgw help <command>)
`;
}
