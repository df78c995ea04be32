# Shared by the examples' run.sh scripts (sourced, not run): finds the
# binaries, starts a private stserver on an example's config, waits until it
# answers, and stops it on exit.
#   ST_BUILD_DIR   the build tree (default: <repo>/build)
set -eu
repo="$(cd "$(dirname "$0")/../.." && pwd)"
build="${ST_BUILD_DIR:-$repo/build}"
stserver="$build/bin/stserver"
stcli_bin="$build/bin/stcli"
for b in "$stserver" "$stcli_bin"; do
  [ -x "$b" ] || { echo "$b not found: build first (see README.md)" >&2; exit 2; }
done
base="$(mktemp -d /tmp/st-example-XXXXXX)/st"
log="$(dirname "$base")/server.log"

stcli() { "$stcli_bin" --base-path "$base" "$@"; }

# start_server CONFIG: runs stserver in the background and waits for ping.
start_server() {
  start_command "$stserver" --config "$1" --base-path "$base"
}

# start_command CMD...: runs a command that serves on $base in the
# background (its output in $log) and waits for ping.
start_command() {
  "$@" >"$log" 2>&1 &
  server_pid=$!
  trap stop_server EXIT
  for _ in $(seq 1 1000); do
    stcli ping >/dev/null 2>&1 && return 0
    kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.01
  done
  echo "stserver did not answer within 10 s" >&2
  cat "$log" >&2
  exit 1
}

stop_server() {
  if [ -n "${server_pid:-}" ]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" || { echo "stserver exited with $?" >&2; cat "$log" >&2; exit 1; }
    server_pid=""
  fi
  rm -rf "$(dirname "$base")"
}
