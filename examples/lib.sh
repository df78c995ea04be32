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

# start_two_servers A B GLOB...: two servers linked as peers on loopback,
# acting as two hosts, both stopped on exit. Server A (socket base $base,
# peer id A) listens on a loopback port of its choosing and exports the
# keys and hand-offs the globs match; server B (socket base
# $base_b, peer id B, log $log_b) dials it. One cluster key in the
# example's private directory. Returns once B's link to A is up. Needs
# UCX and OpenSSL 3 (docs/multihost.md) and python3.
#   ST_LIVE_READS  A's peer.live_reads: fenced (default) or staged
start_two_servers() {
  tmp="$(dirname "$base")"
  od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$tmp/cluster.key"
  echo >> "$tmp/cluster.key"
  chmod 600 "$tmp/cluster.key"
  export UCX_TLS="${UCX_TLS:-tcp}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
  common="endpoints = '$repo/endpoints', workers = 1, default_device = 'cpu',
  memory_budget = { cpu = 256 * 1024 * 1024, ['cuda:0'] = 1024 * 1024 * 1024 },"
  a="$1" b="$2" export=""
  shift 2
  for g in "$@"; do export="$export'$g', "; done
  cat > "$tmp/$a.lua" <<CFG
return { $common
  peer = { id = '$a', listen = '127.0.0.1:0', secret = '$tmp/cluster.key',
           peers = { $b = {} }, export = { $export}, live_reads = '${ST_LIVE_READS:-fenced}' } }
CFG
  start_server "$tmp/$a.lua"
  addr="$(stcli --json info | "${python:-python3}" -c 'import json, sys; print(json.load(sys.stdin)["peer"]["listen"])')"
  cat > "$tmp/$b.lua" <<CFG
return { $common
  peer = { id = '$b', secret = '$tmp/cluster.key', peers = { $a = '$addr' } } }
CFG
  base_b="$tmp/$b"
  log_b="$tmp/$b.log"
  "$stserver" --config "$tmp/$b.lua" --base-path "$base_b" > "$log_b" 2>&1 &
  pid_b=$!
  trap stop_two_servers EXIT
  # Until B's server reaches A's (its link is up).
  for _ in $(seq 1 1000); do
    if "$stcli_bin" --base-path "$base_b" peers 2>/dev/null | grep -q "^$a .* up"; then
      return 0
    fi
    kill -0 "$pid_b" 2>/dev/null || break
    sleep 0.02
  done
  echo "the two servers did not link" >&2
  cat "$log_b" >&2
  exit 1
}

stop_two_servers() {
  if [ -n "${pid_b:-}" ]; then
    kill -TERM "$pid_b" 2>/dev/null || true
    wait "$pid_b" || { echo "the second stserver exited with $?" >&2; cat "$log_b" >&2; }
    pid_b=""
  fi
  stop_server
}
