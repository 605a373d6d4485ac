#!/usr/bin/env bash
# The controller runs `bash /kube-ovn/nat-gateway.sh <command> [rule ...]`, one exec per rule,
# so this shim is on its critical path (SPEC §4.1). Node.js start-up alone costs more than the
# original script's whole call; so where a daemon answers on its Unix socket, the command goes
# to it through `nc -U` and Node is never started. Everything else — nc missing, no socket, no
# answer, anything but a command that ran — ends in natgw itself (`exec node`), which forwards,
# autostarts or runs in-process exactly as before, so the output is the same on every path.
#
# NATGW_SHIM_CLIENT=node (environment only): skip nc, straight to Node.js.

# NATGW_SOCKET as natgw itself resolves it (src/config/socketPath.ts): the env file's value,
# then the environment's, then the default. The env file wins (SPEC §4.3: the script sourced it
# after the environment); it is parsed like src/config/envFile.ts does, never sourced.
natgw_socket() {
  local file=${NATGW_ENV_FILE-} line value=''
  local re='^[[:space:]]*(export[[:space:]]+)?NATGW_SOCKET[[:space:]]*=(.*)$'
  file=${file#"${file%%[![:space:]]*}"}
  file=${file%"${file##*[![:space:]]}"}
  [ -n "$file" ] || file=/etc/kube-ovn/nat-gateway.env
  if [ -f "$file" ] && [ -r "$file" ]; then
    # The last assignment wins, as in the parser natgw uses.
    while IFS= read -r line || [ -n "$line" ]; do
      [[ $line =~ $re ]] && value=${BASH_REMATCH[2]}
    done <"$file"
  fi
  if [ -n "$value" ]; then
    value=${value#"${value%%[![:space:]]*}"}
    value=${value%"${value##*[![:space:]]}"}
    # A quoted value followed by an inline comment: the comment is not part of it.
    local quoted='^("([^"\\]|\\.)*"|'"'[^']*'"')[[:space:]]+#'
    [[ $value =~ $quoted ]] && value=${BASH_REMATCH[1]}
    case $value in
      \"*\")
        # Inside double quotes natgw undoes \" \\ \$ and \` only.
        local inner=${value:1:${#value}-2} c
        value=''
        while [[ $inner == *\\* ]]; do
          value+=${inner%%\\*}
          inner=${inner#*\\}
          c=${inner:0:1}
          case $c in
            \" | \\ | \$ | \`) value+=$c; inner=${inner:1} ;;
            *) value+=\\ ;;
          esac
        done
        value+=$inner
        ;;
      \'*\') value=${value:1:${#value}-2} ;;
      *)
        # An unquoted value ends at the first inline comment.
        if [[ $value =~ [[:space:]]+# ]]; then value=${value%%"${BASH_REMATCH[0]}"*}; fi
        ;;
    esac
  fi
  # An empty value falls through to the next source, as in natgw.
  REPLY=${value:-${NATGW_SOCKET:-/run/natgw/natgw.sock}}
}

# A form value: only the four bytes the form syntax gives a meaning (% & + =) are encoded; every
# other byte, newlines and non-ASCII included, is taken as it is (the body's length says where it
# ends), so no argument byte is ever shell, HTTP or form syntax.
natgw_form_value() {
  local v=$1
  v=${v//'%'/%25}
  v=${v//'&'/%26}
  v=${v//'+'/%2B}
  REPLY=${v//'='/%3D}
}

# One POST /v1/legacy/raw over the socket, through `nc -U` (netcat-openbsd: it starts in about two
# milliseconds, curl in about seven). Prints the command's output and exits with its status when
# the daemon ran it; returns (having printed nothing) otherwise. The whole answer is read, and
# its length checked, before anything is printed, so a daemon dying mid-answer leaves no partial
# output behind the Node.js retry.
natgw_via_daemon() {
  natgw_socket
  local sock=$REPLY
  [ -S "$sock" ] || return 1
  command -v nc >/dev/null 2>&1 || return 1
  # Bytes, not characters: Content-Length and the answer's length count bytes.
  local LC_ALL=C body arg
  natgw_form_value "$1"
  body="command=$REPLY"
  shift
  for arg in "$@"; do
    natgw_form_value "$arg"
    body+="&rule=$REPLY"
  done
  local crlf=$'\r\n'
  local request="POST /v1/legacy/raw HTTP/1.1${crlf}Host: localhost${crlf}Connection: close${crlf}"
  request+="Content-Type: application/x-www-form-urlencoded${crlf}Content-Length: ${#body}${crlf}${crlf}${body}"
  # The trailing dot keeps the body's own trailing newlines from command substitution. nc's
  # stderr (a netcat without -U, a refused socket) must never reach the controller. The newline
  # the here-string adds after the body is ignored by the server (Connection: close).
  local reply
  reply=$(nc -U "$sock" 2>/dev/null <<<"$request"; printf .)
  reply=${reply%.}
  [[ $reply == *"$crlf$crlf"* ]] || return 1
  local head=${reply%%"$crlf$crlf"*}$crlf
  local answer=${reply#*"$crlf$crlf"}
  # HTTP header names are case-insensitive. 503 (shutting down), 4xx, no answer: the daemon did
  # not run it, Node.js takes over.
  shopt -s nocasematch
  local re_code=$'^HTTP/[0-9.]+ 200[ \r]'
  local re_length=$'\r\nContent-Length: *([0-9]+)\r\n'
  local re_status=$'\r\nX-Natgw-Status: *([0-9]+)\r\n'
  local re_stderr=$'\r\nX-Natgw-Stderr: *([^\r]*)\r\n'
  [[ $head =~ $re_code ]] || return 1
  [[ $head =~ $re_length ]] && [ "${BASH_REMATCH[1]}" -eq "${#answer}" ] || return 1
  [[ $head =~ $re_status ]] || return 1
  local status=${BASH_REMATCH[1]}
  [[ $head =~ $re_stderr ]] || return 1
  local err=${BASH_REMATCH[1]}
  printf '%s' "$answer"
  # The daemon wrote every byte but printable ASCII as \xHH: %b restores them exactly.
  [ -z "$err" ] || printf '%b' "$err" >&2
  exit "$status"
}

# Commands natgw answers in-process (no state, no lock) stay on Node.js, as does `serve`.
if [ "${NATGW_SHIM_CLIENT-}" != node ] && [ $# -gt 0 ]; then
  case $1 in
    help | --help | -h | get-iptables-version | serve) ;;
    *) natgw_via_daemon "$@" ;;
  esac
fi

# Inside the image natgw lives under /kube-ovn/natgw; in a checkout it is the checkout this
# file sits in.
# (No subshells: two forks were ~2 ms of every `serve` start and Node.js fallback.)
case ${BASH_SOURCE[0]} in
  */*) here=${BASH_SOURCE[0]%/*} ;;
  *) here=. ;;
esac
if [ -f "$here/natgw/bin/natgw.js" ]; then
  entry="$here/natgw/bin/natgw.js"
else
  entry="$here/../bin/natgw.js"
fi
if [ "${1:-}" = serve ]; then
  # The daemon's heap limits: DAEMON_NODE_FLAGS in src/cli/forward.ts (a test keeps them equal).
  exec node --max-semi-space-size=2 --max-old-space-size=512 "$entry" "$@"
fi
exec node "$entry" "$@"
